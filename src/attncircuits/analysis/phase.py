"""The phase change read from a training history: when a model's induction heads rise, what the
in-context-learning score does across it, and the per-token-loss PCA of Olsson et al. (2022).

Everything here reads numbers a training run recorded (``make family`` writes them, chapter 11
reads them); nothing trains or runs a model.

* :func:`rise` finds the **rise window** of one score trajectory: the first evaluation at which
  it has covered ``lo`` (20%) of the way from its first value to its highest, and the first at
  which it has covered ``hi`` (80%). A member has **formed induction heads** when its best head's
  prefix-matching score reaches :data:`FORMED` (0.5, chapter 7's target); the window of that head
  is the member's phase change.
* :func:`icl_across` is the in-context-learning score just before the window and just after it,
  each the mean of ``n`` evaluations, so one noisy evaluation does not decide it.
* :func:`loss_pca` stacks every snapshot's per-token losses (one vector per snapshot, the same
  (window, position) pairs for every member), centres them and projects them on two principal
  components: one trajectory per member; :func:`turn` measures how sharply one turns across its
  phase change, against :func:`turns_elsewhere`, the same measure everywhere else on the path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attncircuits.analysis import definitions as D

#: the prefix-matching score at which a member has formed induction heads (chapter 7's target;
#: the course's one definition, :data:`attncircuits.analysis.definitions.FORMED`)
FORMED = D.FORMED.value


@dataclass(frozen=True)
class Rise:
    """The rise window of one trajectory: evaluation indices ``start`` <= ``end`` and their steps."""

    start: int
    end: int
    start_step: int
    end_step: int
    first: float
    top: float


def rise(steps, values, lo: float = 0.2, hi: float = 0.8) -> Rise:
    """The window in which ``values`` (one per step of ``steps``) climbs from ``lo`` to ``hi`` of
    the way from its first value to its highest (see the module)."""
    steps, values = np.asarray(steps), np.asarray(values, dtype=float)
    if steps.ndim != 1 or steps.shape != values.shape or len(steps) < 2:
        raise ValueError(f"steps and values must be two 1-d sequences of the same length >= 2, got shapes "
                         f"{steps.shape} and {values.shape}")
    if not 0 <= lo < hi <= 1:
        raise ValueError(f"need 0 <= lo < hi <= 1, got lo={lo}, hi={hi}")
    first, top = float(values[0]), float(values.max())
    start = int(np.argmax(values >= first + lo * (top - first)))
    end = int(np.argmax(values >= first + hi * (top - first)))
    return Rise(start, max(start, end), int(steps[start]), int(steps[max(start, end)]), first, top)


@dataclass(frozen=True)
class PhaseChange:
    """A member's phase change, read from its history (:func:`phase_change`)."""

    formed: bool
    head: tuple[int, int]  # the best induction head (highest prefix-matching score at any step)
    best: float  # its highest score
    window: Rise | None  # its rise window, None when it never reached FORMED
    formed_step: int | None = None  # the first evaluated step at which it reached FORMED

    def describe(self, tokens_per_step: int) -> str:
        if not self.formed:
            return f"none (best prefix matching {self.best:.2f})"
        w = self.window
        return (f"steps {w.start_step:,}-{w.end_step:,} "
                f"({w.start_step * tokens_per_step / 1e6:.2f}-{w.end_step * tokens_per_step / 1e6:.2f} M tokens)")


def phase_change(history: dict, threshold: float = FORMED) -> PhaseChange:
    """The phase change of one member from its ``history`` (``step`` and ``prefix_matching``,
    ``[evaluation][layer][head]``). Layer 0 is left out: an induction head reads a previous-token
    head, so it sits in layer 1 or later."""
    pm = np.asarray(history["prefix_matching"], dtype=float)
    if pm.ndim != 3 or pm.shape[0] != len(history["step"]):
        raise ValueError(f"history['prefix_matching'] must be [evaluation, layer, head] with one row per step, "
                         f"got shape {pm.shape} for {len(history['step'])} steps")
    if pm.shape[1] < 2:
        best = float(pm.max())
        return PhaseChange(False, (0, int(pm.max(0)[0].argmax())), best, None)
    later = pm[:, 1:, :]
    flat = int(later.max(0).argmax())
    head = (1 + flat // pm.shape[2], flat % pm.shape[2])
    traj = pm[:, head[0], head[1]]
    best = float(traj.max())
    formed = best >= threshold
    at = int(np.asarray(history["step"])[np.argmax(traj >= threshold)]) if formed else None
    return PhaseChange(formed, head, best, rise(history["step"], traj) if formed else None, at)


def icl_across(icl, window: Rise | None, n: int = 4) -> tuple[float, float]:
    """The ICL score just before the rise window and just after it: the mean of the ``n``
    evaluations up to its start and of the ``n`` from its end. Without a window (no phase change),
    the mean of the first ``n`` evaluations after the first and of the last ``n``."""
    icl = np.asarray(icl, dtype=float)
    if window is None:
        return float(icl[1 : 1 + n].mean()), float(icl[-n:].mean())
    before = icl[max(0, window.start - n + 1) : window.start + 1]
    return float(before.mean()), float(icl[window.end : window.end + n].mean())


@dataclass(frozen=True)
class ICLChange:
    """The ICL score on the same windows before and after a phase change, and the change with its
    standard error over the windows (each window's own change, so the text's noise cancels)."""

    before: float
    after: float
    change: float
    se: float
    windows: int

    def falls(self, n_se: float = 3.0) -> bool:
        """Whether the score fell by at least ``n_se`` standard errors."""
        return self.change < 0 and self.change <= -n_se * self.se


def icl_change(steps, rows, window: Rise | None, n: int = 2) -> ICLChange:
    """The ICL score of each fixed window (``rows``: ``[evaluation, window]``, evaluated at
    ``steps``) averaged over the ``n`` evaluations up to the window's start and the ``n`` from its
    end, and the mean of each window's change with its standard error. Without a window (no phase
    change): the ``n`` evaluations after the first (the untrained model) and the last ``n``."""
    steps, rows = np.asarray(steps), np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or len(rows) != len(steps) or len(steps) < 2 or rows.shape[1] < 2:
        raise ValueError(f"rows must be [evaluation, window] with one row per step, at least 2 of each, got shape "
                         f"{rows.shape} for {len(steps)} steps")
    if window is None:  # a history too short for n on each side shares what it has (tests' tiny runs)
        k = max(1, min(n, (len(rows) - 1) // 2))
        before, after = (rows[1:1 + k] if len(rows) > 2 else rows[:1]), rows[-k:]
    else:
        upto = np.flatnonzero(steps <= window.start_step)
        since = np.flatnonzero(steps >= window.end_step)
        if len(upto) == 0 or len(since) == 0:
            raise ValueError(f"no ICL evaluation before step {window.start_step:,} or after step {window.end_step:,}")
        before, after = rows[upto[-n:]], rows[since[:n]]
    b, a = before.mean(0), after.mean(0)
    d = a - b
    return ICLChange(float(b.mean()), float(a.mean()), float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))), len(d))


@dataclass
class LossPCA:
    """Every snapshot of every member projected on two principal components."""

    coords: dict[str, np.ndarray]  # member -> [n_snapshots, 2]
    explained: np.ndarray  # share of the variance of each component


def loss_pca(per_token: dict[str, np.ndarray], n_components: int = 2) -> LossPCA:
    """The per-token-loss PCA of Olsson et al.: ``per_token[member]`` is ``[n_snapshots, n_pairs]``
    (the loss at the same (window, position) pairs for every member). All snapshots of all members
    are stacked, centred and projected on the top ``n_components`` directions of their variance."""
    if not per_token:
        raise ValueError("no member's per-token losses to project: run `make family` first")
    widths = {m: np.asarray(v).shape[1] for m, v in per_token.items()}
    if len(set(widths.values())) != 1:
        raise ValueError(f"the members were measured at different (window, position) pairs: {widths}; "
                         "their results come from different recipes")
    names = list(per_token)
    x = np.concatenate([np.asarray(per_token[m], dtype=np.float64) for m in names])
    x = x - x.mean(0)
    # the snapshots' Gram matrix has the squared singular values as eigenvalues and U as
    # eigenvectors: a few hundred snapshots by a few hundred is far cheaper than the SVD of x
    gram = x @ x.T
    evals, evecs = np.linalg.eigh(gram)
    order = np.argsort(evals)[::-1][:n_components]
    s2 = np.clip(evals, 0, None)
    proj = evecs[:, order] * np.sqrt(s2[order])
    # a component's sign is arbitrary: orient each so the first snapshot of the first member is negative
    sign = -np.sign(proj[0]) + (proj[0] == 0)
    proj = proj * sign
    coords, i = {}, 0
    for m in names:
        k = len(per_token[m])
        coords[m] = proj[i : i + k]
        i += k
    return LossPCA(coords, s2[order] / s2.sum())


def smooth(x: np.ndarray, k: int) -> np.ndarray:
    """The running mean of ``k`` consecutive snapshots (rows) of ``x``: ``len(x) - k + 1`` rows,
    row ``i`` the mean of rows ``i .. i + k - 1`` (centred on snapshot ``i + k // 2``)."""
    x = np.asarray(x, dtype=np.float64)
    if not 1 <= k <= len(x):
        raise ValueError(f"k={k}: a running mean needs 1 <= k <= the {len(x)} snapshots")
    c = np.cumsum(np.concatenate([np.zeros((1, *x.shape[1:])), x]), 0)
    return (c[k:] - c[:-k]) / k


def _angle(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 0.0
    return float(np.degrees(np.arccos(np.clip(a @ b / (na * nb), -1, 1))))


def turn(path: np.ndarray, start: int, end: int, span: int = 8) -> float:
    """How sharply a path turns across snapshots ``start`` to ``end``: the angle (degrees) between
    its direction over the ``span`` snapshots before ``start`` and over the ``span`` after ``end``
    (clipped at the path's ends). 0 is straight on, 180 straight back."""
    path = np.asarray(path, dtype=float)
    if path.ndim != 2 or not 0 <= start <= end < len(path):
        raise ValueError(f"need a [n, d] path and 0 <= start <= end < n, got shape {path.shape}, {start}, {end}")
    return _angle(path[start] - path[max(0, start - span)], path[min(len(path) - 1, end + span)] - path[end])


def turns_elsewhere(path: np.ndarray, width: int, span: int = 8) -> np.ndarray:
    """:func:`turn` across every stretch of ``width`` snapshots of the path with ``span`` whole
    snapshots on each side: what the path does on its own, to read a turn against."""
    path = np.asarray(path, dtype=float)
    return np.array([turn(path, i, i + width, span) for i in range(span, len(path) - span - width)])


@dataclass(frozen=True)
class MemberSummary:
    """One row of the family table (:func:`summarize`)."""

    member: str
    n_params: int
    steps: int  # the budget
    tokens_per_step: int
    phase: PhaseChange
    icl_before: float
    icl_after: float
    final_icl: float
    final_icl_se: float
    prev_head: tuple[int, int]  # the best previous-token head (on text) at the end
    prev_score: float
    icl: ICLChange | None = None  # across the phase change on the fixed windows (results that keep them)

    def row(self) -> str:
        """One line under :data:`TABLE_HEADER` (77 columns). The ICL score's change has its standard
        error where the results keep each window's score; otherwise that column is blank."""
        w = self.phase.window
        when = f"{w.start_step:>5,}-{w.end_step:<5,}" if self.phase.formed else "none"
        change = self.icl.change if self.icl is not None else self.icl_after - self.icl_before
        se = f"{self.icl.se:4.2f}" if self.icl is not None else ""
        ind, prev = (f"{h[0]}.{h[1]:<3}{s:>5.2f}" for h, s in ((self.phase.head, self.phase.best),
                                                                (self.prev_head, self.prev_score)))
        return (f"{self.member:<16}{when:<12} {self.icl_before:>+6.2f}{self.icl_after:>+6.2f}{change:>+7.2f} "
                f"{se:>4}  {ind}  {prev}")


#: the header of :meth:`MemberSummary.row`: a best head as layer.head, then its score
TABLE_HEADER = (f"{'':<16}{'phase change':<13}{'ICL score':<26}{'induction':<12}prev-token\n"
                f"{'member':<16}{'steps':<12} {'before':>6}{'after':>6}{'change':>7} {'s.e.':>4}  "
                f"{'head':<5}{'score':>5}  {'head':<5}{'score':>5}")


def table(rows: list[MemberSummary]) -> str:
    """:data:`TABLE_HEADER`, a row per member, and a line giving the steps in tokens."""
    per_step = {r.tokens_per_step for r in rows}
    tokens = (f"a step is {per_step.pop():,} tokens" if len(per_step) == 1
              else "the members' steps differ in tokens: " + ", ".join(f"{r.member} {r.tokens_per_step:,}" for r in rows))
    return "\n".join([TABLE_HEADER, *(r.row() for r in rows), tokens])


def summarize(name: str, result: dict) -> MemberSummary:
    """The family-table row of one member's results (as ``make family`` writes them)."""
    h = result["history"]
    phase = phase_change(h)
    if result.get("icl_rows") is not None:  # each fixed window's score at each ICL evaluation
        change = icl_change(h["icl_steps"], result["icl_rows"], phase.window)
        before, after = change.before, change.after
    else:
        change, (before, after) = None, icl_across(h["icl"], phase.window)
    prev = np.asarray(result["final_scores"]["previous_token"], dtype=float)
    flat = int(prev.argmax())
    return MemberSummary(name, result["n_params"], h["step"][-1], result["tokens_per_step"], phase, before, after,
                         result["final_icl"]["mean"], result["final_icl"]["se"],
                         (flat // prev.shape[1], flat % prev.shape[1]), float(prev.max()), change)
