"""Checks for chapter 14 (Stages in the weights): the LLC from a sampler's loss trace, the verdict
on a sampler setting, and the critical points of a curve.

None of them needs devinterp: they read loss traces and curves, recorded (the committed results of
``make stages``) or made up. The references are :func:`attncircuits.analysis.llc.llc_from_trace`,
:func:`attncircuits.analysis.llc.verdict` and :func:`attncircuits.analysis.stages.critical_points`,
withheld while the learner's function runs.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from attncircuits.analysis import llc as L
from attncircuits.analysis import stages as ST
from attncircuits.course.exercises._core import Case, Diagnosis, Draw, guarded, run_check
from attncircuits.train import stages

__all__ = ["check_critical_steps", "check_llc_from_trace", "check_trace_verdict"]


@functools.lru_cache(maxsize=1)
def _seed0() -> dict:
    return stages.load(2, 0)


def _finite_rows(t):
    t = np.asarray(t, dtype=float)
    return t[np.isfinite(t).all(axis=1)]


# ---- 14.1 the LLC from a loss trace ----------------------------------------------------------------
@guarded
def check_llc_from_trace(fn) -> bool:
    """Exercise 14.1: ``fn(trace [chain, step], init_loss, n_beta) -> float``."""
    run = _seed0()
    cases = []
    for p in (run["points"][-1], run["points"][len(run["points"]) // 2]):
        e = p["llc"]
        cases.append(Case(f"the mean trace at step {p['step']:,} of the recorded seed-0 run",
                          (np.asarray([e["trace"]]), e["init_loss"], e["settings"]["n_beta"])))
    t = np.array([[3.0, 3.2, 3.3, 3.3], [3.0, 3.1, 3.4, 3.2], [3.0, 3.6, np.nan, np.nan]])
    cases += [
        Case("three chains, the last diverged at step 2", (t, 3.0, 1000.0), kind="hand-built"),
        Case("two chains, the loss below L(w*) (a negative estimate)", (np.array([[2.9, 2.8], [2.95, 2.85]]), 3.0, 50.0),
             kind="hand-built"),
    ]

    def no_nbeta(e, c):
        return e / c.args[2]

    def no_init(e, c):
        return c.args[2] * float(np.mean(_finite_rows(c.args[0])))

    def nanmean(e, c):
        t, init, nb = c.args
        return float(nb * (np.nanmean(np.asarray(t, dtype=float)) - init))

    def nanmean_chains(e, c):
        t, init, nb = c.args
        return float(np.mean(nb * (np.nanmean(np.asarray(t, dtype=float), axis=1) - init)))

    def last_draw(e, c):
        t, init, nb = c.args
        return float(nb * (_finite_rows(t)[:, -1].mean() - init))

    return run_check(
        fn,
        cases,
        reference=L.llc_from_trace,
        diagnoses=[
            Diagnosis("multiply by n_beta: the LLC is nβ times the loss's rise", no_nbeta),
            Diagnosis("subtract init_loss, the loss at w*, from the mean sampled loss", no_init),
            Diagnosis("a chain with a NaN diverged: leave it out (nanmean averaged in what it had before "
                      "it failed)", nanmean),
            Diagnosis("a chain with a NaN diverged: leave it out, do not average its steps before the NaN",
                      nanmean_chains),
            Diagnosis("average over every step of each chain, not the last draw only", last_draw),
            Diagnosis("the wrong sign: mean sampled loss minus init_loss", lambda e, c: -e),
        ],
        name="llc_from_trace",
        returns=float,
        atol=1e-3,
        rtol=1e-5,
        generate=_trace,
        withheld=[L.llc_from_trace],
    )


def _trace(draw: Draw):
    """trace [chain, step] (1-4 chains, 2-40 steps), init_loss, n_beta; at most all but one chain
    diverged (NaN from some step on); edges: one chain of two steps, a chain NaN from step 0,
    an infinite loss, a trace equal to init_loss."""
    edges = (
        (np.array([[2.0, 2.5]]), 2.0, 10.0),
        (np.array([[np.nan, np.nan, np.nan], [1.0, 1.2, 1.1]]), 1.0, 100.0),
        (np.array([[1.0, np.inf], [1.0, 1.5]]), 1.0, 3.0),
        (np.full((2, 5), 4.0), 4.0, 1000.0),
    )
    edge = draw.edge(len(edges))
    if edge is not None:
        return edges[edge]
    chains, steps = draw.int(1, 4), draw.int(2, 40)
    init = round(draw.rng.uniform(0.5, 6.0), 3)
    t = init + np.cumsum(np.abs(np.array([[draw.rng.gauss(0, 0.05) for _ in range(steps)] for _ in range(chains)])),
                         axis=1) * draw.rng.choice([1, -1, 1, 1])
    for c in range(chains - 1):
        if draw.rng.random() < 0.3:
            t[c, draw.int(0, steps - 1):] = np.nan
    return t, init, float(draw.rng.choice([1.0, 30.0, 1000.0]))


# ---- 14.2 the verdict on a sampler setting ---------------------------------------------------------
@guarded
def check_trace_verdict(fn) -> bool:
    """Exercise 14.2: ``fn(trace [chain, step], init_loss) -> "diverged" | "negative" | "not flat" | "flat"``."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, (2, 40))
    rising = 3.0 + np.linspace(0, 2, 40) + noise
    flat = 3.0 + 0.3 * (1 - np.exp(-np.arange(40) / 3)) + noise
    spiky = flat.copy()
    spiky[1, 25] = np.nan
    dips = flat.copy()
    dips[:, -1] = 2.9  # above L(w*) all along, then one draw below it
    ends_up = flat - 0.5
    ends_up[:, -1] = 3.5  # below L(w*) all along, then one draw above it
    cases = [
        Case("the loss still rising at the end", (rising, 3.0), kind="hand-built"),
        Case("flat above L(w*), the last draw below it", (dips, 3.0), kind="hand-built"),
        Case("below L(w*), the last draw above it", (ends_up, 3.0), kind="hand-built"),
        Case("a quick rise, then flat with batch noise", (flat, 3.0), kind="hand-built"),
        Case("flat, but one chain has a NaN at step 25", (spiky, 3.0), kind="hand-built"),
        Case("below L(w*) all along", (flat - 0.5, 3.0), kind="hand-built"),
        Case("a NaN in a trace below L(w*)", (spiky - 0.5, 3.0), kind="hand-built"),
    ]

    def nan_last(e, c):
        t, init = c.args
        t = np.asarray(t, dtype=float)
        with np.errstate(invalid="ignore"):  # the mistake computes on the NaN
            if t.mean() < init:
                return "negative"
            q = max(1, t.shape[1] // 4)
            rise = t.mean(0)[-q:].mean() - init
            gap = L.plateau_gap(t)
            if gap > max(0.1 * abs(rise), 3 * L.batch_noise(t)):
                return "not flat"
        return "flat" if np.isfinite(t).all() else "diverged"

    def no_noise(e, c):
        t, init = c.args
        t = np.asarray(t, dtype=float)
        if e in ("diverged", "negative"):
            return e
        q = max(1, t.shape[1] // 4)
        rise = t.mean(0)[-q:].mean() - init
        return "not flat" if L.plateau_gap(t) > 0.1 * abs(rise) else "flat"

    def first_quarter(e, c):
        t, init = c.args
        t = np.asarray(t, dtype=float)
        if e in ("diverged", "negative"):
            return e
        q = max(1, t.shape[1] // 4)
        m = t.mean(0)
        rise = m[-q:].mean() - init
        gap = abs(m[-q:].mean() - m[:q].mean())
        return "not flat" if gap > max(0.1 * abs(rise), 3 * L.batch_noise(t)) else "flat"

    def last_value(e, c):
        t, init = c.args
        t = np.asarray(t, dtype=float)
        if e == "diverged":
            return e
        return "negative" if t[:, -1].mean() < init else L.verdict(np.abs(t - init) + init, init)

    return run_check(
        fn,
        cases,
        reference=L.verdict,
        diagnoses=[
            Diagnosis("test for NaN first: a trace with a NaN is \"diverged\" whatever else it shows", nan_last),
            Diagnosis("allow for batch noise: a gap within three standard errors (batch_noise) is flat",
                      no_noise),
            Diagnosis("compare the last quarter with the third quarter, not with the first (the first "
                      "holds the rise itself)", first_quarter),
            Diagnosis("\"negative\" is about the mean over the whole trace, not the last draw", last_value),
            Diagnosis("the verdicts are lower case: \"diverged\", \"negative\", \"not flat\", \"flat\"",
                      applies=lambda got, e, c: isinstance(got, str) and got.lower() == e),
        ],
        name="trace_verdict",
        returns=str,
        generate=_verdict_case,
        withheld=[L.verdict],
    )


def _verdict_case(draw: Draw):
    """trace [chain, step] (1-3 chains, 8-60 steps) of each kind: a saturating rise with noise
    (flat), a steady rise (not flat), a fall below init (negative), a NaN somewhere (diverged)."""
    chains, steps = draw.int(1, 3), draw.int(8, 60)
    init = round(draw.rng.uniform(1.0, 5.0), 2)
    kind = draw.rng.choice(["flat", "rising", "negative", "nan"])
    sd = draw.rng.choice([0.0, 0.02, 0.1])
    x = np.arange(steps)
    noise = np.array([[draw.rng.gauss(0, sd) for _ in range(steps)] for _ in range(chains)])
    if kind == "rising":
        t = init + 0.05 * x + noise
    else:
        t = init + 0.4 * (1 - np.exp(-x / 2.0)) + noise
    if kind == "negative":
        t = 2 * init - t
    if kind == "nan":
        t[draw.int(0, chains - 1), draw.int(0, steps - 1)] = draw.rng.choice([math.nan, math.inf])
    return t, init


# ---- 14.3 critical points of a curve ---------------------------------------------------------------
def critical_steps(steps, values):
    """The reference: the steps at :func:`attncircuits.analysis.stages.critical_points`."""
    return [int(steps[i]) for i in ST.critical_points(values)]


@guarded
def check_critical_steps(fn) -> bool:
    """Exercise 14.3: ``fn(steps, values) -> list of steps`` where the slope changes sign."""
    run = _seed0()
    steps = [p["step"] for p in run["points"]]
    llc = [p["llc"]["llc"] for p in run["points"]]
    cases = [
        Case("the recorded seed-0 LLC curve, smoothed over 3 checkpoints", (steps, ST.smooth(llc, 3).tolist())),
        Case("a peak with a flat top", ([0, 10, 20, 30, 40, 50], [0.0, 1.0, 2.0, 2.0, 1.0, 0.5]), kind="hand-built"),
        Case("a rise, a dip, a rise", ([0, 5, 10, 20, 40, 80], [1.0, 3.0, 2.0, 1.5, 4.0, 5.0]), kind="hand-built"),
        Case("always rising", ([0, 1, 2, 3], [0.0, 0.5, 0.6, 2.0]), kind="hand-built"),
        Case("a flat stretch inside a rise (no turn)", ([0, 1, 2, 3, 4], [0.0, 1.0, 1.0, 1.0, 2.0]), kind="hand-built"),
    ]

    def indices(e, c):
        return ST.critical_points(c.args[1])

    def shifted(k):
        def f(e, c):
            s = list(c.args[0])
            return [int(s[min(len(s) - 1, max(0, s.index(x) + k))]) for x in e]
        return f

    def every_flat(e, c):
        s, v = c.args
        d = np.sign(np.diff(np.asarray(v, dtype=float)))
        out = []
        for i in range(1, len(v) - 1):
            if d[i - 1] != d[i]:
                out.append(int(s[i]))
        return out

    def maxima(e, c):
        s, v = c.args
        return [x for x in e if v[list(s).index(x)] >= max(v[max(0, list(s).index(x) - 1)],
                                                            v[min(len(v) - 1, list(s).index(x) + 1)])]

    def with_ends(e, c):
        s = c.args[0]
        return [int(s[0]), *e, int(s[-1])]

    return run_check(
        fn,
        cases,
        reference=critical_steps,
        diagnoses=[
            Diagnosis("those are indices; return the steps at them (steps[i])", indices),
            Diagnosis("one checkpoint late: the turn is at the point between the two slopes, not after it",
                      shifted(1)),
            Diagnosis("one checkpoint early: the turn is at the point between the two slopes, not before it",
                      shifted(-1)),
            Diagnosis("a flat stretch is not a turn by itself: skip zero slopes and compare the slopes on "
                      "either side of it", every_flat),
            Diagnosis("a minimum is a critical point too, not only a maximum", maxima),
            Diagnosis("the first and last checkpoints are not critical points: only interior turns count",
                      with_ends),
        ],
        name="critical_steps",
        returns=list,
        atol=0,
        rtol=0,
        generate=_curve,
        withheld=[ST.critical_points, critical_steps],
    )


def _curve(draw: Draw):
    """steps (increasing) and a curve (3-30 points): random walks, with flat stretches and exact
    ties; edges: three points with a peak, a valley, a curve flat throughout, a plateau at a peak."""
    edges = (
        ([0, 1, 2], [0.0, 1.0, 0.0]),
        ([0, 10, 20], [1.0, 0.0, 1.0]),
        ([0, 1, 2, 3], [2.0, 2.0, 2.0, 2.0]),
        ([0, 2, 4, 6, 8, 10], [0.0, 1.0, 1.0, 1.0, 0.5, 0.7]),
    )
    edge = draw.edge(len(edges))
    if edge is not None:
        return edges[edge]
    n = draw.int(3, 30)
    steps = [int(x) for x in np.cumsum([draw.int(1, 50) for _ in range(n)]) - 1]
    v, vals = 0.0, []
    for _ in range(n):
        v += draw.rng.choice([-1.0, 0.0, 1.0, 1.0, 2.0]) * round(draw.rng.uniform(0.1, 1.0), 2)
        vals.append(round(v, 3))
    return steps, vals
