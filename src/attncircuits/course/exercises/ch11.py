"""Checks for chapter 11 (Across the family): the rise window of a score trajectory, a member's
best induction head, and the per-token-loss PCA.

Each check runs the learner's function on the committed family results (seed 0) and on small
hand-written and generated inputs, against the references in :mod:`attncircuits.analysis.phase`,
and prints one line. Those references, and this module's wrappers of them, are withheld while the
learner's function runs: the package's own answers.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from attncircuits.analysis import phase
from attncircuits.course.exercises._core import Case, Diagnosis, Draw, guarded, run_check
from attncircuits.train import family

__all__ = ["check_best_induction_head", "check_loss_pca_2d", "check_rise_window"]


@functools.lru_cache(maxsize=1)
def _family() -> dict:
    return family.load(family.RESULTS / "seed-0")


# ---- 11.1 the rise window --------------------------------------------------------------------------
def rise_window(steps, values, lo=0.2, hi=0.8):
    """The reference: (start step, end step) of :func:`attncircuits.analysis.phase.rise`."""
    r = phase.rise(steps, values, lo, hi)
    return r.start_step, r.end_step


def _first_at(values, level, strict=False):
    v = np.asarray(values, dtype=float)
    hit = v > level if strict else v >= level
    return int(np.argmax(hit))


@guarded
def check_rise_window(fn) -> bool:
    """Exercise 11.1: ``fn(steps, values, lo=0.2, hi=0.8) -> (start_step, end_step)``."""
    fam = _family()
    cases = []
    for name in ("attn-3l", "ln-mlp-4l"):
        h = fam[name]["history"]
        head = phase.phase_change(h).head
        traj = [row[head[0]][head[1]] for row in h["prefix_matching"]]
        cases.append(Case(f"{name}'s best induction head", (list(h["step"]), traj)))
    cases += [
        Case("a dip below the first value before the rise", ([0, 10, 20, 30, 40, 50], [0.3, 0.0, 0.1, 0.5, 0.9, 1.0]),
             kind="hand-built"),
        Case("a rise, a fall back and a second rise", ([0, 5, 10, 15, 20, 25, 30], [0.0, 0.5, 0.9, 0.1, 0.3, 0.9, 1.0]),
             kind="hand-built"),
        Case("a value exactly at each level (a fifth and four fifths of the way)",
             ([0, 1, 2, 3, 4], [0.0, 0.2, 0.5, 0.8, 1.0]), kind="hand-built"),
        Case("lo=0.5, hi=0.9", ([100, 200, 300, 400, 500], [0.1, 0.2, 0.6, 0.95, 1.1]), {"lo": 0.5, "hi": 0.9},
             kind="hand-built"),
    ]

    def args(case):
        steps, values = case.args
        return steps, values, case.kwargs.get("lo", 0.2), case.kwargs.get("hi", 0.8)

    def from_min(expected, case):
        steps, v, lo, hi = args(case)
        base, top = min(v), max(v)
        return steps[_first_at(v, base + lo * (top - base))], steps[_first_at(v, base + hi * (top - base))]

    def last_crossing(expected, case):
        steps, v, lo, hi = args(case)
        first, top = v[0], max(v)

        def last(level):
            below = [i for i, x in enumerate(v) if x < level]
            return min(len(v) - 1, below[-1] + 1) if below else 0

        return steps[last(first + lo * (top - first))], steps[last(first + hi * (top - first))]

    def indices(expected, case):
        steps, v, lo, hi = args(case)
        r = phase.rise(steps, v, lo, hi)
        return r.start, r.end

    def strict(expected, case, at=(True, True)):
        steps, v, lo, hi = args(case)
        first, top = v[0], max(v)
        return tuple(steps[_first_at(v, first + f * (top - first), s)] for f, s in zip((lo, hi), at))

    def of_top(expected, case):
        steps, v, lo, hi = args(case)
        return steps[_first_at(v, lo * max(v))], steps[_first_at(v, hi * max(v))]

    return run_check(
        fn,
        cases,
        reference=rise_window,
        diagnoses=[
            Diagnosis("you measured the way up from the lowest value; the text measures it from the "
                      "first value (the score before training)", from_min),
            Diagnosis("those are the last times the score crossed each level; the window starts at "
                      "the first time it reaches them", last_crossing),
            Diagnosis("those are the evaluations' indices; return the steps at those indices "
                      "(steps[i])", indices),
            Diagnosis("a value exactly at the level counts as reaching it: use >=, not >", strict),
            Diagnosis("a value exactly at the hi level counts as reaching it: use >= there too, not >",
                      lambda e, c: strict(e, c, (False, True))),
            Diagnosis("a value exactly at the lo level counts as reaching it: use >= there too, not >",
                      lambda e, c: strict(e, c, (True, False))),
            Diagnosis("the levels are lo and hi of the way from the first value to the highest, not "
                      "lo and hi times the highest", of_top),
            Diagnosis("start and end are swapped: the start is where the score covers lo of the way",
                      lambda e, c: (e[1], e[0])),
        ],
        atol=0,
        rtol=0,
        generate=_trajectory,
        returns=tuple,
        withheld=[phase.rise, rise_window],
    )


def _trajectory(draw: Draw):
    """steps (increasing ints, a fixed stride or not) and a score per step (at least 2); edges: a
    constant score, two points, a score that only falls, a rise at the very end, ties at the top,
    steps that do not start at 0."""
    edges = (
        ([0, 25, 50], [0.3, 0.3, 0.3]),
        ([0, 1], [0.0, 1.0]),
        ([0, 10, 20, 30], [0.9, 0.5, 0.2, 0.1]),
        ([0, 5, 10, 15, 20], [0.05, 0.05, 0.06, 0.05, 0.9]),
        ([0, 2, 4, 6, 8], [0.1, 0.9, 0.9, 0.2, 0.9]),
        ([100, 125, 150, 175], [0.2, 0.3, 0.8, 0.7]),
    )
    edge = draw.edge(len(edges))
    if edge is not None:
        return edges[edge]
    n = draw.int(2, 30)
    steps = list(np.cumsum([draw.int(1, 30) for _ in range(n)]) - 1)
    at, width = draw.rng.uniform(0, n), draw.rng.uniform(0.5, 6)
    vals = [round(0.05 + 0.9 / (1 + np.exp(-(i - at) / width)) + draw.rng.uniform(-0.08, 0.08), 3) for i in range(n)]
    return [int(s) for s in steps], vals


# ---- 11.2 the best induction head ----------------------------------------------------------------
def best_induction_head(prefix_matching):
    """The reference: :func:`attncircuits.analysis.phase.phase_change`'s head."""
    pm = np.asarray(prefix_matching, dtype=float)
    return phase.phase_change({"step": list(range(len(pm))), "prefix_matching": pm}, threshold=np.inf).head


@guarded
def check_best_induction_head(fn) -> bool:
    """Exercise 11.2: ``fn(prefix_matching [evaluation, layer, head]) -> (layer, head)``."""
    fam = _family()
    cases = [Case(f"{n}'s history", (np.asarray(fam[n]["history"]["prefix_matching"]),))
             for n in ("attn-5l", "ln-mlp-3l", "attn-2l-none")]
    hand = np.zeros((3, 3, 2))
    hand[:, 0, 1] = [0.2, 0.9, 0.95]  # layer 0: the highest, but it cannot be an induction head
    hand[:, 2, 0] = [0.1, 0.8, 0.3]  # the best of the later layers, then falls
    hand[:, 1, 1] = [0.1, 0.2, 0.5]  # the best at the last evaluation
    cases.append(Case("a layer-0 head scores highest; the best later head falls by the end", (hand,), kind="hand-built"))
    tie = np.zeros((3, 3, 2))
    tie[0, 2, 0] = 0.7  # head 2.0 reaches the top score first ...
    tie[2, 1, 1] = 0.7  # ... head 1.1, earlier in (layer, head) order, only at the last evaluation
    cases.append(Case("two heads tie at the top score, reached at different evaluations", (tie,), kind="hand-built"))

    def with_layer0(expected, case):
        pm = case.args[0]
        return tuple(int(i) for i in np.unravel_index(np.argmax(pm.max(0)), pm.shape[1:]))

    def last_only(expected, case):
        pm = case.args[0][-1:, :, :]
        return best_induction_head(pm)

    def no_offset(expected, case):
        return expected[0] - 1, expected[1]

    def flat(expected, case):
        return expected[0] * case.args[0].shape[2] + expected[1]

    def first_reached(expected, case):
        pm = case.args[0][:, 1:]
        _, layer, head = np.unravel_index(np.argmax(pm), pm.shape)
        return int(layer) + 1, int(head)

    return run_check(
        fn,
        cases,
        reference=best_induction_head,
        diagnoses=[
            Diagnosis("that head is in layer 0: an induction head reads an earlier head, so look in "
                      "layer 1 and later", with_layer0),
            Diagnosis("you read the last evaluation only; the best head is the highest score at any "
                      "evaluation", last_only),
            Diagnosis("the layer is one too low: after slicing the layers from 1, add 1 back", no_offset),
            Diagnosis("(layer, head), in that order", lambda e, c: (e[1], e[0])),
            Diagnosis("that is the flat index; return (layer, head)", flat),
            Diagnosis("on a tie, the first head in (layer, head) order wins, not the one that reached the "
                      "score at the earliest evaluation: take each head's highest score over the "
                      "evaluations first, then the argmax over the heads", first_reached),
        ],
        atol=0,
        rtol=0,
        generate=_prefix_history,
        returns=tuple,
        withheld=[phase.phase_change, best_induction_head],
    )


def _prefix_history(draw: Draw):
    """[evaluation, layer, head] scores in [0, 1], 2-4 layers, 1-4 heads, 1-12 evaluations; edges:
    one evaluation, one head, a tie broken by the lower index, layer 0 highest everywhere."""
    edges = ((1, 2, 3), (4, 2, 1), (3, 3, 2), (5, 2, 2))
    edge = draw.edge(len(edges) + 2)
    if edge is not None and edge < len(edges):
        e, l, h = edges[edge]
    else:
        e, l, h = draw.int(1, 12), draw.int(2, 4), draw.int(1, 4)
    pm = draw.rand(e, l, h).double().numpy()
    if edge == 2:
        pm[:, 1:, :] = 0.5  # a tie everywhere above layer 0
    if edge == 3:
        pm[:, 0, :] = 1.0
    return (np.round(pm, 3),)


# ---- 11.3 the per-token-loss PCA -------------------------------------------------------------------
def loss_pca_2d(losses: torch.Tensor) -> torch.Tensor:
    """The reference: :func:`attncircuits.analysis.phase.loss_pca` of one stack of snapshots."""
    coords = phase.loss_pca({"all": np.asarray(losses, dtype=np.float64)}).coords["all"]
    return torch.from_numpy(coords)


def _signs(x):
    """A PCA's coordinates with each component's sign fixed (the entry largest in size positive):
    the sign of a principal component is arbitrary."""
    x = torch.as_tensor(x, dtype=torch.float64)
    if x.ndim != 2 or x.shape[1] != 2:
        return x
    idx = x.abs().argmax(0)
    return x * torch.sign(x[idx, torch.arange(2)] + (x[idx, torch.arange(2)] == 0))


@guarded
def check_loss_pca_2d(fn) -> bool:
    """Exercise 11.3: ``fn(losses [n_snapshots, n_pairs]) -> [n_snapshots, 2]``, each snapshot's
    coordinates on the two principal components of the centred stack (any sign per component)."""
    fam = _family()
    first = fam["attn-2l"]["history"]["step"].index(200)
    stack = np.concatenate([fam[n]["per_token"][first::4] for n in ("attn-1l", "attn-2l", "ln-mlp-2l")])
    gen = torch.Generator().manual_seed(0)
    cases = [
        Case("three members' snapshots from step 200, every fourth", (torch.from_numpy(stack).double(),)),
        Case("random losses, 9 snapshots x 5 pairs", (torch.rand(9, 5, generator=gen, dtype=torch.float64) * 4,),
             kind="random"),
        Case("one pair far more variable than the others",
             (torch.randn(12, 4, generator=gen, dtype=torch.float64) * torch.tensor([10.0, 1.0, 0.5, 0.1], dtype=torch.float64),),
             kind="random"),
    ]

    def not_centred(expected, case):
        x = case.args[0].double()
        _, _, vt = torch.linalg.svd(x, full_matrices=False)
        return x @ vt[:2].T

    def standardised(expected, case):
        x = case.args[0].double()
        x = (x - x.mean(0)) / x.std(0).clamp_min(1e-12)
        _, _, vt = torch.linalg.svd(x, full_matrices=False)
        return x @ vt[:2].T

    def rows_centred(expected, case):
        x = case.args[0].double()
        x = x - x.mean(1, keepdim=True)
        _, _, vt = torch.linalg.svd(x, full_matrices=False)
        return x @ vt[:2].T

    def unscaled(expected, case):
        x = case.args[0].double()
        u, _, _ = torch.linalg.svd(x - x.mean(0), full_matrices=False)
        return u[:, :2]

    return run_check(
        fn,
        cases,
        reference=loss_pca_2d,
        diagnoses=[
            Diagnosis("centre the stack first: subtract each pair's mean over the snapshots", not_centred),
            Diagnosis("you divided each pair by its spread; Olsson's PCA keeps the losses in nats, so "
                      "the pairs that move most weigh most", standardised),
            Diagnosis("you centred each snapshot (row); centre each pair (column) over the snapshots",
                      rows_centred),
            Diagnosis("those are U's columns, of length 1; the coordinates are the centred stack "
                      "times the components (U times the singular values)", unscaled),
            Diagnosis("the components are in the wrong order: the first holds the most variance",
                      lambda e, c: e[:, [1, 0]]),
        ],
        atol=1e-3,  # a float32 answer on losses of a few nats holds about 1e-5
        rtol=1e-4,
        canonical=_signs,
        generate=_stack,
        withheld=[phase.loss_pca, loss_pca_2d],
    )


def _stack(draw: Draw):
    """[n_snapshots, n_pairs] losses, 3-20 snapshots of 2-30 pairs, with a trend along the
    snapshots (as training makes); edges: 3 snapshots of 2 pairs, many pairs, one pair constant."""
    edge = draw.edge(3)
    n, p = ((3, 2), (5, 40), (8, 4))[edge] if edge is not None else (draw.int(3, 20), draw.int(2, 30))
    trend = torch.linspace(4, 1, n, dtype=torch.float64)[:, None] * draw.rand(1, p).double()
    x = trend + draw.randn(n, p).double() * 0.3
    if edge == 2:
        x[:, 0] = 2.0
    return (x,)
