"""Checkpoints: save and load models as safetensors + JSON, verified by a SHA-256 manifest.

A checkpoint is a directory::

    model.safetensors   weights (never pickle)
    config.json         the AttnOnlyConfig, plus how the model was trained
    tokenizer.json      the BPE tokenizer the model reads
    history.json        training log (losses and head scores over steps)
    snapshots/          optional weights at chosen training steps
    manifest.json       SHA-256 of every file above

The shipped models live in ``attncircuits/pretrained/<name>/``; ``load_pretrained(name)`` loads one.
The shared corpus files (tokenized validation split, training-split bigram counts) live in
``attncircuits/pretrained/corpus/`` so that the numbers the book asserts do not depend on the
reader's Python version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file, save_file

from . import hooked, validate
from .data import load_tokenizer
from .model import AttnOnlyConfig, AttnOnlyTransformer

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
CORPUS_DIR = PRETRAINED_DIR / "corpus"
MODEL_NAMES = ("attn-only-0l", "attn-only-1l", "attn-only-2l")
#: chapter 10's model: LayerNorm and MLPs, a TransformerLens HookedTransformer (the ``tl`` extra)
DEEPER_MODEL_NAMES = ("ln-mlp-4l",)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_weights(tensors: dict, path: Path) -> None:
    """safetensors file with the usual file mode (safetensors itself writes 0600)."""
    (np_save_file if tensors and isinstance(next(iter(tensors.values())), np.ndarray) else save_file)(tensors, path)
    path.chmod(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_manifest(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {p.relative_to(directory).as_posix(): sha256(p) for p in files}
    (directory / "manifest.json").write_text(json.dumps({"sha256": manifest}, indent=1) + "\n")


def read_manifest(directory: Path) -> dict[str, str]:
    """The ``{relative path: SHA-256}`` entries of ``directory/manifest.json``, refused when it is
    missing, unreadable, empty, or leaves a weight file (``*.safetensors``) of the folder out."""
    mpath = directory / "manifest.json"
    fix = f"restore the folder from git (`git checkout -- {directory}`) or retrain it"
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} is missing, so the checkpoint cannot be verified; {fix}")
    try:
        entries = json.loads(mpath.read_text(encoding="utf-8"))["sha256"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{mpath} is corrupt (not a JSON object with a 'sha256' table: {err!r}); {fix}") from None
    if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
        raise ValueError(f"{mpath} is corrupt (its 'sha256' table must map file names to hashes); {fix}")
    if not entries:
        raise ValueError(f"{mpath} lists no files, so nothing in {directory} can be verified; {fix}")
    unlisted = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*.safetensors"))
    unlisted = [rel for rel in unlisted if rel not in entries]
    if unlisted:
        raise ValueError(f"{directory / unlisted[0]} is not listed in {mpath}, so it cannot be verified; "
                         f"remove it, or {fix}")
    return entries


def verify_file(directory: Path, rel: str, entries: dict[str, str] | None = None) -> Path:
    """Check one file of ``directory`` against its manifest entry; returns its path."""
    entries = read_manifest(directory) if entries is None else entries
    p = directory / rel
    if rel not in entries:
        raise ValueError(f"{p} is not listed in {directory / 'manifest.json'}, so it cannot be verified; "
                         "remove it, or restore the folder from git or retrain it")
    if not p.is_file():
        raise FileNotFoundError(f"{p} is listed in the manifest but missing; restore it from git or retrain")
    if sha256(p) != entries[rel]:
        raise ValueError(
            f"{p} does not match its SHA-256 in {directory / 'manifest.json'} (corrupt or edited file); "
            f"restore it with `git checkout -- {p}` or retrain with `make train`"
        )
    return p


def verify_manifest(directory: Path) -> None:
    """Raise if the manifest is unusable, leaves out a weight file, or a listed file is missing or
    differs from its hash."""
    entries = read_manifest(directory)
    for rel in entries:
        verify_file(directory, rel, entries)


def is_checkpoint_dir(directory: Path) -> bool:
    """Whether ``directory`` is a model folder this package wrote: a readable manifest that lists
    its weights and config, and every file in the folder listed there."""
    try:
        entries = read_manifest(directory)
    except (OSError, ValueError):
        return False
    files = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {"manifest.json"}
    return {"model.safetensors", "config.json"} <= set(entries) and files <= set(entries)


def check_replaceable(directory: Path, overwrite: bool) -> None:
    """Refuse, before any work, to write ``directory`` where that would delete what this package
    did not write: an existing file, a folder of the user's, a model without ``overwrite``."""
    if directory.is_file() or (directory.exists() and not directory.is_dir()):
        raise FileExistsError(f"{directory} is a file, not a model folder; choose another output folder")
    if not directory.exists():
        return
    if not is_checkpoint_dir(directory):
        kind = "an empty folder" if not any(directory.iterdir()) else "a folder with files this program did not write"
        raise FileExistsError(f"{directory} is {kind}, not a model folder; choose a new output folder "
                              "(nothing there is deleted or overwritten)")
    if not overwrite:
        raise FileExistsError(f"{directory} already holds a model; pass overwrite=True (CLI: --overwrite) to "
                              "replace it or choose another output folder")


#: a training run's staging folder ``<out>.partial`` holds this file from its first moment on
PARTIAL_MARKER = "in-progress.json"
#: subfolder of ``<out>.partial`` with what ``--resume`` needs (weights, optimizer, RNG, history)
RESUME_SUBDIR = "resume"


def partial_dir(directory: Path) -> Path:
    return directory.with_name(directory.name + ".partial")


def state_dict_for_save(model: AttnOnlyTransformer, dtype=torch.float16) -> dict:
    """What a checkpoint stores: the model's state, or for chapter 10's model its parameters (its
    causal-mask buffers are rebuilt from the config)."""
    sd = model.state_dict() if isinstance(model, AttnOnlyTransformer) else hooked.weights(model)
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in sd.items()}


def save_checkpoint(
    model: AttnOnlyTransformer,
    directory: str | Path,
    tokenizer_path: str | Path,
    meta: dict | None = None,
    history: dict | None = None,
    snapshots: dict[int, dict] | None = None,
    overwrite: bool = False,
    dtype=torch.float16,
) -> Path:
    """Write a checkpoint directory atomically: into ``<dir>.partial`` first, then renamed.

    Only a folder this package wrote (see :func:`is_checkpoint_dir`) is ever replaced, and only
    with ``overwrite``. A ``<dir>.partial`` left by a training run (it holds ``PARTIAL_MARKER``)
    is completed in place, so its tokenizer, corpus files and snapshots become part of the model.
    """
    directory = Path(directory)
    check_replaceable(directory, overwrite)
    tmp = partial_dir(directory)
    fresh = not tmp.exists()
    if fresh:
        tmp.mkdir()
    elif not (tmp / PARTIAL_MARKER).is_file():
        raise FileExistsError(f"{tmp} exists and was not written by this program; move it away and save again")
    try:
        (tmp / "snapshots").mkdir(exist_ok=True)
        save_weights(state_dict_for_save(model, dtype), tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps({"model": hooked.config_of(model).to_dict(), **(meta or {})}, indent=1) + "\n")
        if Path(tokenizer_path).resolve() != (tmp / "tokenizer.json").resolve():
            shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        if history is not None:
            (tmp / "history.json").write_text(json.dumps(history) + "\n")
        for step, sd in sorted((snapshots or {}).items()):
            save_weights(sd, tmp / "snapshots" / f"step_{step:06d}.safetensors")
        if not any((tmp / "snapshots").iterdir()):
            (tmp / "snapshots").rmdir()
        shutil.rmtree(tmp / RESUME_SUBDIR, ignore_errors=True)
        (tmp / PARTIAL_MARKER).unlink(missing_ok=True)
        write_manifest(tmp)
    except BaseException:
        if fresh:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if directory.exists():
        check_replaceable(directory, overwrite)  # still ours: nothing else was put there meanwhile
        shutil.rmtree(directory)
    tmp.rename(directory)
    return directory


@dataclass
class Checkpoint:
    model: AttnOnlyTransformer
    tokenizer: object
    config: dict
    history: dict | None
    directory: Path
    verified: bool = True  # files are checked against the manifest before use

    @property
    def snapshot_steps(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in (self.directory / "snapshots").glob("step_*.safetensors"))

    def load_snapshot(self, step: int) -> AttnOnlyTransformer:
        """The model as it was at training step ``step`` (see ``snapshot_steps``)."""
        rel = f"snapshots/step_{step:06d}.safetensors"
        if not (self.directory / rel).is_file():
            raise FileNotFoundError(f"no snapshot at step {step}; available steps: {self.snapshot_steps}")
        path = verify_file(self.directory, rel) if self.verified else self.directory / rel
        return _build(hooked.config_of(self.model), path, self.model.W_E.device)


def _build(cfg: AttnOnlyConfig, weights: Path, device) -> AttnOnlyTransformer:
    try:
        sd = load_file(weights)
    except Exception as err:
        raise ValueError(f"{weights} is not a readable safetensors file ({err}); restore it from git or retrain") from err
    model = hooked.build_model(cfg)
    expected = {k: tuple(v.shape) for k, v in state_dict_for_save(model).items()}
    got = {k: tuple(v.shape) for k, v in sd.items()}
    if expected != got:
        diff = {k: (expected.get(k), got.get(k)) for k in set(expected) | set(got) if expected.get(k) != got.get(k)}
        raise ValueError(f"config and weights in {weights.parent} disagree (name: (config shape, file shape)): {diff}")
    bad = [k for k, v in sd.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{weights} holds NaN or infinite weights ({', '.join(bad)}); restore it from git or retrain")
    model.load_state_dict({**model.state_dict(), **{k: v.float() for k, v in sd.items()}})
    return model.to(device).eval()


def load_checkpoint(directory: str | Path, device: str | torch.device = "cpu", verify: bool = True) -> Checkpoint:
    """Load any checkpoint directory written by :func:`save_checkpoint` (hashes checked first)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} not found; train one with `python -m attncircuits.train`")
    if verify:
        verify_manifest(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} is missing; restore it from git or retrain")
    try:
        config = json.loads(cfg_path.read_text())
        model_cfg = hooked.model_config(config["model"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{cfg_path} is corrupt ({err!r}); restore it from git or retrain") from None
    model = _build(model_cfg, directory / "model.safetensors", device)
    tokenizer = load_tokenizer(directory / "tokenizer.json")
    if tokenizer.get_vocab_size() != model.cfg.d_vocab:
        raise ValueError(f"tokenizer has {tokenizer.get_vocab_size()} tokens but the model d_vocab={model.cfg.d_vocab}")
    hist_path = directory / "history.json"
    history = json.loads(hist_path.read_text()) if hist_path.is_file() else None
    return Checkpoint(model, tokenizer, config, history, directory, verified=verify)


def load_pretrained(name: str, device: str | torch.device = "cpu") -> Checkpoint:
    """Load a shipped model: ``attn-only-0l``, ``attn-only-1l``, ``attn-only-2l`` or chapter 10's ``ln-mlp-4l``."""
    if name not in MODEL_NAMES + DEEPER_MODEL_NAMES:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES + DEEPER_MODEL_NAMES)}")
    directory = PRETRAINED_DIR / name
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is missing; train the shipped models with `make train`")
    return load_checkpoint(directory, device)


# ---- shipped corpus files ----------------------------------------------------------------------
def save_corpus_files(val_tokens: np.ndarray, train_tokens: np.ndarray, info: dict, directory: Path = CORPUS_DIR) -> None:
    """Ship the tokenized validation split and the training split's bigram counts (sparse), beside
    the tokenizer already saved in ``directory``; the manifest covers all of them."""
    directory.mkdir(parents=True, exist_ok=True)
    save_weights({"tokens": val_tokens.astype(np.uint16)}, directory / "val_tokens.safetensors")
    pairs = train_tokens[:-1].astype(np.int64) * 65536 + train_tokens[1:].astype(np.int64)
    uniq, counts = np.unique(pairs, return_counts=True)
    save_weights(
        {"prev": (uniq // 65536).astype(np.uint16), "next": (uniq % 65536).astype(np.uint16), "count": counts.astype(np.uint32)},
        directory / "train_bigrams.safetensors",
    )
    (directory / "corpus.json").write_text(json.dumps(info, indent=1) + "\n")
    write_manifest(directory)


def load_validation_tokens() -> torch.Tensor:
    """The shipped validation split as one token stream (documents separated by EOT)."""
    verify_manifest(CORPUS_DIR)
    return torch.from_numpy(np_load_file(CORPUS_DIR / "val_tokens.safetensors")["tokens"].astype(np.int64))


def validation_windows(n_windows: int | None = None, n_ctx: int = 128) -> torch.Tensor:
    """The validation split cut into disjoint ``[n_windows, n_ctx]`` windows; with ``n_windows``,
    that many spread evenly over the split (so every part of the split is represented)."""
    tokens = load_validation_tokens()
    windows = tokens[: len(tokens) // n_ctx * n_ctx].view(-1, n_ctx)
    if n_windows is None:
        return windows
    if not 1 <= n_windows <= len(windows):
        raise ValueError(f"n_windows must be between 1 and {len(windows)} for n_ctx={n_ctx}, got {n_windows}")
    return windows[torch.linspace(0, len(windows) - 1, n_windows).long()]


def load_train_bigram_counts() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training split's bigram counts as sparse (prev, next, count) arrays."""
    verify_manifest(CORPUS_DIR)
    d = np_load_file(CORPUS_DIR / "train_bigrams.safetensors")
    return tuple(torch.from_numpy(d[k].astype(np.int64)) for k in ("prev", "next", "count"))


def frequent_tokens(
    tokenizer, n: int, words_only: bool = True, min_chars: int = 2, spaced: bool = False
) -> torch.Tensor:
    """The ``n`` most frequent tokens of the training text, for readable heatmaps and tables.

    With ``words_only``, only tokens that are a word (letters, optionally after one leading space)
    of at least ``min_chars`` letters, e.g. ``·self`` or ``return``; with ``spaced`` too, only those
    with the leading space (whole words of running text, not pieces of longer ones). Counts come
    from the shipped training-split bigram counts.
    """
    n = validate.count(n, "n")
    prev, _, count = load_train_bigram_counts()
    V = tokenizer.get_vocab_size()
    freq = torch.zeros(V, dtype=torch.long).index_add_(0, prev, count)
    picked = []
    for t in freq.argsort(descending=True).tolist():
        text = tokenizer.decode([t])
        word = text.removeprefix(" ")
        if spaced and word == text:
            continue
        if not words_only or (word.isascii() and word.isalpha() and len(word) >= min_chars):
            picked.append(t)
        if len(picked) == n:
            break
    return torch.tensor(picked, dtype=torch.long)


def corpus_info() -> dict:
    return json.loads((CORPUS_DIR / "corpus.json").read_text())
