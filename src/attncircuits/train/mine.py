"""The course on the learner's own text: ``make train-mine CORPUS='path/**/*.py' OUT=DIR``.

``python -m attncircuits.train.mine 'path/**/*.py' --out DIR`` trains a byte-level BPE tokenizer of
:data:`VOCAB` tokens on the files' training split, writes it with the corpus files into
``DIR/corpus/`` (validation split by a hash of each file's name, as for the shipped corpus), trains
``attn-only-0l``, ``-1l`` and ``-2l`` on the files into ``DIR`` with the faster recipe
:data:`RECIPE`, and prints the one line that points the course at them::

    export ATTNCIRCUITS_MODELS=/abs/path/DIR

Rerunning the same command continues: the corpus and finished models are kept, an interrupted
model resumes (the training CLI's ``--resume``). A corpus that matches no file, holds a file that
is not text, or is too small for the chapters (:data:`MIN_VALIDATION_TOKENS`,
:data:`MIN_TRAIN_TOKENS`) is refused in one line before anything is written.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from attncircuits import data
from attncircuits.checkpoints import modelset
from attncircuits.train.loop import prepare_corpus
from attncircuits.train.sets import default_lanes, train_set

#: the tokenizer's size: the shipped models' 2,048, so that the chapters' claims about the tokens (2.5
#: to 4.5 bytes a token, common keywords single tokens) and the models' shapes hold. A smaller one
#: makes a step cheaper (the unembedding is most of it), but at 512 the search below found the
#: models weaker on text.
VOCAB = 2048
#: the chapters read up to 1,024 validation windows of 128 tokens (the reproduces page's ICL score)
MIN_VALIDATION_TOKENS = 1024 * 128
#: below this the models would mostly memorise the training split (the shipped one has 3.6 M)
MIN_TRAIN_TOKENS = 500_000
#: training flags per model (besides --preset, --corpus-files, --tokenizer, --out): the shipped
#: presets (batch mix, rate, cosine decay to 10%) with fewer steps, split so that the 2-layer model,
#: in one process, takes about as long as the other two one after the other in another
#: (sets.LANES). The search, on SQLAlchemy's source (8.6 MB; 2.14 M training tokens at 2,048
#: tokens), every chapter run on each set (claims held of 181; 180 before chapter 7 could run on a
#: set whose heads still rise at its last snapshot):
#:
#:   steps 0L / 1L / 2L                         whole command, 2 cores       claims held
#:   8,000 / 8,000 / 8,000 (the shipped presets)  33 min one at a time *       158
#:   3,500 / 4,000 / 5,000 (this recipe)        14.9 min, idle               150
#:   2,000 / 4,000 / 5,000                      13.8 min, idle               148
#:   2,000 / 5,000 / 6,000                      16 min, partly busy          148 of 180
#:   1,500 / 3,500 / 4,000, cosine to 30%       (busy, not timed)            142 of 180
#:   1,000 / 2,000 / 3,000 at 512 tokens, a constant rate after warm-up and half of each batch
#:       repeated random tokens (chapter 7's live recipe, scaled up): 18.5 min one at a time on
#:       a busy machine, 135 (its 1-layer model no better than its 0-layer one on text)
#:
#: * the shipped models' histories on the standard library (the same step cost at 2,048 tokens).
#: What the fewer steps cost against the shipped presets, on that text: the 2-layer model's second
#: copy of repeated random tokens (1.9 nats against 0.3) and its ICL score (-0.17 against -0.30),
#: and the claims that rest on them.
RECIPE: dict[str, list[str]] = {
    "attn-only-0l": ["--steps", "3500"],
    "attn-only-1l": ["--steps", "4000"],
    "attn-only-2l": ["--steps", "5000", "--snapshot-steps", "0", "500", "1000", "1500", "2000", "2500", "3000", "4000"],
}


class Refused(Exception):
    """The corpus or the output folder cannot be used; one line says why and what to do."""


def corpus_files(patterns: list[str]) -> list[Path]:
    """The files the glob ``patterns`` match (``**`` spans folders), sorted; refused when none."""
    files = sorted({Path(p) for pat in patterns for p in glob.glob(os.path.expanduser(pat), recursive=True)
                    if Path(p).is_file()})
    if not files:
        raise Refused(f"CORPUS={' '.join(patterns)!r} matches no files; quote the pattern (e.g. CORPUS='src/**/*.py') "
                      "so that the shell does not expand it")
    return files


def check_corpus(corpus: data.Corpus, vocab: int, min_train: int, min_val: int) -> Path:
    """Train the tokenizer and count the tokens of both splits; refuse a corpus too small. Returns
    the tokenizer's path (a temporary file)."""
    tok = data.train_tokenizer([t for _, t in corpus.train], vocab)
    n_train = len(data.tokenize_documents(tok, corpus.train))
    n_val = len(data.tokenize_documents(tok, corpus.validation))
    if n_train < min_train or n_val < min_val:
        # about one file in ten is held out for validation, so the validation minimum usually binds
        need = max(min_train / 0.9, min_val / 0.1) * corpus.n_bytes / max(1, n_train + n_val)
        raise Refused(f"the corpus is too small: {n_train:,} training and {n_val:,} validation tokens ({corpus.describe()}); "
                      f"the course needs at least {min_train:,} and {min_val:,}, about {need / 1e6:.1f} MB of such text "
                      "(one file in ten is held out for validation): add more files")
    fd, path = tempfile.mkstemp(suffix="-tokenizer.json")
    os.close(fd)
    tok.save(path)
    return Path(path)


def train_mine(patterns: list[str], out: str | Path, recipe: dict[str, list[str]] = RECIPE, vocab: int = VOCAB,
               min_train: int = MIN_TRAIN_TOKENS, min_val: int = MIN_VALIDATION_TOKENS, threads: int | None = 1,
               side_by_side: bool = True) -> Path:
    """Make the set (see the module's docstring); returns its absolute folder."""

    out = Path(os.path.abspath(out))
    files = corpus_files(patterns)
    command = f"make train-mine CORPUS='{' '.join(patterns)}' OUT={out}"
    info = {"kind": "own corpus", "corpus": patterns, "files": len(files), "vocab": vocab, "command": command}
    old = (out / modelset.SET_FILE).read_text() if (out / modelset.SET_FILE).is_file() else None
    if old is not None and {k: v for k, v in json.loads(old).items() if k != "command"} != \
            {k: v for k, v in info.items() if k != "command"}:
        raise Refused(f"{out} holds a set made from other files ({json.loads(old).get('corpus')}); choose another OUT")
    if old is None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Refused(f"{out} exists and is not a set this command made; choose a new OUT (nothing was written)")
    corpus_dir = out / "corpus"
    try:
        corpus = data.load_corpus(files)  # refuses binary files, one line
    except (ValueError, OSError) as err:
        raise Refused(str(err)) from None
    if not (corpus_dir / "manifest.json").is_file():
        tok_path = check_corpus(corpus, vocab, min_train, min_val)
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / modelset.SET_FILE).write_text(json.dumps(info) + "\n")
            prepare_corpus(vocab, corpus_dir, corpus=corpus, tokenizer_path=tok_path)
        finally:
            tok_path.unlink(missing_ok=True)
    flags = {name: ["--preset", name, "--corpus-files", *map(str, files),
                    "--tokenizer", str(corpus_dir / "tokenizer.json"), *recipe[name]] for name in modelset.SET_MODEL_NAMES}
    train_set(out, flags, threads, lanes=default_lanes() if side_by_side else None)
    modelset.check(out)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m attncircuits.train.mine", description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", nargs="+", help="glob patterns of text files, quoted (e.g. 'src/**/*.py')")
    p.add_argument("--out", type=Path, required=True, help="the new set's folder")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per model (default 1)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="train the models one after the other in this process (default: side by side on 2+ cores)")
    args = p.parse_args(argv)
    start = time.time()
    try:
        out = train_mine(args.corpus, args.out, threads=args.threads, side_by_side=not args.one_at_a_time)
    except Refused as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        sys.exit(2)
    walls = [json.loads((out / n / "history.json").read_text())["wall_s"][-1] / 60 for n in modelset.SET_MODEL_NAMES]
    tokens = json.loads((out / "corpus" / "corpus.json").read_text()).get("train_tokens", 0)
    print(f"trained: {', '.join(f'{n} {w:.1f} min' for n, w in zip(modelset.SET_MODEL_NAMES, walls))}; "
          f"this command took {(time.time() - start) / 60:.1f} min ({tokens / 1e6:.2f} M training tokens)")
    print("point the course at these models with:")
    print(f"export {modelset.ENV}={out}")


if __name__ == "__main__":
    main()
