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
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file, save_file

from .data import load_tokenizer
from .model import AttnOnlyConfig, AttnOnlyTransformer

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
CORPUS_DIR = PRETRAINED_DIR / "corpus"
MODEL_NAMES = ("attn-only-0l", "attn-only-1l", "attn-only-2l")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {p.relative_to(directory).as_posix(): sha256(p) for p in files}
    (directory / "manifest.json").write_text(json.dumps({"sha256": manifest}, indent=1) + "\n")


def verify_manifest(directory: Path) -> None:
    """Raise if any file listed in ``manifest.json`` is missing or its hash differs."""
    mpath = directory / "manifest.json"
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} is missing; the checkpoint cannot be verified. Re-save it or restore it from git")
    for rel, digest in json.loads(mpath.read_text())["sha256"].items():
        p = directory / rel
        if not p.is_file():
            raise FileNotFoundError(f"{p} is listed in the manifest but missing; restore it from git or retrain")
        if sha256(p) != digest:
            raise ValueError(
                f"{p} does not match its SHA-256 in {mpath} (corrupt or edited file); restore it with "
                f"`git checkout -- {p}` or retrain with `make train`"
            )


def state_dict_for_save(model: AttnOnlyTransformer, dtype=torch.float16) -> dict:
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}


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
    """Write a checkpoint directory atomically: into ``<dir>.partial`` first, then renamed."""
    directory = Path(directory)
    if (directory / "model.safetensors").exists() and not overwrite:
        raise FileExistsError(f"{directory} already holds a model; pass overwrite=True (CLI: --overwrite) to replace it")
    tmp = directory.with_name(directory.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "snapshots").mkdir(parents=True)
    save_file(state_dict_for_save(model, dtype), tmp / "model.safetensors")
    (tmp / "config.json").write_text(json.dumps({"model": model.cfg.to_dict(), **(meta or {})}, indent=1) + "\n")
    shutil.copy(tokenizer_path, tmp / "tokenizer.json")
    if history is not None:
        (tmp / "history.json").write_text(json.dumps(history) + "\n")
    for step, sd in sorted((snapshots or {}).items()):
        save_file(sd, tmp / "snapshots" / f"step_{step:06d}.safetensors")
    if not snapshots:
        (tmp / "snapshots").rmdir()
    write_manifest(tmp)
    if directory.exists():
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

    @property
    def snapshot_steps(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in (self.directory / "snapshots").glob("step_*.safetensors"))

    def load_snapshot(self, step: int) -> AttnOnlyTransformer:
        """The model as it was at training step ``step`` (see ``snapshot_steps``)."""
        path = self.directory / "snapshots" / f"step_{step:06d}.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"no snapshot at step {step}; available steps: {self.snapshot_steps}")
        return _build(self.model.cfg, path, self.model.W_E.device)


def _build(cfg: AttnOnlyConfig, weights: Path, device) -> AttnOnlyTransformer:
    try:
        sd = load_file(weights)
    except Exception as err:
        raise ValueError(f"{weights} is not a readable safetensors file ({err}); restore it from git or retrain") from err
    model = AttnOnlyTransformer(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in sd.items()}
    if expected != got:
        diff = {k: (expected.get(k), got.get(k)) for k in set(expected) | set(got) if expected.get(k) != got.get(k)}
        raise ValueError(f"config and weights in {weights.parent} disagree (name: (config shape, file shape)): {diff}")
    model.load_state_dict({k: v.float() for k, v in sd.items()})
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
    config = json.loads(cfg_path.read_text())
    model = _build(AttnOnlyConfig.from_dict(config["model"]), directory / "model.safetensors", device)
    tokenizer = load_tokenizer(directory / "tokenizer.json")
    if tokenizer.get_vocab_size() != model.cfg.d_vocab:
        raise ValueError(f"tokenizer has {tokenizer.get_vocab_size()} tokens but the model d_vocab={model.cfg.d_vocab}")
    hist_path = directory / "history.json"
    history = json.loads(hist_path.read_text()) if hist_path.is_file() else None
    return Checkpoint(model, tokenizer, config, history, directory)


def load_pretrained(name: str, device: str | torch.device = "cpu") -> Checkpoint:
    """Load a shipped model: ``attn-only-0l``, ``attn-only-1l`` or ``attn-only-2l``."""
    if name not in MODEL_NAMES:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")
    directory = PRETRAINED_DIR / name
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is missing; train the shipped models with `make train`")
    return load_checkpoint(directory, device)


# ---- shipped corpus files ----------------------------------------------------------------------
def save_corpus_files(val_tokens: np.ndarray, train_tokens: np.ndarray, info: dict) -> None:
    """Ship the tokenized validation split and the training split's bigram counts (sparse), beside
    the tokenizer already saved in ``CORPUS_DIR``; the manifest covers all of them."""
    CORPUS_DIR.mkdir(parents=True, exist_ok=True)
    np_save_file({"tokens": val_tokens.astype(np.uint16)}, CORPUS_DIR / "val_tokens.safetensors")
    pairs = train_tokens[:-1].astype(np.int64) * 65536 + train_tokens[1:].astype(np.int64)
    uniq, counts = np.unique(pairs, return_counts=True)
    np_save_file(
        {"prev": (uniq // 65536).astype(np.uint16), "next": (uniq % 65536).astype(np.uint16), "count": counts.astype(np.uint32)},
        CORPUS_DIR / "train_bigrams.safetensors",
    )
    (CORPUS_DIR / "corpus.json").write_text(json.dumps(info, indent=1) + "\n")
    write_manifest(CORPUS_DIR)


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


def corpus_info() -> dict:
    return json.loads((CORPUS_DIR / "corpus.json").read_text())
