"""Stages of training read from recorded curves (chapter 14): boundaries from the LLC curve, the
references a stage is named by, and essential dynamics.

Everything here reads numbers a run recorded (``make stages`` writes them); nothing trains or
samples.

* :func:`boundaries` is the rule chapter 14 states before looking: smooth the curve (a centred
  moving average over ``width`` checkpoints), take its **critical points** (where the slope between
  neighbouring checkpoints changes sign), and keep one only when the curve moves by more than
  ``min_swing`` between it and the critical point kept before it (and between it and the end), so
  that sampling noise does not cut a stage.
* :func:`bigram_logprobs` and :func:`in_context_logprobs` are the two references a stage is named
  by: the best a model reading only the current token can do (the bigram table of the training
  stream), and a predictor that copies what followed the last earlier occurrence of the current
  token (an induction head's rule), backed off to the bigram table.
* :func:`essential_dynamics` is Hoogland et al.'s second detector: the principal components of the
  model's outputs (log-probabilities on fixed inputs) across checkpoints, one point per checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attncircuits.analysis import definitions


def smooth(values, width: int = 3) -> np.ndarray:
    """Centred moving average over ``width`` points (odd), the ends averaged over what they have."""
    v = np.asarray(values, dtype=float)
    if width < 1 or width % 2 == 0:
        raise ValueError(f"width must be an odd whole number >= 1, got {width}")
    h = width // 2
    return np.array([v[max(0, i - h): i + h + 1].mean() for i in range(len(v))])


def critical_points(values) -> list[int]:
    """Indices ``i`` (interior) where the slope from ``i - 1`` to ``i`` and from ``i`` to ``i + 1``
    have opposite signs; a flat run counts once, at its first point."""
    d = np.sign(np.diff(np.asarray(values, dtype=float)))
    out, last = [], 0.0
    for i, s in enumerate(d):
        if s == 0:
            continue
        if last != 0 and s != last:
            # the turn happened at the start of this slope's run (after any flat stretch)
            j = i
            while j > 0 and d[j - 1] == 0:
                j -= 1
            out.append(j)
        last = s
    return out


@dataclass(frozen=True)
class Stages:
    """Stage boundaries found by :func:`boundaries`: indices into the curve, their steps, and
    whether the curve rose (``+1``) or fell (``-1``) in each stage (one more stage than boundaries)."""

    index: list[int]
    steps: list[int]
    direction: list[int]


def boundaries(steps, values, min_swing: float, width: int = 3) -> Stages:
    """The stage boundaries of one curve (see the module): critical points of the smoothed curve
    that survive the ``min_swing`` test, which is applied from the left until nothing changes."""
    steps, v = np.asarray(steps), np.asarray(values, dtype=float)
    if steps.ndim != 1 or steps.shape != v.shape or len(v) < 3:
        raise ValueError(f"steps and values must be two 1-d sequences of the same length >= 3, got shapes "
                         f"{steps.shape} and {v.shape}")
    if not np.isfinite(v).all():
        bad = steps[~np.isfinite(v)].tolist()
        raise ValueError(f"the curve has no value at steps {bad}: estimate them again, never fill them in")
    if not (np.isfinite(min_swing) and min_swing >= 0):
        raise ValueError(f"min_swing must be a number >= 0, got {min_swing}")
    s = smooth(v, width)
    cps = critical_points(s)
    changed = True
    while changed:
        changed = False
        pts = [0, *cps, len(s) - 1]
        for k in range(1, len(pts) - 1):
            if abs(s[pts[k]] - s[pts[k - 1]]) < min_swing or abs(s[pts[k + 1]] - s[pts[k]]) < min_swing:
                # drop this turn and the next one too when it is its mirror (a wiggle), else alone
                drop = {pts[k]}
                if k + 1 < len(pts) - 1:
                    drop.add(pts[k + 1])
                cps = [c for c in cps if c not in drop]
                changed = True
                break
    pts = [0, *cps, len(s) - 1]
    direction = [int(np.sign(s[b] - s[a])) or 1 for a, b in zip(pts[:-1], pts[1:])]
    return Stages(cps, [int(steps[i]) for i in cps], direction)


def bigram_logprobs(stream: np.ndarray, d_vocab: int, alpha: float = 0.1) -> torch.Tensor:
    """``[prev, next]`` log-probabilities of the bigram table of a token stream, add-``alpha`` smoothed."""
    s = np.asarray(stream, dtype=np.int64)
    counts = np.bincount(s[:-1] * d_vocab + s[1:], minlength=d_vocab * d_vocab).reshape(d_vocab, d_vocab)
    p = (counts + alpha) / (counts + alpha).sum(1, keepdims=True)
    return torch.from_numpy(np.log(p)).float()


def in_context_logprobs(tokens: torch.Tensor, bigram: torch.Tensor, copy: float) -> torch.Tensor:
    """``[batch, pos - 1, vocab]``: where the current token occurred before in the row, probability
    ``copy`` on the token that followed its last earlier occurrence and ``1 - copy`` on the bigram
    table; elsewhere the bigram table alone."""
    b, n = tokens.shape
    logp = bigram[tokens[:, :-1]].exp()  # [batch, pos - 1, vocab]
    out = logp.clone()
    for r in range(b):
        last: dict[int, int] = {}
        row = tokens[r].tolist()
        for t in range(n - 1):
            j = last.get(row[t])
            if j is not None:
                out[r, t] *= 1 - copy
                out[r, t, row[j + 1]] += copy
            last[row[t]] = t
    return out.log()


def loss_of(logprobs: torch.Tensor, tokens: torch.Tensor) -> float:
    """Mean next-token loss of ``logprobs [batch, pos - 1, vocab]`` on ``tokens [batch, pos]``."""
    return float(-logprobs.gather(-1, tokens[:, 1:, None]).mean())


@dataclass(frozen=True)
class EssentialDynamics:
    """Checkpoints projected on the principal components of their outputs: ``coords [checkpoint,
    component]`` and the share of variance each component explains."""

    coords: np.ndarray
    explained: np.ndarray


def essential_dynamics(outputs: np.ndarray, n_components: int = 3) -> EssentialDynamics:
    """PCA of ``outputs [checkpoint, feature]`` (each row one checkpoint's flattened outputs on the
    same inputs), centred over checkpoints, by SVD."""
    x = np.asarray(outputs, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"outputs must be [checkpoint, feature] with at least 2 checkpoints, got {x.shape}")
    x = x - x.mean(0)
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    k = min(n_components, len(s))
    return EssentialDynamics(u[:, :k] * s[:k], (s[:k] ** 2) / (s**2).sum())


#: the best prefix-matching score at which induction heads have formed (the package's one definition)
FORMED = definitions.FORMED.value


def name_stage(start: dict, end: dict, llc_direction: int) -> str:
    """A stage's name from what the detectors show at its end against its start (chapter 14 states
    the rule before reading the stages): ``start`` and ``end`` are checkpoints' records with
    ``prefix_matching``, ``prev_token`` and ``bigram_kl``; the first rule that applies names it.

    1. "induction heads form": the best prefix-matching score crosses :data:`FORMED`;
    2. "previous-token heads form": the best layer-0 previous-token score rises by over 0.1,
       prefix matching still under :data:`FORMED`;
    3. "bigram statistics": the KL divergence from the bigram table to the model falls by over a
       quarter of its value at the start, prefix matching under :data:`FORMED`;
    4. "the heads sharpen": prefix matching already formed and rising by over 0.05;
    5. otherwise "refinement" when the LLC rises, "simplification" when it falls."""
    pm0, pm1 = start["prefix_matching"], end["prefix_matching"]
    if pm0 < FORMED <= pm1:
        return "induction heads form"
    if pm1 < FORMED and end["prev_token"] - start["prev_token"] > 0.1:
        return "previous-token heads form"
    if pm1 < FORMED and end["bigram_kl"] < 0.75 * start["bigram_kl"]:
        return "bigram statistics"
    if pm0 >= FORMED and pm1 - pm0 > 0.05:
        return "the heads sharpen"
    return "refinement" if llc_direction > 0 else "simplification"


def stage_rows(points: list[dict], stages: Stages) -> list[dict]:
    """One row per stage: its first and last checkpoint's step, the LLC's direction, its name by
    :func:`name_stage`, and what the detectors show at its end."""
    cut = [0, *stages.index, len(points) - 1]
    rows = []
    for k, (a, b) in enumerate(zip(cut[:-1], cut[1:])):
        s, e = points[a], points[b]
        rows.append({"stage": k + 1, "from": s["step"], "to": e["step"], "llc": stages.direction[k],
                     "name": name_stage(s, e, stages.direction[k]), "loss": e["loss"], "bigram_kl": e["bigram_kl"],
                     "prev_token": e["prev_token"], "prefix_matching": e["prefix_matching"],
                     "copy_gain": e["copy_first"] - e["copy_second"]})
    return rows


def turning_points(path: np.ndarray, k: int = 3) -> list[int]:
    """The ``k`` checkpoints where a path ``[n, d]`` turns most sharply (the angle between the move
    into a checkpoint and the move out of it), in order along the path. Only checkpoints whose two
    moves are both longer than the path's median move count: the direction of a short move is
    mostly noise, and so is the angle between two of them."""
    p = np.asarray(path, dtype=float)
    if len(p) < 3:
        return []
    a, b = p[1:-1] - p[:-2], p[2:] - p[1:-1]
    la, lb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cos = (a * b).sum(1) / np.maximum(la * lb, 1e-12)
    angle = np.arccos(np.clip(cos, -1, 1))
    med = np.median(np.linalg.norm(np.diff(p, axis=0), axis=1))
    angle = np.where((la > med) & (lb > med), angle, -1.0)
    order = [int(i) for i in np.argsort(-angle, kind="stable") if angle[i] >= 0][:k]
    return sorted(i + 1 for i in order)


def min_swing(values, spreads, share: float = 0.05) -> float:
    """Chapter 14's noise floor for :func:`boundaries`: three times the median spread between
    chains (``spreads``, one per checkpoint), or ``share`` of the curve's range if that is larger."""
    v = np.asarray(values, dtype=float)
    return float(max(3 * np.median(np.asarray(spreads, dtype=float)), share * (v.max() - v.min())))
