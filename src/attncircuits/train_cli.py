"""The training command line, ``python -m attncircuits.train``: checks, output folders, resuming.

Everything that can be wrong with a command is found before the first training step and reported
one line per problem: every flag's value, the device, the corpus files (text only), and the output
folder. A run writes only into ``<out>.partial/`` (marked with ``PARTIAL_MARKER``), renamed to
``<out>`` at the end; an existing ``<out>`` is replaced only with ``--overwrite`` and only when it is
a model folder this program wrote. Ctrl-C stops at the next step boundary and keeps a resumable
state in ``<out>.partial/resume/`` (it is also refreshed at every evaluation); ``--resume``
continues from there, and any other failure removes ``<out>.partial`` unless it holds such a state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors.torch import load_file

from . import data
from .hooked import model_config
from .pretrained import (
    CORPUS_DIR, PARTIAL_MARKER, PRETRAINED_DIR, RESUME_SUBDIR, check_replaceable, partial_dir, save_checkpoint,
    save_weights, sha256, verify_manifest, write_manifest,
)
from .train import PRESETS, TrainConfig, TrainingInterrupted, corpus_streams, prepare_corpus, train

PROG = "python -m attncircuits.train"


class Refused(Exception):
    """A problem with the command, reported as one line (exit status 2)."""


class Interrupted(Refused):
    """Ctrl-C stopped the run; its progress is kept for ``--resume`` (exit status 130)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other refusal
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Train an attention-only transformer (see attncircuits.train).")
    p.add_argument("--preset", choices=sorted(PRESETS), default="attn-only-2l")
    p.add_argument("--out", type=Path, help="output model folder (default: the shipped model's folder)")
    p.add_argument("--overwrite", action="store_true", help="replace a model this program wrote in --out")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run kept in <out>.partial")
    p.add_argument("--prepare-corpus", action="store_true",
                   help="(re)train the tokenizer and corpus files first: the shipped ones, or <out>/corpus with --out")
    p.add_argument("--corpus-files", nargs="+", type=Path,
                   help="train on these local text files instead (tokenizer and corpus files go into <out>/corpus)")
    p.add_argument("--tokenizer", type=Path, help="with --corpus-files: read this tokenizer.json instead of training one")
    p.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")
    p.add_argument("--threads", type=int, help="torch CPU threads (one per process uses these models well)")
    for f in fields(TrainConfig):  # every TrainConfig field is a flag, e.g. --steps 200
        if f.name not in ("snapshot_steps", "betas"):
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(TrainConfig(), f.name)))
    p.add_argument("--snapshot-steps", type=int, nargs="*")
    return p


def check_device(name: str | None) -> str | None:
    if name is None:
        return None
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise Refused(f"--device {name!r} is not a device; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise Refused(f"--device {name}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise Refused(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise Refused(f"--device {name}: MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise Refused(f"--device {name}: training runs on cpu, cuda or mps")
    return name


def check_args(args) -> tuple[dict, TrainConfig, Path]:
    """All problems with the command line, one line each, before anything is written."""
    problems = []
    if args.preset == "attn-only-2l-live":  # its 256-id token streams are built by attncircuits.live
        problems.append("--preset attn-only-2l-live reads its own 256-token vocabulary: "
                        "train it with attncircuits.live.live_train()")
    model_kw, train_kw = PRESETS[args.preset]
    given = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__ and v is not None}
    cfg = TrainConfig(**{**train_kw, **given})
    problems += [f"--{name.replace('_', '-')} {what.replace('random_repeat_frac', '--random-repeat-frac')}"
                 for name, what in cfg.problems()]
    if args.threads is not None and args.threads < 1:
        problems.append(f"--threads must be a whole number >= 1 (got {args.threads})")
    if args.tokenizer is not None and not args.corpus_files:
        problems.append("--tokenizer goes with --corpus-files (the default corpus has the shipped tokenizer)")
    elif args.tokenizer is not None and not args.tokenizer.is_file():
        problems.append(f"--tokenizer {args.tokenizer}: no such file; give a tokenizer.json (e.g. <set>/corpus/tokenizer.json)")
    if args.prepare_corpus and args.corpus_files:
        problems.append("--prepare-corpus and --corpus-files exclude each other: the first rebuilds the default corpus")
    try:
        check_device(args.device)
    except Refused as err:
        problems.append(str(err))
    if problems:
        raise Refused("\n".join(problems))
    out = Path(os.path.abspath(args.out or PRETRAINED_DIR / args.preset))
    if not out.name:
        raise Refused(f"--out {args.out} is not a folder this program can create; name a new folder")
    try:
        check_replaceable(out, args.overwrite)
    except FileExistsError as err:
        raise Refused(f"--out: {err}".replace("overwrite=True (CLI: --overwrite)", "--overwrite")) from None
    if not out.parent.is_dir():
        raise Refused(f"--out {args.out}: the folder {out.parent} does not exist; create it first")
    return model_kw, cfg, out


def open_partial(out: Path, resume: bool) -> Path:
    """Create (or, with ``resume``, reopen) ``<out>.partial``; refuse what this program did not write."""
    tmp = partial_dir(out)
    state = tmp / RESUME_SUBDIR / "state.json"
    if tmp.exists() or tmp.is_symlink():
        if not tmp.is_dir() or not (tmp / PARTIAL_MARKER).is_file():
            raise Refused(f"{tmp} exists and was not written by this program; move it away or choose another --out")
        if state.is_file() and not resume:
            step = json.loads(state.read_text())["step"]
            raise Refused(f"{tmp} holds an interrupted run (stopped before step {step}): add --resume to continue "
                          f"it, or delete {tmp} to start over")
        if state.is_file():
            return tmp
        shutil.rmtree(tmp)  # left by a run killed before its first saved state: nothing to keep
    if resume:
        raise Refused(f"--resume: there is no interrupted run to continue ({tmp} not found); leave out --resume")
    try:
        tmp.mkdir()
        (tmp / PARTIAL_MARKER).write_text(json.dumps({"written_by": "attncircuits.train", "out": str(out)}) + "\n")
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Refused(f"--out {out}: cannot write {tmp} ({err.strerror}); choose a folder you can write to") from None
    return tmp


def save_resume_state(tmp: Path, st: dict, run: dict) -> None:
    """Write ``st`` (see :func:`attncircuits.train.train`) into ``<out>.partial/resume``, atomically."""
    tensors = {f"model/{k}": v.contiguous() for k, v in st["model"].items()}
    for i, s in st["optimizer"].items():
        tensors.update({f"optimizer/{i}/{k}": v.detach().cpu().contiguous() for k, v in s.items()})
    tensors["rng/generator"], tensors["rng/torch"] = st["generator"], st["torch_rng"]
    for step, sd in st["snapshots"].items():
        tensors.update({f"snapshot/{step}/{k}": v for k, v in sd.items()})
    new = tmp / (RESUME_SUBDIR + ".new")
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir()
    save_weights(tensors, new / "state.safetensors")
    meta = {k: st[k] for k in ("step", "ema", "wall_s", "history")}
    (new / "state.json").write_text(json.dumps({**meta, "run": run}) + "\n")
    write_manifest(new)
    shutil.rmtree(tmp / RESUME_SUBDIR, ignore_errors=True)
    new.rename(tmp / RESUME_SUBDIR)


def load_resume_state(tmp: Path, run: dict) -> dict:
    """The state saved by :func:`save_resume_state`, verified, for the same command only."""
    directory = tmp / RESUME_SUBDIR
    verify_manifest(directory)
    meta = json.loads((directory / "state.json").read_text())
    differs = sorted(k for k in set(run) | set(meta["run"]) if run.get(k) != meta["run"].get(k))
    if differs:
        raise Refused(f"--resume: the run in {tmp} was started with other settings ({', '.join(differs)}); "
                      f"repeat its command with --resume, or delete {tmp} to start over")
    t = load_file(directory / "state.safetensors")
    st = {k: meta[k] for k in ("step", "ema", "wall_s", "history")}
    st["model"] = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith("model/")}
    st["optimizer"], st["snapshots"] = {}, {}
    for k, v in t.items():
        kind, *rest = k.split("/")
        if kind == "optimizer":
            st["optimizer"].setdefault(int(rest[0]), {})[rest[1]] = v
        elif kind == "snapshot":
            st["snapshots"].setdefault(int(rest[0]), {})[rest[1]] = v
    st["generator"], st["torch_rng"] = t["rng/generator"], t["rng/torch"]
    return st


def corpus_and_tokenizer(args, tmp: Path) -> tuple:
    """Token streams and the tokenizer's path; anything new is written under ``tmp`` only (or the
    shipped corpus folder for ``--prepare-corpus`` without ``--out``, as ``make train`` does)."""
    if args.corpus_files:  # the model then carries its validation text (see attncircuits.modelset)
        corpus = data.load_corpus(args.corpus_files)
        tok_path = tmp / "corpus" / "tokenizer.json"
        if not (args.resume and (tmp / "corpus" / "manifest.json").is_file()):
            vocab = PRESETS[args.preset][0].get("d_vocab", data.DEFAULT_VOCAB_SIZE)
            prepare_corpus(vocab, tmp / "corpus", corpus=corpus, tokenizer_path=args.tokenizer)
        tr, va, _ = corpus_streams(data.load_tokenizer(tok_path), corpus)
        return tr, va, tok_path
    corpus_dir = CORPUS_DIR if args.out is None else tmp / "corpus"
    if args.prepare_corpus and not (args.resume and (corpus_dir / "tokenizer.json").is_file()):
        prepare_corpus(directory=corpus_dir)
    tok_path = corpus_dir / "tokenizer.json" if args.prepare_corpus else CORPUS_DIR / "tokenizer.json"
    if not tok_path.is_file():
        raise Refused(f"the shipped tokenizer {tok_path} is missing; restore it with `git checkout -- {tok_path}` "
                      "or add --prepare-corpus")
    tr, va, _ = corpus_streams(data.load_tokenizer(tok_path))
    return tr, va, tok_path


def run(args) -> Path:
    model_kw, cfg, out = check_args(args)
    if args.corpus_files:  # read (and refuse non-text files) before anything is written
        data.load_corpus(args.corpus_files)
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = open_partial(out, args.resume)
    resumable = (tmp / RESUME_SUBDIR).is_dir()
    try:
        tr, va, tok_path = corpus_and_tokenizer(args, tmp)
        model_kw = {**model_kw, "d_vocab": data.load_tokenizer(tok_path).get_vocab_size()}
        model_cfg = model_config(model_kw)
        for name, tokens in (("training", tr), ("validation", va)):
            if len(tokens) < model_cfg.n_ctx:
                raise Refused(f"the {name} split has {len(tokens)} tokens, fewer than the context of "
                              f"{model_cfg.n_ctx}: give more or longer text files")
        run_id = {"preset": args.preset, "model": model_cfg.to_dict(), "train": json.loads(json.dumps(asdict(cfg))),
                  "corpus_files": sorted(str(p.resolve()) for p in args.corpus_files or []),
                  "tokenizer_sha256": sha256(tok_path)}
        state = load_resume_state(tmp, run_id) if args.resume else None

        def save_state(st):
            nonlocal resumable
            save_resume_state(tmp, st, run_id)
            resumable = True

        model, history, snaps = train(model_cfg, cfg, tr, va, device=args.device, resume=state, save_state=save_state)
        meta = {"preset": args.preset, "train": asdict(cfg), "torch": torch.__version__, "python": sys.version.split()[0]}
        save_checkpoint(model, out, tok_path, meta=meta, history=history, snapshots=snaps, overwrite=args.overwrite)
    except TrainingInterrupted as stop:
        raise Interrupted(f"interrupted before step {stop.step} of {cfg.steps}; progress kept in {tmp}: run the same "
                      "command with --resume to continue") from None
    except BaseException as err:
        if not resumable:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, KeyboardInterrupt):  # Ctrl-C before the first step
            kept = f"the earlier progress in {tmp} is kept (add --resume)" if resumable else "nothing was kept"
            raise Interrupted(f"interrupted before training started; {kept}") from None
        if resumable and not isinstance(err, Refused):
            print(f"{PROG}: progress up to the last evaluation is kept in {tmp}; add --resume to continue",
                  file=sys.stderr)
        raise
    last = {k: v[-1] for k, v in history.items() if isinstance(v, list) and v and not isinstance(v[-1], list)}
    print(f"saved {out}: {last}; {history['tokens_per_s']:,.0f} tokens/s")
    return out


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    try:
        run(args)
    except Refused as err:
        for line in str(err).splitlines():
            print(f"{PROG}: error: {line}", file=sys.stderr)
        sys.exit(130 if isinstance(err, Interrupted) else 2)
    except (ValueError, OSError) as err:  # unreadable or unsuitable input, named by the message
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted before training started; nothing was written", file=sys.stderr)
        sys.exit(130)
