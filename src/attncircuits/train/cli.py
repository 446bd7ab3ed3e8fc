"""The training command line, ``python -m attncircuits.train``: checks, output folders, resuming.

Everything that can be wrong with a command is found before the first training step and reported
one line per problem: every flag's value, the device, the memory a step needs, the corpus files
(text only), and the output folder (symbolic links resolved; it must be a folder the run can be
renamed into). A run writes only into ``<out>.partial/``, which it locks (a second run into the same
``--out`` is refused while the first lives) and which ends as a transaction: see ``run_folder.py``.
An existing ``<out>`` is replaced only with ``--overwrite`` and only when it is a model folder this
program wrote. Ctrl-C stops at the next step boundary and keeps a resumable state in
``<out>.partial/resume/`` (also refreshed at every evaluation); during the final save it is held
until the model is in place. ``--resume`` continues an interrupted run, or puts in place a finished
model whose save was cut short. A non-finite loss stops the run, keeping the last finite state. Every
error is one line that says what was kept and where.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import sys
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors.torch import load_file

from attncircuits import data
from attncircuits.checkpoints.pretrained import (
    CORPUS_DIR,
    PRETRAINED_DIR,
    RESUME_SUBDIR,
    check_replaceable,
    state_dict_for_save,
    write_checkpoint_files,
)
from attncircuits.core import devices, durable
from attncircuits.core.manifest import save_weights, sha256, verify_manifest
from attncircuits.models.hooked import model_config
from attncircuits.train import run_folder
from attncircuits.train.loop import (
    TrainConfig,
    TrainingDiverged,
    TrainingInterrupted,
    corpus_streams,
    memory_limit_bytes,
    prepare_corpus,
    step_memory_bytes,
    train,
)
from attncircuits.train.presets import PRESETS
from attncircuits.train.run_folder import RunFolderError, kept

PROG = "python -m attncircuits.train"


class Refused(Exception):
    """A problem with the command, reported as one line (exit status 2)."""


class Interrupted(Refused):
    """Ctrl-C stopped the run; its progress is kept for ``--resume`` (exit status 130)."""


class Failed(Refused):
    """The run failed (a disk error, a diverging loss); the line says what was kept (exit status 1)."""


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
    """``--device`` checked against this machine's devices (:mod:`attncircuits.core.devices`)."""
    if name is None:
        return None
    try:
        devices.check(name, "--device")
    except ValueError as err:
        raise Refused(str(err)) from None
    return name


def resolve_out(given: Path) -> Path:
    """``--out`` as the real folder the run will be renamed into (:func:`durable.real_folder`)."""
    try:
        return durable.real_folder(given, "--out ")
    except ValueError as err:
        raise Refused(str(err)) from None


def check_args(args) -> tuple[dict, TrainConfig, Path]:
    """All problems with the command line, one line each, before anything is written."""
    problems = []
    if args.preset == "attn-only-2l-live":  # its 256-id token streams are built by attncircuits.train.live
        problems.append("--preset attn-only-2l-live reads its own 256-token vocabulary: "
                        "train it with attncircuits.train.live.live_train()")
    model_kw, train_kw = PRESETS[args.preset]
    given = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__ and v is not None}
    cfg = TrainConfig(**{**train_kw, **given})
    problems += [f"--{name.replace('_', '-')} {what.replace('random_repeat_frac', '--random-repeat-frac')}"
                 for name, what in cfg.problems()]
    if not problems:  # a step must fit in memory (the vocabulary is at most the preset's)
        model_cfg = model_config(model_kw)
        need, limit = step_memory_bytes(model_cfg, cfg.batch_size), memory_limit_bytes()
        need += 8 * cfg.eval_batches * cfg.batch_size * model_cfg.n_ctx  # the validation windows
        if need > limit:
            per_row = step_memory_bytes(model_cfg, 1) - step_memory_bytes(model_cfg, 0)
            problems.append(f"--batch-size {cfg.batch_size} needs about {need / 2**30:,.1f} GiB a step, more than the "
                            f"{limit / 2**30:.1f} GiB allowed (half this machine's memory); use --batch-size "
                            f"<= {max(1, limit // per_row // (1 + cfg.eval_batches))}")
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
    out = resolve_out(args.out or PRETRAINED_DIR / args.preset)
    try:
        check_replaceable(out, args.overwrite)
    except FileExistsError as err:
        raise Refused(f"--out: {err}".replace("overwrite=True (CLI: --overwrite)", "--overwrite")) from None
    if not out.parent.is_dir():
        raise Refused(f"--out {args.out}: the folder {out.parent} does not exist; create it first")
    for folder in (out.parent, *([out] if out.exists() else [])):  # each rename needs these writable
        if not os.access(folder, os.W_OK | os.X_OK):
            raise Refused(f"--out {args.out}: cannot write in {folder} (permission denied); choose a folder you can write to")
    return model_kw, cfg, out


def save_resume_state(tmp: Path, st: dict) -> None:
    """Write ``st`` (see :func:`attncircuits.train.train`) as ``<out>.partial/resume`` (see
    :func:`attncircuits.train.run_folder.save_state`: a kill at any moment leaves one complete state)."""
    tensors = {f"model/{k}": v.contiguous() for k, v in st["model"].items()}
    for i, s in st["optimizer"].items():
        tensors.update({f"optimizer/{i}/{k}": v.detach().cpu().contiguous() for k, v in s.items()})
    tensors["rng/generator"], tensors["rng/torch"] = st["generator"], st["torch_rng"]
    for step, sd in st["snapshots"].items():
        tensors.update({f"snapshot/{step}/{k}": v for k, v in sd.items()})

    def write(folder: Path) -> None:
        save_weights(tensors, folder / "state.safetensors")
        (folder / "state.json").write_text(json.dumps({k: st[k] for k in ("step", "ema", "wall_s", "history")}) + "\n")

    run_folder.save_state(tmp, write)


def load_resume_state(tmp: Path) -> dict:
    """The state saved by :func:`save_resume_state`, verified; a damaged one is refused in one line."""
    directory = tmp / RESUME_SUBDIR
    try:
        verify_manifest(directory)
        meta = json.loads((directory / "state.json").read_text())
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
    except Exception as err:  # noqa: BLE001 (any damage: truncated, forged, unreadable)
        why = str(err).split(";")[0].splitlines()[0] if str(err) else type(err).__name__
        raise Refused(f"--resume: the saved state in {directory} is damaged ({type(err).__name__}: {why[:120]}); "
                      f"delete {tmp} to start over") from None
    return st


def _os_error(err: BaseException) -> OSError:
    """An OSError for a failed write reported as another exception (the tokenizers library's)."""
    if isinstance(err, OSError):
        return err
    code = re.search(r"(?:code: |os error )(\d+)", str(err))
    code = int(code.group(1)) if code else errno.EIO
    return OSError(code, os.strerror(code))


def corpus_and_tokenizer(args, tmp: Path, corpus: data.Corpus | None = None) -> tuple:
    """Token streams, the tokenizer's path, the tokenizer and the SHA-256 of the corpus's contents; anything new is
    written under ``tmp`` only (or the shipped corpus folder for ``--prepare-corpus`` without
    ``--out``, as ``make train`` does)."""
    if args.corpus_files:  # the model then carries its validation text (see attncircuits.checkpoints.modelset)
        corpus = corpus or data.load_corpus(args.corpus_files)
        tok_path = tmp / "corpus" / "tokenizer.json"
        if not (args.resume and (tmp / "corpus" / "manifest.json").is_file()):
            vocab = PRESETS[args.preset][0].get("d_vocab", data.DEFAULT_VOCAB_SIZE)
            try:
                prepare_corpus(vocab, tmp / "corpus", corpus=corpus, tokenizer_path=args.tokenizer)
            except Exception as err:  # noqa: BLE001 (tokenizers raises a bare Exception on a full disk)
                if type(err) is not Exception:
                    raise
                e = _os_error(err)
                raise OSError(e.errno, e.strerror, str(tok_path)) from None
    else:
        corpus_dir = CORPUS_DIR if args.out is None else tmp / "corpus"
        if args.prepare_corpus and not (args.resume and (corpus_dir / "tokenizer.json").is_file()):
            prepare_corpus(directory=corpus_dir)
        tok_path = corpus_dir / "tokenizer.json" if args.prepare_corpus else CORPUS_DIR / "tokenizer.json"
        if not tok_path.is_file():
            raise Refused(f"the shipped tokenizer {tok_path} is missing; restore it with `git checkout -- {tok_path}` "
                          "or add --prepare-corpus")
        corpus = data.load_corpus()
    h = hashlib.sha256()
    for name, text in [*corpus.train, *corpus.validation]:
        h.update(f"{len(name)}:{name}{len(text)}:".encode() + text.encode("utf-8", "surrogatepass"))
    tokenizer = data.load_tokenizer(tok_path)
    tr, va, _ = corpus_streams(tokenizer, corpus)
    return tr, va, tok_path, tokenizer, h.hexdigest()


def run(args) -> Path:
    model_kw, cfg, out = check_args(args)
    # read (and refuse non-text files) before anything is written; read once
    corpus = data.load_corpus(args.corpus_files) if args.corpus_files else None
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        part = run_folder.open_partial(out, args.resume, [PROG, *getattr(args, "argv", [])])
    except RunFolderError as err:
        raise Refused(str(err)) from None
    try:
        return _run(args, model_kw, cfg, out, part, corpus)
    finally:
        part.close()


def _run(args, model_kw: dict, cfg: TrainConfig, out: Path, part: run_folder.Partial, corpus=None) -> Path:
    tmp, stage = part.path, "before training started"
    if part.ended:
        run_folder.clean(tmp)
        print(f"saved {out}: the run had ended with its model in place; what it left in {tmp} is removed")
        return out
    try:
        tr, va, tok_path, tokenizer, corpus_sha = corpus_and_tokenizer(args, tmp, corpus)
        model_kw = {**model_kw, "d_vocab": tokenizer.get_vocab_size()}
        model_cfg = model_config(model_kw)
        for name, tokens in (("training", tr), ("validation", va)):
            if len(tokens) < model_cfg.n_ctx:
                raise Refused(f"the {name} split has {len(tokens)} tokens, fewer than the context of "
                              f"{model_cfg.n_ctx}: give more or longer text files")
        run_id = {"preset": args.preset, "model": model_cfg.to_dict(), "train": json.loads(json.dumps(asdict(cfg))),
                  "corpus_files": sorted(str(p.resolve()) for p in args.corpus_files or []),
                  "corpus_sha256": corpus_sha, "tokenizer_sha256": sha256(tok_path)}
        run_folder.check_run_id(part, run_id, args.resume)
        if part.pending:  # the run had finished; its save was cut short
            stage = "while putting the finished model in place"
            with durable.hold_signals():
                run_folder.place(part, args.overwrite)
            print(f"saved {out}: the finished run kept in {tmp} is now in place")
            return out
        state = load_resume_state(tmp) if args.resume else None
        stage = "during training"
        model, history, snaps = train(model_cfg, cfg, tr, va, device=args.device, resume=state,
                                      save_state=lambda st: save_resume_state(tmp, st))
        stage = "while saving the model"
        meta = {"preset": args.preset, "train": asdict(cfg), "torch": torch.__version__, "python": sys.version.split()[0]}
        corpus = {"corpus": tmp / "corpus"} if args.prepare_corpus and args.out is not None else {}

        def write(folder: Path) -> None:
            write_checkpoint_files(folder, state_dict_for_save(model), {"model": model_cfg.to_dict(), **meta}, tok_path,
                                   history, snaps, corpus)

        with durable.hold_signals() as held:
            run_folder.finish(part, write, args.overwrite)
        if held:
            print(f"{PROG}: {held[0]} during the save was held until the model was in place", file=sys.stderr)
    except TrainingInterrupted as stop:
        raise Interrupted(f"interrupted before step {stop.step} of {cfg.steps}; {kept(out, cfg.steps)}") from None
    except BaseException as err:
        where = kept(out, cfg.steps)
        if not run_folder.keeps_anything(out):
            run_folder.clean(tmp)
        if isinstance(err, KeyboardInterrupt):
            raise Interrupted(f"interrupted {stage}; {where}") from None
        if isinstance(err, TrainingDiverged):
            step = run_folder.saved_step(tmp)
            where = (f"the last finite state (step {step}) is kept in {tmp}; delete it and run again with a lower --lr"
                     if step is not None else f"nothing was kept; run again with a lower --lr than {cfg.lr:g}")
            raise Failed(f"{err}; {where}") from None
        if isinstance(err, RunFolderError):
            raise Refused(str(err)) from None
        if isinstance(err, OSError) and not isinstance(err, FileNotFoundError) or isinstance(err, MemoryError):
            what = f"cannot write {err.filename}" if getattr(err, "filename", None) else "a disk or memory error"
            why = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise Failed(f"{what} ({why}) {stage}; {where}") from None
        if where != "nothing was kept" and not isinstance(err, Refused):
            print(f"{PROG}: {where}", file=sys.stderr)
        raise
    last = {k: v[-1] for k, v in history.items() if isinstance(v, list) and v and not isinstance(v[-1], list)}
    print(f"saved {out}: {last}; {history['tokens_per_s']:,.0f} tokens/s")
    return out


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except Refused as err:
        for line in str(err).splitlines():
            print(f"{PROG}: error: {line}", file=sys.stderr)
        sys.exit(130 if isinstance(err, Interrupted) else 1 if isinstance(err, Failed) else 2)
    except (ValueError, OSError) as err:  # unreadable or unsuitable input, named by the message
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted before training started; nothing was written", file=sys.stderr)
        sys.exit(130)
