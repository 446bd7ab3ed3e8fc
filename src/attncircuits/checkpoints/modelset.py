"""Which models the course reads: the shipped ones, or a set named by ``ATTNCIRCUITS_MODELS``.

A *model set* is a folder holding ``attn-only-0l``, ``attn-only-1l`` and ``attn-only-2l``, each a
checkpoint folder written by ``python -m attncircuits.train --out ...``. ``make replicate SEED=n``
writes one (``replicates/seed-n``) and ``make train-mine`` another (on the learner's own files)::

    export ATTNCIRCUITS_MODELS=replicates/seed-1    # every chapter now reads that set
    unset ATTNCIRCUITS_MODELS                       # the shipped models, exactly as before

An empty value means unset; a relative path is read from the current folder (the notebooks run
in ``notebooks/``, so an absolute path is the safe choice; the make targets print one).

**The set's corpus** (the validation text the chapters measure on, the training split's bigram
counts, ``corpus.json``) is found in this order:

1. ``DIR/corpus/``: written by ``make train-mine`` beside its three models;
2. ``DIR/attn-only-0l/corpus/`` (then 1l, 2l): written into a model folder by
   ``python -m attncircuits.train --out ... --corpus-files ...`` or ``--prepare-corpus``;
3. the shipped corpus, when the set's tokenizer is the shipped one (a set trained with other seeds
   on the default corpus, as ``make replicate`` does: the same text, the same validation windows).

A set whose models read their own tokenizer but carry no corpus folder is refused, as is a set
whose three models read different tokenizers (the chapters compare them on one text).

This module reads folders and small JSON files only; loading the weights (and checking them
against their manifest) is :mod:`attncircuits.checkpoints.pretrained`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from attncircuits.data import load_tokenizer

ENV = "ATTNCIRCUITS_MODELS"
SET_MODEL_NAMES = ("attn-only-0l", "attn-only-1l", "attn-only-2l")
#: what ``make replicate`` / ``make train-mine`` record about how they made a set (see :func:`remake_command`)
SET_FILE = "set.json"
SHIPPED_DIR = Path(__file__).parent / "shipped"
SHIPPED_CORPUS_DIR = SHIPPED_DIR / "corpus"
_UNSET = f"or unset {ENV} to use the shipped models"


class ModelSetError(Exception):
    """``ATTNCIRCUITS_MODELS`` names a set the chapters cannot read; the message is one line that
    says what is missing and the command that makes it."""


@dataclass(frozen=True)
class ModelSet:
    """A checked set: its folder, the folder of its corpus files, and whether that is the shipped one."""

    directory: Path
    corpus_dir: Path
    shipped_corpus: bool


def _env_folder(name: str) -> Path | None:
    """The folder the environment variable ``name`` names, absolute; None when it is unset. A
    relative path is read from the current folder, or, where nothing is there, from the checkout
    this package lives in: ``export ATTNCIRCUITS_MODELS=replicates/seed-1`` at the repository's
    root then also finds the set from a kernel that runs in ``notebooks/``."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    path = Path(os.path.expanduser(value))
    here = Path(os.path.abspath(path))
    if path.is_absolute() or here.exists():
        return here
    checkout = Path(__file__).resolve().parents[3]
    there = checkout / path
    return there if (checkout / "pyproject.toml").is_file() and there.exists() else here


def current_dir() -> Path | None:
    """The folder ``ATTNCIRCUITS_MODELS`` names (absolute; see :func:`_env_folder`), or None for the
    shipped models."""
    return _env_folder(ENV)


#: a folder of family results (``make family SEED=n``) for chapter 11 to read instead of the committed
#: seed 0 (see :mod:`attncircuits.train.family`)
FAMILY_ENV = "ATTNCIRCUITS_FAMILY"


def family_dir() -> Path | None:
    """The folder ``ATTNCIRCUITS_FAMILY`` names (absolute; see :func:`_env_folder`), or None for the
    committed seed 0."""
    return _env_folder(FAMILY_ENV)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_json(path: Path) -> dict | None:
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def remake_command(directory: Path, name: str | None = None) -> str:
    """The command that (re)makes ``directory``, or one model of it: from the set's ``set.json`` when
    a make target wrote it (rerunning it resumes and skips finished models), else the training CLI
    with the seed the set's other models were trained with."""
    info = _read_json(directory / SET_FILE) or {}
    if isinstance(info.get("command"), str):
        return info["command"]
    seed = None
    for other in SET_MODEL_NAMES:
        cfg = _read_json(directory / other / "config.json") or {}
        seed = (cfg.get("train") or {}).get("seed", seed) if isinstance(cfg.get("train"), dict) else seed
    seed_flag = f" --seed {seed}" if isinstance(seed, int) else ""
    names = [name] if name else list(SET_MODEL_NAMES)
    return "; ".join(f"python -m attncircuits.train --preset {n}{seed_flag} --out {directory / n}" for n in names)


def _tokenizer_vocab_size(path: Path) -> int | None:
    try:
        return load_tokenizer(path).get_vocab_size()
    except Exception:  # missing, not JSON, not a tokenizer: the caller names the file
        return None


def _check_model(directory: Path, name: str) -> None:
    folder, partial = directory / name, directory / (name + ".partial")
    how = remake_command(directory, name)
    if not folder.is_dir():
        if partial.is_dir():
            raise ModelSetError(f"{ENV}={directory}: {name} is half-written ({partial} is an unfinished training run); "
                                f"finish it with `{how}` (add --resume to a `python -m attncircuits.train` command), {_UNSET}")
        raise ModelSetError(f"{ENV}={directory}: the set has no {name} (no folder {folder}); train it with `{how}`, {_UNSET}")
    cfg = _read_json(folder / "config.json")
    if cfg is None or not isinstance(cfg.get("model"), dict):
        raise ModelSetError(f"{ENV}={directory}: {folder / 'config.json'} is missing or unreadable, so {name} is not a "
                            f"finished model; retrain it with `{how}`, {_UNSET}")
    n_tok = _tokenizer_vocab_size(folder / "tokenizer.json")
    if n_tok is None:
        raise ModelSetError(f"{ENV}={directory}: {folder / 'tokenizer.json'} is missing or unreadable; "
                            f"retrain {name} with `{how}`, {_UNSET}")
    d_vocab = cfg["model"].get("d_vocab")
    if d_vocab != n_tok:
        raise ModelSetError(f"{ENV}={directory}: {name} has a vocabulary of {d_vocab} tokens but its tokenizer.json has "
                            f"{n_tok} (a tokenizer from another model?); retrain it with `{how}`, {_UNSET}")


def tokenizer_sha(model_folder: Path) -> str:
    """SHA-256 of a model folder's ``tokenizer.json`` (two models read the same tokens iff equal)."""
    return _sha(Path(model_folder) / "tokenizer.json")


def corpus_dir_of(directory: Path, tokenizer_sha: str) -> tuple[Path, bool]:
    """The corpus folder of the set in ``directory`` whose models read the tokenizer with SHA-256
    ``tokenizer_sha`` (see the module's docstring), and whether it is the shipped one."""
    for folder in [directory / "corpus"] + [directory / n / "corpus" for n in SET_MODEL_NAMES]:
        if (folder / "val_tokens.safetensors").is_file():
            if (folder / "tokenizer.json").is_file() and _sha(folder / "tokenizer.json") != tokenizer_sha:
                raise ModelSetError(f"{ENV}={directory}: the corpus in {folder} was tokenized with another tokenizer than "
                                    f"the set's models; remake the set with `{remake_command(directory)}`, {_UNSET}")
            return folder, False
    if (SHIPPED_CORPUS_DIR / "tokenizer.json").is_file() and _sha(SHIPPED_CORPUS_DIR / "tokenizer.json") == tokenizer_sha:
        return SHIPPED_CORPUS_DIR, True
    raise ModelSetError(f"{ENV}={directory}: the models read their own tokenizer but the set has no corpus folder "
                        f"(no {directory / 'corpus' / 'val_tokens.safetensors'}) with their validation text; "
                        f"make the set with `make train-mine CORPUS='...' OUT={directory}`, {_UNSET}")


def check(directory: Path | None = None) -> ModelSet | None:
    """Check the set ``directory`` (default: the one ``ATTNCIRCUITS_MODELS`` names) before any model is
    loaded; returns it, or None when the shipped models are in use. Raises :class:`ModelSetError`."""
    directory = current_dir() if directory is None else Path(os.path.abspath(directory))
    if directory is None:
        return None
    if not directory.is_dir():
        what = "is a file, not a folder" if directory.exists() else "does not exist"
        raise ModelSetError(f"{ENV}={directory} {what}; make a set there with `make replicate SEED=1` (into "
                            f"replicates/seed-1) or `make train-mine CORPUS='...' OUT={directory}`, {_UNSET}")
    if (directory / "config.json").is_file() and (directory / "model.safetensors").is_file():
        raise ModelSetError(f"{ENV}={directory} is one model's folder, not a set of three; point it at the folder that "
                            f"holds {', '.join(SET_MODEL_NAMES)}, {_UNSET}")
    for name in SET_MODEL_NAMES:
        _check_model(directory, name)
    shas = {name: tokenizer_sha(directory / name) for name in SET_MODEL_NAMES}
    if len(set(shas.values())) > 1:
        first = SET_MODEL_NAMES[0]
        odd = next(n for n in SET_MODEL_NAMES if shas[n] != shas[first])
        raise ModelSetError(f"{ENV}={directory}: {odd} reads another tokenizer than {first}, and the chapters compare "
                            f"the three on one text; retrain it with `{remake_command(directory, odd)}`, {_UNSET}")
    corpus, shipped = corpus_dir_of(directory, shas[SET_MODEL_NAMES[0]])
    return ModelSet(directory, corpus, shipped)


def model_dir(name: str) -> Path:
    """Where ``name`` is loaded from: the set's folder for the three attention-only models; for other
    models (chapter 10's), the set's when it has one, else the shipped one if the set reads the
    shipped tokenizer."""
    ms = check()
    if ms is None:
        return SHIPPED_DIR / name
    if name in SET_MODEL_NAMES or (ms.directory / name).is_dir():
        return ms.directory / name
    if not ms.shipped_corpus:
        raise ModelSetError(f"{ENV}={ms.directory} has no {name} and reads its own tokenizer, so the shipped {name} "
                            f"cannot read its text; train one with {_train_one(ms, name)}, {_UNSET}")
    return SHIPPED_DIR / name


def corpus_dir() -> Path:
    """The corpus folder of the models in use (see the module's docstring)."""
    ms = check()
    return SHIPPED_CORPUS_DIR if ms is None else ms.corpus_dir


def check_model_set() -> str:
    """Check the models the chapters will read and say which in one line (a chapter's first cell
    calls it); raises :class:`ModelSetError` naming what is missing and the
    command that makes it."""
    ms = check()
    if ms is None:
        return "models: the shipped ones"
    corpus = "the shipped corpus" if ms.shipped_corpus else f"the corpus in {ms.corpus_dir}"
    return f"models: the set in {ms.directory} ({ENV}), on {corpus}"


@contextlib.contextmanager
def shipped_models():
    """Inside the block the shipped models and corpus are read, whatever ``ATTNCIRCUITS_MODELS``
    names (the exercise checks judge a learner's function on the inputs their messages name)."""
    saved = os.environ.pop(ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[ENV] = saved


def use_shipped_unless_set_has(name: str) -> str:
    """For a chapter built on ``name`` (chapter 10's ``ln-mlp-4l``): when the set in use reads its own
    tokenizer and has no ``name``, which could not read the set's text, the chapter runs on the
    shipped models instead (``ATTNCIRCUITS_MODELS`` is unset for this process) and the line returned
    says so; otherwise nothing changes and it returns ""."""
    ms = check()
    if ms is None or ms.shipped_corpus or (ms.directory / name).is_dir():
        return ""
    os.environ.pop(ENV, None)
    return (f"models: the shipped ones; the set in {ms.directory} reads its own tokenizer and has no {name}, "
            f"which reads the shipped text (train one there with {_train_one(ms, name)})")


def _train_one(ms: ModelSet, name: str) -> str:
    """The command that trains ``name`` into the set ``ms``, as the messages quote it."""
    return f"`python -m attncircuits.train --preset {name} --corpus-files ... --out {ms.directory / name}`"
