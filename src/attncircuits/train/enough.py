"""Trained enough to test? What the chapters will test, checked on a finished set of models.

``make train-mine`` ends with :func:`set_checks`: a set whose models are not trained enough would
make the chapters' claims fail for a reason that has nothing to do with circuits (a 2-layer model
still learning looks like "the second layer does not help"). Three things are checked, each on
the set's own validation text:

1. **each layer helps**: the 1-layer model's validation loss is below the 0-layer model's, and the
   2-layer model's below the 1-layer model's, each by more than :data:`NOISE` nats, the noise
   chapter 1 allows (its claim "the second layer's gain is more than noise (over 0.05 nats)"),
   measured as chapter 1 does, on 128 windows spread over the validation split;
2. **an induction head**: a layer-1 head of the 2-layer model with a prefix-matching score above
   :data:`INDUCTION` (the reproduces page's threshold);
3. **stopped falling**: the 2-layer model's validation loss (its training history) fell by less
   than :data:`STILL_FALLING` nats over the last tenth of its training.

The shipped models pass all three (``tests/test_mine.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from attncircuits.analysis.scores import prefix_matching_scores
from attncircuits.checkpoints.pretrained import load_checkpoint, validation_windows
from attncircuits.models.parts import loss_fn
from attncircuits.train.replicate import INDUCTION_THRESHOLD

#: chapter 1's noise: a layer's gain on validation below this is not a gain
NOISE = 0.05
#: a layer-1 head is an induction head above this prefix-matching score
INDUCTION = INDUCTION_THRESHOLD
#: the most the 2-layer model's validation loss may still fall over the last tenth of training
STILL_FALLING = 0.05
#: the windows chapter 1 measures the validation losses on
EVAL_WINDOWS = 128
NAMES = ("attn-only-0l", "attn-only-1l", "attn-only-2l")


@dataclass(frozen=True)
class Check:
    text: str
    held: bool
    measured: float

    def line(self) -> str:
        return f"{self.text} (measured: {self.measured:.3f})"


def last_tenth_fall(steps: list[int], val_loss: list[float]) -> float:
    """How much the validation loss fell over the last tenth of training: its value at 90% of the
    steps (interpolated between evaluations) less its last value."""
    if len(steps) < 2:
        return float("nan")
    return float(np.interp(0.9 * steps[-1], steps, val_loss) - val_loss[-1])


def evaluate(losses: dict[str, float], best_prefix_matching: float, fall: float) -> list[Check]:
    """The checks of the module's docstring from their measurements: ``losses`` per model name."""
    l0, l1, l2 = (losses[n] for n in NAMES)
    return [
        Check(f"the 1-layer model beats the 0-layer one by over {NOISE} nats", l0 - l1 > NOISE, l0 - l1),
        Check(f"the 2-layer model beats the 1-layer one by over {NOISE} nats", l1 - l2 > NOISE, l1 - l2),
        Check(f"the 2-layer model has an induction head, a prefix-matching score over {INDUCTION}",
              best_prefix_matching > INDUCTION, best_prefix_matching),
        Check(f"the 2-layer model's validation loss fell under {STILL_FALLING} nats over the last tenth of "
              "training", bool(fall < STILL_FALLING), fall),
    ]


@torch.no_grad()
def set_checks(models_dir: str | Path, corpus_dir: str | Path) -> list[Check]:
    """:func:`evaluate` on the set in ``models_dir`` with the validation text in ``corpus_dir``."""
    models_dir = Path(models_dir)
    cks = {name: load_checkpoint(models_dir / name) for name in NAMES}
    n_ctx = cks["attn-only-2l"].model.cfg.n_ctx
    n_windows = len(validation_windows(None, n_ctx, directory=Path(corpus_dir)))
    windows = validation_windows(min(EVAL_WINDOWS, n_windows), n_ctx, directory=Path(corpus_dir))
    losses = {name: loss_fn(ck.model(windows), windows).item() for name, ck in cks.items()}
    two = cks["attn-only-2l"]
    best = float(prefix_matching_scores(two.model)[-1].max())
    history = two.history or {}
    fall = last_tenth_fall(history.get("step", []), history.get("val_loss", []))
    return evaluate(losses, best, fall)


def as_record(checks: list[Check], train_further: str) -> dict:
    """What ``set.json`` keeps of the checks: each one, the failed ones' lines, and the command
    that trains further (:func:`attncircuits.course.claims.models_notice` reads it)."""
    return {"checks": [asdict(c) for c in checks], "failed": [c.line() for c in checks if not c.held],
            "train_further": train_further}
