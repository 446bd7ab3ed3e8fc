"""When each claim a chapter states was last worded, and on which runs it was tested after that.

A claim reworded after the runs it was checked on is a new claim: those runs are no evidence for
it, since its words were chosen knowing their results. So each claim's wording carries the commit
at which it was last changed, and a run counts for a claim only when it was trained after that.

* **The registry**, ``replicates/claim-dates.json``: per chapter, each claim's wording (the first
  argument of its ``claim(...)`` call as the notebook's source writes it, an f-string's ``{...}``
  kept as written), the hash of that wording, the first commit of the unbroken line of commits
  (first parents, back from HEAD) whose notebook states it, and that commit's date. It is computed
  from git's history by ``make claim-dates`` (``python -m attncircuits.course.claim_dates``), never
  typed; ``tests/test_claim_dates.py`` fails when a chapter states a wording the registry does not
  hold (a claim reworded without ``make claim-dates``). A wording not yet committed when the command
  ran is entered as worded *after* HEAD (``"after": true``) until the command runs again.
* **The runs**: ``make replicate`` and ``make family SEED=n`` store in their results.json the commit
  they were trained at (``trained_at``: :func:`attncircuits.core.gitstate.commit_state`) and every
  claim each chapter checked, held or not (``claims_checked``). Runs recorded before this existed
  have neither: they count for no claim.
* :func:`tested_after` counts, per claim, the runs trained at or after its wording's commit (``git
  merge-base --is-ancestor`` in a checkout; by date where git or a commit is missing, as in a pip
  install) whose chapter checked that wording, and on how many of them it held.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
from datetime import datetime
from pathlib import Path

from attncircuits.core import gitstate
from attncircuits.train.replicate import REPO, chapter_paths

REGISTRY = REPO / "replicates" / "claim-dates.json"
ABOUT = ("Each claim a chapter states (its claim(...) wording as the notebook's source writes it) -> the hash "
         "of that wording, the first commit of the unbroken line of first-parent commits whose notebook "
         "states it, and that commit's date ('after': worded after that commit, not yet committed when this "
         "was written). Written by `make claim-dates` from git's history; never edit by hand.")


# ---- the wordings a notebook states --------------------------------------------------------------
def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _wording(node: ast.expr) -> str:
    """A ``claim`` call's first argument as written: a string's text, an f-string's with each
    ``{expression}`` as its source (format specs left out), any other expression as ``{source}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _escape(node.value).strip()
    if isinstance(node, ast.JoinedStr):
        parts = [_escape(v.value) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                 for v in node.values]
        return "".join(parts).strip()
    return "{" + ast.unparse(node) + "}"


def _is_claim(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Name) and f.id == "claim") or (isinstance(f, ast.Attribute) and f.attr == "claim")


def wordings(notebook: dict) -> list[str]:
    """The claims a notebook (its JSON) states, in order, each once (IPython's ``%`` and ``!`` lines
    left out; a cell that does not parse states none)."""
    out: dict[str, None] = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", ""))
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_claim(node) and node.args:
                out[_wording(node.args[0])] = None
    return list(out)


def wording_hash(wording: str) -> str:
    return hashlib.sha256(wording.encode("utf-8")).hexdigest()[:12]


def _pieces(wording: str) -> list[tuple[str, str]]:
    """``wording`` as ``("text", literal)`` and ``("slot", expression)`` pieces."""
    out, i, text = [], 0, ""
    while i < len(wording):
        two = wording[i:i + 2]
        if two in ("{{", "}}"):
            text, i = text + two[0], i + 2
        elif wording[i] == "{":
            depth, j = 0, i
            while j < len(wording):
                depth += (wording[j] == "{") - (wording[j] == "}")
                j += 1
                if depth == 0:
                    break
            out += [("text", text), ("slot", wording[i + 1:j - 1])]
            text, i = "", j
        else:
            text, i = text + wording[i], i + 1
    return [*out, ("text", text)]


def pattern(wording: str) -> re.Pattern:
    """A regular expression that a claim's text, as a run recorded it, fully matches when it is this
    wording with its ``{...}`` filled in."""
    return re.compile("".join(re.escape(s) if kind == "text" else ".*?" for kind, s in _pieces(wording)), re.S)


def matching(text: str, candidates: list[str]) -> str | None:
    """The wording among ``candidates`` that a recorded claim ``text`` is (the one with the most
    literal text where several match), or None."""
    found = [w for w in candidates if pattern(w).fullmatch(text.strip())]
    return max(found, key=lambda w: sum(len(s) for kind, s in _pieces(w) if kind == "text"), default=None)


# ---- the registry --------------------------------------------------------------------------------
def chapter_files(repo: Path = REPO) -> dict[str, Path]:
    """``{chapter: notebook}``: the chapters ``make replicate`` runs, named as results.json names them."""
    paths = chapter_paths() if repo == REPO else [*sorted((repo / "notebooks").glob("[0-9]*.ipynb")),
                                                  repo / "book" / "reproduces.ipynb"]
    return {p.stem: p for p in paths if p.is_file()}


def stated(repo: Path = REPO) -> dict[str, list[str]]:
    """``{chapter: its wordings}`` as the notebooks in ``repo`` state them now."""
    return {ch: wordings(json.loads(p.read_text(encoding="utf-8"))) for ch, p in chapter_files(repo).items()}


def load(path: Path = REGISTRY) -> dict[str, list[dict]]:
    """``{chapter: [{"claim", "hash", "commit", "date"(, "after")}, ...]}`` from the registry."""
    return json.loads(Path(path).read_text(encoding="utf-8"))["chapters"]


def problems(registry: dict[str, list[dict]], now: dict[str, list[str]]) -> list[str]:
    """What makes ``registry`` out of date for the wordings ``now``: one line each (a wording it lacks,
    one it holds that no chapter states, a hash that is not its wording's)."""
    out = []
    for chapter in sorted(set(registry) | set(now)):
        have = {e["claim"]: e for e in registry.get(chapter, [])}
        for w in now.get(chapter, []):
            if w not in have:
                out.append(f"{chapter}: {w!r} is not in the registry (a claim reworded or added)")
        for w, e in have.items():
            if w not in now.get(chapter, []):
                out.append(f"{chapter}: the registry's {w!r} is stated by no chapter now")
            elif e.get("hash") != wording_hash(w):
                out.append(f"{chapter}: the registry's hash of {w!r} is not its wording's")
    return out


def history(repo: Path, path: Path) -> list[tuple[str, str, set[str]]]:
    """``(commit, date, wordings)`` of each first-parent commit back from HEAD that changed ``path``,
    newest first."""
    rel = path.resolve().relative_to(Path(repo).resolve()).as_posix()
    log = gitstate.git(repo, "log", "--first-parent", "--format=%H %cI", "HEAD", "--", rel)
    if log is None:
        raise RuntimeError(f"git cannot read the history of {rel}: `make claim-dates` needs the repository's "
                           "git history (a clone, not a copy of the files)")
    out = []
    for line in filter(None, log.splitlines()):
        commit, date = line.split(" ", 1)
        text = gitstate.git(repo, "show", f"{commit}:{rel}")
        try:
            found = set(wordings(json.loads(text))) if text else set()
        except ValueError:
            found = set()
        out.append((commit, date, found))
    return out


def dated(repo: Path, path: Path, now: list[str]) -> list[dict]:
    """A registry entry for each wording in ``now`` (``path``'s claims in the working tree)."""
    versions = history(repo, path)
    head = gitstate.commit_state(repo)
    entries = []
    for w in now:
        first = None
        for commit, date, found in versions:
            if w not in found:
                break
            first = (commit, date)
        entry = {"claim": w, "hash": wording_hash(w)}
        if first is None or not versions or w not in versions[0][2]:  # not in HEAD's version yet
            entry.update(commit=head["commit"], date=head["date"], after=True)
        else:
            entry.update(commit=first[0], date=first[1])
        entries.append(entry)
    return entries


def update(repo: Path = REPO, path: Path = REGISTRY, rebuild: bool = False) -> list[str]:
    """Bring the registry at ``path`` up to date with the notebooks (every chapter again with
    ``rebuild``; else the chapters whose wordings changed, or hold one entered as worded after a
    commit); returns the chapters written again."""
    try:
        registry = load(path)
    except FileNotFoundError:
        registry = {}
    now = stated(repo)
    files = chapter_files(repo)
    redo = [ch for ch in now if rebuild or [e["claim"] for e in registry.get(ch, [])] != now[ch]
            or any(e.get("after") for e in registry.get(ch, []))]
    for ch in redo:
        registry[ch] = dated(repo, files[ch], now[ch])
    registry = {ch: registry[ch] for ch in sorted(now)}
    Path(path).write_text(json.dumps({"about": ABOUT, "chapters": registry}, indent=1, ensure_ascii=False) + "\n",
                          encoding="utf-8")
    return redo


# ---- the runs trained after a claim's wording ----------------------------------------------------
def trained_after(entry: dict, trained_at: dict | None, repo: Path | None = REPO) -> bool:
    """Whether a run trained at ``trained_at`` (its record's, None where unknown) was trained after the
    claim ``entry`` was worded: by ``git merge-base --is-ancestor`` where git knows both commits, else
    by their dates (a run trained at the wording's own commit counts, unless the wording came after)."""
    if not trained_at:
        return False
    after = bool(entry.get("after"))
    if repo is not None:
        order = gitstate.is_ancestor(repo, entry["commit"], trained_at["commit"])
        if order is not None:
            return order and not (after and trained_at["commit"] == entry["commit"])
    run, worded = (datetime.fromisoformat(d) for d in (trained_at["date"], entry["date"]))
    return run > worded if after else run >= worded


def tested_after(records: dict[str, dict], registry: dict[str, list[dict]],
                 repo: Path | None = REPO) -> list[tuple[str, dict, list[str], list[str]]]:
    """Per claim of the registry, ``(chapter, its entry, the runs trained after its wording that
    checked it, those of them on which it held)``. ``records`` is ``{run: results.json}``; a run
    checked a wording when its chapter's ``claims_checked`` holds a claim of that wording."""
    out = []
    for chapter, entries in registry.items():
        wordings_now = [e["claim"] for e in entries]
        checked: dict[str, dict[str, bool]] = {}  # wording -> {run: held}
        for run, results in records.items():
            for c in results.get("chapters", {}).get(chapter, {}).get("claims_checked", []):
                w = matching(c["text"], wordings_now)
                if w is not None:  # a claim checked in a loop holds on a run when every instance does
                    checked.setdefault(w, {})[run] = checked.get(w, {}).get(run, True) and bool(c["held"])
        for e in entries:
            runs = [r for r, held in checked.get(e["claim"], {}).items()
                    if trained_after(e, records[r].get("trained_at"), repo)]
            out.append((chapter, e, runs, [r for r in runs if checked[e["claim"]][r]]))
    return out


def records(root: Path | None = None) -> dict[str, dict]:
    """``{run: results.json}`` of every run recorded in ``root`` (default the repository's
    ``replicates/``): ``seed n`` (``make replicate``), then ``family seed n`` (``make family SEED=n``);
    ``{}`` where the folder is missing (a pip install does not ship it: :data:`RECORDS_MISSING`)."""
    root = Path(root) if root is not None else REPO / "replicates"
    out = {}
    for label, folder in (("seed", "seed-*"), ("family seed", "family-seed-*")):
        found = [json.loads(p.read_text(encoding="utf-8")) for p in root.glob(f"{folder}/results.json")]
        out.update({f"{label} {r['seed']}": r for r in sorted(found, key=lambda r: r["seed"])})
    return out


#: what the reproduces page says where the runs' records are not there
RECORDS_MISSING = ("The runs' records (replicates/ in the course's repository) do not come\n"
                   "with a pip install of the package: clone the repository and run this\n"
                   "page there (make venv) to see them.")


def claims_now(root: Path | None = None) -> dict[str, dict]:
    """``replicates/claims-now.json``'s claims: per chapter, each wording a run recorded as not held
    -> [the claim as the chapter states it now, "shipped" or "restated"]."""
    root = Path(root) if root is not None else REPO / "replicates"
    return json.loads((root / "claims-now.json").read_text(encoding="utf-8"))["claims"]


def by_chapter(tested: list[tuple[str, dict, list[str], list[str]]]) -> list[tuple[str, int, str, str, int, int]]:
    """:func:`tested_after`'s rows as one row per chapter: ``(chapter, claims, the dates they were
    last worded, the runs trained after each (a range), claims tested on one, claims held on each run
    that tested them)``."""
    rows = []
    for chapter in dict.fromkeys(ch for ch, *_ in tested):
        mine = [(e, runs, held) for ch, e, runs, held in tested if ch == chapter]
        dates = sorted(e["date"][:10] for e, _, _ in mine)
        counts = sorted(len(runs) for _, runs, _ in mine)
        rows.append((chapter, len(mine), " to ".join(dict.fromkeys([dates[0], dates[-1]])) if dates else "-",
                     "-" if not counts else " to ".join(dict.fromkeys(map(str, [counts[0], counts[-1]]))),
                     sum(bool(runs) for _, runs, _ in mine),
                     sum(bool(runs) and len(held) == len(runs) for _, runs, held in mine)))
    return rows


def restated(tested: list[tuple[str, dict, list[str], list[str]]], now: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """The claims ``now`` (:func:`claims_now`) marks as restated after the runs, one row each:
    ``(chapter, the claim now, when it was last worded (date and commit), on which runs trained
    after that it was tested)``, "not yet tested on a run trained after it" where on none."""
    rows = []
    for chapter, mapping in now.items():
        mine = [(e, runs, held) for ch, e, runs, held in tested if ch == chapter]
        for text in dict.fromkeys(v[0] for v in mapping.values() if v[1] == "restated"):
            w = matching(text, [e["claim"] for e, _, _ in mine])
            if w is None:
                rows.append((chapter, text, "-", "no chapter states it now"))
                continue
            e, runs, held = next(x for x in mine if x[0]["claim"] == w)
            when = f"{'after ' if e.get('after') else ''}{e['date'][:10]}, {e['commit'][:7]}"
            rows.append((chapter, text, when, f"held on {len(held)} of {len(runs)} runs trained after it" if runs
                         else "not yet tested on a run trained after it"))
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m attncircuits.course.claim_dates",
                                description="Write replicates/claim-dates.json from git's history (make claim-dates).")
    p.add_argument("--rebuild", action="store_true", help="date every chapter's claims again, not only the changed")
    args = p.parse_args(argv)
    redo = update(rebuild=args.rebuild)
    n = sum(len(v) for v in load().values())
    print(f"claim-dates: {n} claims in {REGISTRY.relative_to(REPO)}; dated again: {', '.join(redo) or 'none'}")


if __name__ == "__main__":
    main()
