"""The course on the learner's own text: ``make train-mine CORPUS='path/**/*.py' OUT=DIR``.

``python -m attncircuits.train.mine 'path/**/*.py' --out DIR`` holds out about a tenth of the files'
text for validation (whole files, or the last tenth of each: :mod:`attncircuits.data.split`; no text
in both splits), trains a byte-level BPE tokenizer of :data:`VOCAB` tokens on the training split,
writes it with the corpus files into ``DIR/corpus/``, trains ``attn-only-0l``, ``-1l`` and ``-2l`` on
the files into ``DIR`` with the recipe :data:`RECIPE`, checks that they are trained enough
for what the chapters test (:mod:`attncircuits.train.enough`) and prints the one line that points
the course at them::

    export ATTNCIRCUITS_MODELS=/abs/path/DIR

A check that fails is said in one line with the command that trains further (``STEPS=N``, twice
the 2-layer model's steps), and kept in ``DIR/set.json``, so that chapter 1 says it first.

Rerunning the same command continues: the corpus and finished models are kept, an interrupted
model resumes (the training CLI's ``--resume``); with ``--steps N`` a model trained for other steps
is trained again (``--overwrite``; resumable the same way). Refused in one line before anything
is written: a corpus that matches no file, holds a file that is not text, repeats itself
(:data:`attncircuits.data.split.MAX_REPEATED`), or is too small for the chapters: under
:data:`MIN_TOKENS` tokens (about :data:`MIN_MEGABYTES` MB of text like the shipped corpus), the
same minimum whether the text is one file or many.
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
from attncircuits.checkpoints.pretrained import is_checkpoint_dir
from attncircuits.core import durable
from attncircuits.data.split import MAX_REPEATED, repeated_share
from attncircuits.train import enough
from attncircuits.train.loop import prepare_corpus
from attncircuits.train.sets import default_lanes, train_set

#: the tokenizer's size: the shipped models' 2,048, so that the chapters' claims about the tokens (2.5
#: to 4.5 bytes a token, common keywords single tokens) and the models' shapes hold. A smaller one
#: makes a step cheaper (the unembedding is most of it), but at 512 the search below found the
#: models weaker on text.
VOCAB = 2048
#: the chapters read up to 1,024 validation windows of 128 tokens (the reproduces page's ICL score)
MIN_VALIDATION_TOKENS = 1024 * 128
#: the least text, in tokens of its own tokenizer, for one file or many: the smallest share the
#: split holds out (9%) is then at least :data:`MIN_VALIDATION_TOKENS`, and the training split 1.3 M
#: tokens (the shipped one has 3.6 M)
MIN_TOKENS = 1_460_000
#: :data:`MIN_TOKENS` in megabytes of text like the shipped corpus (3.07 bytes a token; a test
#: checks it against the shipped corpus.json); text the tokenizer compresses less needs fewer
MIN_MEGABYTES = 4.5
#: training flags per model (besides --preset, --corpus-files, --tokenizer, --out): the shipped
#: presets (batch mix, rate, cosine decay to 10%) with other steps, split so that the 2-layer model,
#: in one process, takes about as long as the other two one after the other in another
#: (sets.LANES). Chosen on three kinds of text, none the standard library
#: (``benchmarks/mine_kinds.py``: the whole command on 2 cores, then every chapter on the set;
#: validation losses on chapter 1's windows; the recipe's claims apart from the corpus's):
#:
#:   steps 0L/1L/2L      text                          min   val 0L / 1L / 2L     ICL  checks  claims
#:   7,000/8,000/10,000  prose: the KJV Bible, Django  18.5  4.250 / 3.865 / 3.598 -0.59  4 of 4  225/236
#:   (this recipe)        docs (10.3 MB)
#:                       code: SQLAlchemy (8.7 MB)     20.1  3.907 / 3.246 / 3.023 -0.27  4 of 4  212/233
#:                       mix: Django's source and      16.8  4.115 / 3.574 / 3.262 -0.57  4 of 4  217/233
#:                        docs (11.8 MB)
#:   3,500/4,000/5,000   prose                         27.0  4.284 / 4.009 / 4.051 -0.26  3 of 4  192/220
#:                       code                          20.7  3.935 / 3.404 / 3.462 +0.00  3 of 4  168/207
#:                       mix                           35.7  4.154 / 3.746 / 3.723 -0.45  3 of 4  204/228
#:
#: At 5,000 steps the 2-layer model did not beat the 1-layer one by chapter 1's noise on any of the
#: three (its loss still falling; those minutes on a machine busy with other training, the 10,000
#: steps' partly); at 10,000 every check held on all three. Earlier, on SQLAlchemy under the old
#: split (claims of 181): the shipped presets' 8,000 steps each (33 min one at a time) 158 held,
#: 3,500 / 4,000 / 5,000 (14.9 min) 150; fewer steps or chapter 7's live recipe, fewer still.
RECIPE: dict[str, list[str]] = {
    "attn-only-0l": ["--steps", "7000"],
    "attn-only-1l": ["--steps", "8000"],
    "attn-only-2l": ["--steps", "10000", "--snapshot-steps", "0", "1000", "2000", "3000", "4000", "5000", "6000",
                     "8000"],
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


def check_corpus(corpus: data.Corpus, vocab: int, min_tokens: int = MIN_TOKENS) -> Path:
    """Refuse a corpus that repeats itself or is too small; train the tokenizer on the training
    split and count the tokens of both. Returns the tokenizer's path (a temporary file)."""
    share = repeated_share(corpus.train, corpus.validation)
    if share > MAX_REPEATED:
        raise Refused(f"the corpus repeats itself: {share:.0%} of the validation text's distinct lines are also "
                      "training lines, so a validation loss would measure memory, not prediction; "
                      "use text that does not repeat (more files, or other ones)")
    tok = data.train_tokenizer([t for _, t in corpus.train], vocab)
    n_train = len(data.tokenize_documents(tok, corpus.train))
    n_val = len(data.tokenize_documents(tok, corpus.validation))
    total = n_train + n_val
    per_token = corpus.n_bytes / max(1, total)
    if total < min_tokens:
        raise Refused(f"the corpus is too small: {total:,} tokens in {corpus.n_bytes / 1e6:.2f} MB; the course needs "
                      f"at least {min_tokens:,} tokens, about {min_tokens * per_token / 1e6:.1f} MB of text like "
                      "this (a tenth is held out for validation): add more text")
    min_val = MIN_VALIDATION_TOKENS * min_tokens // MIN_TOKENS
    if n_val < min_val:  # a tenth of the bytes, but the held-out text compresses better than the rest
        raise Refused(f"the corpus is too small after the split: {n_val:,} validation tokens ({corpus.describe()}), "
                      f"fewer than the {min_val:,} the chapters read: add more text")
    fd, path = tempfile.mkstemp(suffix="-tokenizer.json")
    os.close(fd)
    tok.save(path)
    return Path(path)


def _flag_steps(flags: list[str]) -> int:
    return int(flags[flags.index("--steps") + 1])


def scaled(recipe: dict[str, list[str]], steps: int | None) -> dict[str, list[str]]:
    """``recipe`` with the 2-layer model trained ``steps`` steps and the others (and the 2-layer
    model's snapshots) scaled alike; ``steps=None``: the recipe as it is."""
    if steps is None:
        return {name: list(flags) for name, flags in recipe.items()}
    factor = steps / _flag_steps(recipe["attn-only-2l"])
    out = {}
    for name, flags in recipe.items():
        flags, i = list(flags), 0
        while i < len(flags):
            if flags[i] == "--steps":
                flags[i + 1] = str(max(1, round(int(flags[i + 1]) * factor)))
            elif flags[i] == "--snapshot-steps":
                j = i + 1
                while j < len(flags) and not flags[j].startswith("--"):
                    flags[j] = str(int(int(flags[j]) * factor))
                    j += 1
            i += 1
        out[name] = flags
    return out


def _trained_steps(folder: Path) -> int | None:
    try:
        return json.loads((folder / "config.json").read_text())["train"]["steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


#: what identifies a set in its set.json (the command, the steps and the checks may change)
_IDENTITY = ("kind", "corpus", "files", "vocab")


def train_mine(patterns: list[str], out: str | Path, recipe: dict[str, list[str]] = RECIPE, vocab: int = VOCAB,
               min_tokens: int = MIN_TOKENS, threads: int | None = 1, side_by_side: bool = True,
               steps: int | None = None) -> Path:
    """Make the set (see the module's docstring); returns its absolute folder. ``steps``: the
    2-layer model's steps (default: the recipe's), the others scaled alike (:func:`scaled`)."""

    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise Refused(f"--steps must be a whole number >= 1 (got {steps!r})")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise Refused(f"--threads must be a whole number >= 1 (got {threads!r})")
    try:
        out = durable.real_folder(out, "OUT=")
    except ValueError as err:
        raise Refused(str(err)) from None
    files = corpus_files(patterns)
    recipe = scaled(recipe, steps)
    base = f"make train-mine CORPUS='{' '.join(patterns)}' OUT={out}"
    n_steps = _flag_steps(recipe["attn-only-2l"])
    command = base + (f" STEPS={steps}" if steps is not None else "")
    info = {"kind": "own corpus", "corpus": patterns, "files": len(files), "vocab": vocab, "command": command,
            "steps": n_steps}
    try:
        old = json.loads((out / modelset.SET_FILE).read_text()) if (out / modelset.SET_FILE).is_file() else None
        if old is not None and not isinstance(old, dict):
            raise ValueError("not a set's record")
    except (ValueError, OSError) as err:
        raise Refused(f"{out / modelset.SET_FILE} does not read ({type(err).__name__}); choose another OUT, or "
                      f"move {out} away to make the set anew (nothing was written)") from None
    if old is not None and {k: old.get(k) for k in _IDENTITY} != {k: info[k] for k in _IDENTITY}:
        raise Refused(f"{out} holds a set made from other files ({old.get('corpus')}); choose another OUT")
    if old is None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Refused(f"{out} exists and is not a set this command made; choose a new OUT (nothing was written)")
    if problem := durable.unwritable(out):
        raise Refused(f"OUT={out} cannot be made: {problem}; choose another OUT (nothing was written)")
    corpus_dir = out / "corpus"
    try:
        corpus = data.load_corpus(files)  # refuses binary files, one line
    except (ValueError, OSError) as err:
        raise Refused(str(err)) from None
    if not (corpus_dir / "manifest.json").is_file():
        tok_path = check_corpus(corpus, vocab, min_tokens)
        try:
            out.mkdir(parents=True, exist_ok=True)
            durable.write_text(out / modelset.SET_FILE, json.dumps(info) + "\n")
            prepare_corpus(vocab, corpus_dir, corpus=corpus, tokenizer_path=tok_path)
        finally:
            tok_path.unlink(missing_ok=True)
    else:  # this command (its STEPS resume a half-written model); the last checks stand until new ones
        kept = {k: old[k] for k in ("checks", "failed", "train_further") if old is not None and k in old}
        durable.write_text(out / modelset.SET_FILE, json.dumps({**info, **kept}, indent=1) + "\n")
    flags = {}
    for name in modelset.SET_MODEL_NAMES:
        flags[name] = ["--preset", name, "--corpus-files", *map(str, files),
                       "--tokenizer", str(corpus_dir / "tokenizer.json"), *recipe[name]]
        trained = _trained_steps(out / name) if is_checkpoint_dir(out / name) else None
        if trained is not None and trained != _flag_steps(recipe[name]):
            print(f"train-mine: {name} was trained for {trained:,} steps; training it for "
                  f"{_flag_steps(recipe[name]):,}", flush=True)
            flags[name].append("--overwrite")
    train_set(out, flags, threads, lanes=default_lanes() if side_by_side else None)
    modelset.check(out)
    checks = enough.set_checks(out, corpus_dir)
    info.update(enough.as_record(checks, f"{base} STEPS={2 * n_steps}"))
    durable.write_text(out / modelset.SET_FILE, json.dumps(info, indent=1) + "\n")
    return out


def checks_lines(out: Path) -> list[str]:
    """What the command says of the checks in ``out``'s set.json: one line when they held; when one
    failed, one line naming each failed check and the command that trains further."""
    info = json.loads((out / modelset.SET_FILE).read_text())
    if not info.get("failed"):
        return [f"trained enough for the chapters: the {len(info.get('checks', []))} checks held "
                "(each layer helps, an induction head, a loss that stopped falling)"]
    return [f"not trained enough for the chapters: {'; '.join(info['failed'])}; train further with: "
            f"{info['train_further']}"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m attncircuits.train.mine", description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", nargs="+", help="glob patterns of text files, quoted (e.g. 'src/**/*.py')")
    p.add_argument("--out", type=Path, required=True, help="the new set's folder")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per model (default 1)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="train the models one after the other in this process (default: side by side on 2+ cores)")
    p.add_argument("--steps", type=int, help=f"the 2-layer model's steps (default {_flag_steps(RECIPE['attn-only-2l']):,}; the others "
                   "scaled alike); models trained for other steps are trained again")
    args = p.parse_args(argv)
    start = time.time()
    try:
        out = train_mine(args.corpus, args.out, threads=args.threads, side_by_side=not args.one_at_a_time,
                         steps=args.steps)
    except Refused as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        sys.exit(2)
    walls = [json.loads((out / n / "history.json").read_text())["wall_s"][-1] / 60 for n in modelset.SET_MODEL_NAMES]
    tokens = json.loads((out / "corpus" / "corpus.json").read_text()).get("train_tokens", 0)
    print(f"trained: {', '.join(f'{n} {w:.1f} min' for n, w in zip(modelset.SET_MODEL_NAMES, walls))}; "
          f"this command took {(time.time() - start) / 60:.1f} min ({tokens / 1e6:.2f} M training tokens)")
    lines = checks_lines(out)
    for line in lines:
        print(line)
    ready = not json.loads((out / modelset.SET_FILE).read_text()).get("failed")
    print("point the course at these models with:" if ready else
          "the course reads them as they are (chapter 1 says first what failed) with:")
    print(f"export {modelset.ENV}={out}")


if __name__ == "__main__":
    main()
