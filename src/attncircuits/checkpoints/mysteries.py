"""Chapter 12's mystery models: where they are shipped, how they are written and loaded.

A mystery is an ordinary checkpoint folder (:func:`~attncircuits.checkpoints.pretrained.save_checkpoint`,
loaded with its manifest checked by :func:`~attncircuits.checkpoints.pretrained.load_checkpoint`)
under ``checkpoints/shipped/mysteries/NAME/``. Its tokenizer is a word-level one over the task's
token names (``BOS``, ``cue0``, ``t17``, ...), so tables print names, not ids; its config.json holds
the task (:mod:`attncircuits.data.tasks`), and ``ground_truth.json`` what was measured after
training (:func:`attncircuits.analysis.circuit_check.measure_ground_truth`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attncircuits.checkpoints.pretrained import PRETRAINED_DIR, Checkpoint, load_checkpoint, save_checkpoint
from attncircuits.checkpoints.settle import resolve_partial as resolve_checkpoint_partial
from attncircuits.core import durable
from attncircuits.data.tasks import task_from_dict

MYSTERY_DIR = PRETRAINED_DIR / "mysteries"
TRAIN_COMMAND = "python -m attncircuits.train.mystery"
TRUTH = "ground_truth.json"


def write_task_tokenizer(task, path: Path) -> Path:
    """A word-level tokenizer whose tokens are the task's token names, written to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {name: i for i, name in enumerate(task.token_names())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="BOS"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def save_mystery(model, name: str, tokenizer_path: Path, meta: dict, history: dict, truth: dict,
                 out_root: Path | None = None) -> Path:
    """Write mystery ``name`` (weights, config with its task, history, ground truth) in one swap:
    the ground truth is a file of the checkpoint, so a kill at any moment leaves the old mystery
    whole or the new one whole (a leftover ``NAME.partial``: :func:`resolve_partial`)."""
    root = Path(out_root) if out_root is not None else MYSTERY_DIR
    root.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(model, root / name, tokenizer_path, meta=meta, history=history, overwrite=True,
                           files={TRUTH: json.dumps(truth, indent=1) + "\n"})


def resolve_partial(name: str, root: Path | None = None) -> str | None:
    """Settle what a killed save of mystery ``name`` left (see
    :func:`~attncircuits.checkpoints.pretrained.resolve_partial`): a finished mystery, with its
    ground truth, is never lost. One line saying what was done, or None."""
    root = Path(root) if root is not None else MYSTERY_DIR
    return resolve_checkpoint_partial(root / name, needs=(TRUTH,))


def read_ground_truth(folder: Path) -> dict:
    """The ground truth of the mystery in ``folder``: what was measured after training. Read anew
    at each use, so that an exercise can withhold it while a learner's function runs (chapter 12's
    hypotheses are graded against the model, never against this answer)."""
    return json.loads(_truth_path(folder).read_text())


def _truth_path(folder: Path) -> Path:
    path = Path(folder) / TRUTH
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; retrain with `{TRAIN_COMMAND} {Path(folder).name}`")
    return path


@dataclass
class Mystery:
    """A loaded mystery: its name, model, tokenizer, task and (:attr:`ground_truth`) measured
    ground truth."""

    name: str
    checkpoint: Checkpoint
    task: object
    folder: Path

    @property
    def ground_truth(self) -> dict:
        return read_ground_truth(self.folder)

    @property
    def model(self):
        return self.checkpoint.model

    @property
    def tokenizer(self):
        return self.checkpoint.tokenizer


def mystery_names(root: Path | None = None) -> list[str]:
    root = Path(root) if root is not None else MYSTERY_DIR
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []


def load_mystery(name: str, root: Path | None = None) -> Mystery:
    """Load a shipped mystery (offline; its files checked against its manifest)."""
    folder = Path(root) if root is not None else MYSTERY_DIR
    for path in (folder, folder / name) if isinstance(name, str) else (folder,):
        if durable.link_loop(path):
            raise FileNotFoundError(f"{path} is a symbolic link that does not resolve (a loop); point it at a "
                                    "folder of mysteries or remove it")
    names = mystery_names(root)
    if name not in names:
        raise KeyError(f"unknown mystery {name!r}; the mysteries are {', '.join(names) or 'none (train them with `' + TRAIN_COMMAND + '`)'}")
    directory = (Path(root) if root is not None else MYSTERY_DIR) / name
    ck = load_checkpoint(directory)
    _truth_path(directory)  # missing: said now, not at first use
    return Mystery(name, ck, task_from_dict(ck.config["task"]), directory)
