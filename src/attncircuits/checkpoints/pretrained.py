"""Checkpoints: save and load models as safetensors + JSON, verified by a SHA-256 manifest.

A checkpoint is a directory::

    model.safetensors   weights (never pickle)
    config.json         the ModelConfig, plus how the model was trained
    tokenizer.json      the BPE tokenizer the model reads
    history.json        training log (losses and head scores over steps)
    snapshots/          optional weights at chosen training steps
    manifest.json       SHA-256 of every file above

The shipped models live in ``attncircuits/checkpoints/shipped/<name>/`` (``load_pretrained(name)``);
the shared corpus files (tokenized validation split, training-split bigram counts) in ``shipped/corpus/``,
so the numbers the book asserts do not depend on the reader's Python version.
``ATTNCIRCUITS_MODELS=DIR`` points all of it at another set of models (another seed's, or trained on
the learner's own text) and its corpus (:mod:`~attncircuits.checkpoints.modelset`, checked first).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file as np_load_file

from attncircuits.checkpoints import modelset
from attncircuits.checkpoints.weights_file import expected_shapes, read_weights
from attncircuits.core import devices, durable, validate
from attncircuits.core.manifest import read_manifest, save_weights, sha256, verify_file, verify_manifest, write_manifest
from attncircuits.data import load_tokenizer
from attncircuits.models import hooked
from attncircuits.models.transformer import Transformer

PRETRAINED_DIR = modelset.SHIPPED_DIR
CORPUS_DIR = PRETRAINED_DIR / "corpus"
MODEL_NAMES = ("attn-only-0l", "attn-only-1l", "attn-only-2l")
#: chapter 10's model: LayerNorm, MLPs and biases, a member of the family (models.hooked)
DEEPER_MODEL_NAMES = ("ln-mlp-4l",)


def is_checkpoint_dir(directory: Path) -> bool:
    """Whether ``directory`` is a model folder this package wrote: a readable manifest that lists
    its weights and config, every file in the folder listed there, and no other folder in it (an
    empty folder of the user's included)."""
    try:
        entries = read_manifest(directory)
    except (OSError, ValueError):
        return False
    found = list(directory.rglob("*"))
    # every manifest.json is left out, as write_manifest leaves it out (a corpus/ subfolder has its own)
    files = {p.relative_to(directory).as_posix() for p in found
             if p.is_file() and not p.is_symlink() and p.name != "manifest.json"}
    folders = {p.relative_to(directory).as_posix() for p in found if p.is_dir() or p.is_symlink()}
    listed_folders = {"/".join(rel.split("/")[:i]) for rel in entries for i in range(1, rel.count("/") + 1)}
    others = [p for p in found if not (p.is_file() or p.is_dir()) or p.is_symlink()]
    return ({"model.safetensors", "config.json"} <= set(entries) and files <= set(entries)
            and folders <= listed_folders and not others)


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


def state_dict_for_save(model: Transformer, dtype=torch.float16) -> dict:
    """What a checkpoint stores: the model's state, or for chapter 10's model its parameters (its
    causal-mask buffers are rebuilt from the config)."""
    sd = model.weights()
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in sd.items()}


def write_checkpoint_files(
    directory: Path,
    state_dict: dict,
    config: dict,
    tokenizer_path: str | Path,
    history: dict | None = None,
    snapshots: dict[int, dict] | None = None,
    folders: dict[str, Path] | None = None,
    files: dict[str, str] | None = None,
) -> None:
    """Write a checkpoint's files into the empty folder ``directory`` and make them durable.

    Any model class: ``state_dict`` (tensors, stored as given) and ``config`` (JSON; the SHA-256 of
    the tokenizer is added, so loading can tell that the tokenizer belongs to these weights).
    ``folders`` (name -> folder) are copied in too (e.g. the corpus files a run prepared), and
    ``files`` (name -> text) written (e.g. a mystery's ground truth): all of them are in the
    manifest, and so in the one swap that puts the checkpoint in place."""
    directory.mkdir(exist_ok=True)
    save_weights(state_dict, directory / "model.safetensors")
    shutil.copyfile(tokenizer_path, directory / "tokenizer.json")
    config = {**config, "tokenizer_sha256": sha256(directory / "tokenizer.json")}
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if history is not None:
        (directory / "history.json").write_text(json.dumps(history) + "\n")
    if snapshots:
        (directory / "snapshots").mkdir()
        for step, sd in sorted(snapshots.items()):
            save_weights(sd, directory / "snapshots" / f"step_{step:06d}.safetensors")
    for name, src in (folders or {}).items():
        shutil.copytree(src, directory / name)
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    write_manifest(directory)
    durable.fsync_tree(directory)


def save_checkpoint(
    model: Transformer,
    directory: str | Path,
    tokenizer_path: str | Path,
    meta: dict | None = None,
    history: dict | None = None,
    snapshots: dict[int, dict] | None = None,
    overwrite: bool = False,
    dtype=torch.float16,
    files: dict[str, str] | None = None,
) -> Path:
    """Write a checkpoint directory atomically: into ``<dir>.partial`` first, then renamed.

    Only a folder this package wrote (see :func:`is_checkpoint_dir`) is ever replaced, and only
    with ``overwrite``; the old one is removed only once the new one is in its place. ``files``
    (name -> text) are part of the checkpoint (see :func:`write_checkpoint_files`). A save killed
    half-way leaves ``<dir>.partial``: :func:`attncircuits.checkpoints.settle.resolve_partial` puts
    the right model back in place.
    """
    directory = Path(directory)
    check_replaceable(directory, overwrite)
    tmp = partial_dir(directory)
    if tmp.exists() or tmp.is_symlink():
        raise FileExistsError(f"{tmp} exists (another save or training run into {directory.name}); "
                              "move it away and save again")
    tmp.mkdir()
    try:
        write_checkpoint_files(tmp / "final", state_dict_for_save(model, dtype), {"model": model.course_config().to_dict(), **(meta or {})},
                               tokenizer_path, history, snapshots, files=files)
        with durable.hold_signals():
            swap_into(directory, tmp / "final", tmp / "old", lambda: check_replaceable(directory, overwrite))
    finally:
        if directory.exists() or not (tmp / "old").exists():  # never remove the only copy of the old model
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def swap_into(target: Path, new: Path, aside: Path, still_replaceable=lambda: None, between=lambda: None) -> None:
    """Put the folder ``new`` at ``target`` by renames: an existing ``target`` (checked by
    ``still_replaceable`` first) is moved to ``aside``, ``new`` renamed in its place, each step
    durable (``between`` runs between the two). Should the second rename fail, the old folder goes
    back."""
    if target.exists() or target.is_symlink():
        still_replaceable()
        target.rename(aside)
        durable.fsync_dir(target.parent)
        durable.fsync_dir(aside.parent)
    try:
        between()
        new.rename(target)
    except BaseException:
        if aside.exists() and not target.exists():
            aside.rename(target)
        raise
    durable.fsync_dir(target.parent)


@dataclass
class Checkpoint:
    model: Transformer
    tokenizer: object
    config: dict
    history: dict | None
    directory: Path
    verified: bool = True  # files are checked against the manifest before use

    @property
    def snapshot_steps(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in (self.directory / "snapshots").glob("step_*.safetensors"))

    def load_snapshot(self, step: int) -> Transformer:
        """The model as it was at training step ``step`` (see ``snapshot_steps``)."""
        rel = f"snapshots/step_{step:06d}.safetensors"
        if not (self.directory / rel).is_file():
            raise FileNotFoundError(f"no snapshot at step {step}; available steps: {self.snapshot_steps}")
        path = verify_file(self.directory, rel) if self.verified else self.directory / rel
        return _build(self.model.course_config(), path, self.model.W_E.device, hooked.is_legacy(self.config["model"]))


def _build(cfg, weights: Path, device, legacy: bool = False):
    expected = expected_shapes(cfg)
    if legacy:  # chapter 10's checkpoint: TransformerLens 3.x's names, the same tensors
        names = hooked.legacy_names(cfg)
        sd = read_weights(weights, {names[k]: shape for k, shape in expected.items()})
        sd = {ours: sd[theirs] for ours, theirs in names.items() if theirs in sd}
    else:
        sd = read_weights(weights, expected)
    model = cfg.build()
    model.load_weights({k: v.float() for k, v in sd.items()})
    return model.to(device).eval()


def check_device(device) -> torch.device:
    """``device`` as a torch.device this machine has, or a one-line error naming the ones it has."""
    return devices.check(device)


def load_checkpoint(directory: str | Path, device: str | torch.device = "cpu", verify: bool = True) -> Checkpoint:
    """Load any checkpoint directory written by :func:`save_checkpoint` (hashes checked first)."""
    directory = validate.path(directory, "directory")
    device = check_device(device)
    try:
        exists = directory.is_dir()
    except OSError as err:  # e.g. a name too long for the file system
        raise FileNotFoundError(f"checkpoint directory {str(directory)[:80]!r} cannot be read ({err.strerror})") from None
    if not exists and durable.link_loop(directory):
        raise FileNotFoundError(f"checkpoint directory {directory} is a symbolic link that does not resolve (a loop); "
                                "point it at a model folder or remove it")
    if not exists:
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
    tok_path = directory / "tokenizer.json"
    if "tokenizer_sha256" in config and tok_path.is_file() and sha256(tok_path) != config["tokenizer_sha256"]:
        raise ValueError(f"{tok_path} is not the tokenizer these weights were trained with (its SHA-256 differs from "
                         f"the one in {cfg_path}); restore the folder from git or retrain")
    model = _build(model_cfg, directory / "model.safetensors", device, hooked.is_legacy(config["model"]))
    tokenizer = load_tokenizer(tok_path)
    if tokenizer.get_vocab_size() != model.cfg.d_vocab:
        raise ValueError(f"tokenizer has {tokenizer.get_vocab_size()} tokens but the model d_vocab={model.cfg.d_vocab}")
    hist_path = directory / "history.json"
    history = json.loads(hist_path.read_text()) if hist_path.is_file() else None
    return Checkpoint(model, tokenizer, config, history, directory, verified=verify)


def load_pretrained(name: str, device: str | torch.device = "cpu") -> Checkpoint:
    """Load a course model: ``attn-only-0l``, ``attn-only-1l``, ``attn-only-2l`` or chapter 10's
    ``ln-mlp-4l``; the shipped one, or the set's when ``ATTNCIRCUITS_MODELS`` names a set (checked
    first: a set the chapters cannot read raises :class:`~attncircuits.checkpoints.modelset.ModelSetError`)."""
    if not isinstance(name, str) or name not in MODEL_NAMES + DEEPER_MODEL_NAMES:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES + DEEPER_MODEL_NAMES)}")
    directory = modelset.model_dir(name)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is missing; train the shipped models with `make train`")
    ck = load_checkpoint(directory, device)
    if directory.parent == PRETRAINED_DIR and "tokenizer_sha256" not in ck.config:  # every shipped model names it
        raise ValueError(f"{directory / 'config.json'} does not name its tokenizer's SHA-256; restore the folder with "
                         f"`git checkout -- {directory}`")
    return ck


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


def load_validation_tokens(directory: Path | None = None) -> torch.Tensor:
    """The validation split of the models in use (the shipped corpus, or a set's: see
    :func:`corpus_dir`; ``directory``: another corpus folder) as one token stream (documents
    separated by EOT)."""
    directory = corpus_dir() if directory is None else Path(directory)
    verify_manifest(directory)
    return torch.from_numpy(np_load_file(directory / "val_tokens.safetensors")["tokens"].astype(np.int64))


def validation_windows(n_windows: int | None = None, n_ctx: int = 128, directory: Path | None = None) -> torch.Tensor:
    """The validation split cut into disjoint ``[n_windows, n_ctx]`` windows; with ``n_windows``,
    that many spread evenly over the split (so every part of the split is represented)."""
    tokens = load_validation_tokens(directory)
    windows = tokens[: len(tokens) // n_ctx * n_ctx].view(-1, n_ctx)
    if n_windows is None:
        return windows
    if not 1 <= n_windows <= len(windows):
        raise ValueError(f"n_windows must be between 1 and {len(windows)} for n_ctx={n_ctx}, got {n_windows}")
    return windows[torch.linspace(0, len(windows) - 1, n_windows).long()]


def load_train_bigram_counts(directory: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training split's bigram counts (of the models in use) as sparse (prev, next, count) arrays."""
    directory = corpus_dir() if directory is None else Path(directory)
    verify_manifest(directory)
    d = np_load_file(directory / "train_bigrams.safetensors")
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
    return json.loads((corpus_dir() / "corpus.json").read_text())


def corpus_dir() -> Path:
    """The corpus folder of the models in use: ``CORPUS_DIR`` for the shipped models, else the set's
    (its own ``corpus/``, or the shipped one when it reads the shipped tokenizer)."""
    return modelset.corpus_dir()
