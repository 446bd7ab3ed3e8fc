"""Chapter 12's grader: a hypothesis about a model's circuit, checked against the model itself.

A hypothesis is a small dict::

    {"model": "mystery-2",
     "heads": {"0.1": "two-back", "1.0": "skip-induction"},     # head -> a role of ROLES
     "compositions": [("0.1", "1.0", "K")]}                      # writer, reader, Q/K/V

The grader knows no answer. It measures what the hypothesis claims, with the course's tools
(:mod:`attncircuits.analysis.circuit_check`):

1. each head's **role** by that role's score (its threshold in ``ROLES``), which must also be the
   head's best role (:func:`~attncircuits.analysis.circuit_check.best_roles`: a head whose
   attention finds earlier copies also copies, and rests on itself where there is no copy);
2. each **composition** by its score in deviations above the random baseline (``COMPOSES``),
   and, in a circuit of more than one layer, that every named head of a later layer reads a named
   head of an earlier one (else the hypothesis does not say how the later head gets its input);
3. each **role's share**: ablating the heads of one role from the named circuit must lose at least
   ``NEEDED`` of the task (a head that does nothing for the task is not part of its circuit);
4. the **circuit** by mean-ablation: faithfulness (the named heads alone, every other head
   ablated) and completeness (the named heads ablated) at least ``FAITHFUL`` and ``COMPLETE``;
5. **nothing left out**: removing a named head, or one role's heads, from the circuit loses at
   most ``LEFT_OUT`` more of the task than removing them from the whole model
   (:func:`~attncircuits.analysis.circuit_check.left_out`): an unnamed head that does a named
   one's work (a second induction head beside the one named) fails it, though the named heads
   alone may recover the task and their ablation, which cuts the path it sits on, destroy it.

:meth:`Grader.grade` prints the numbers and one line for each part that fails, saying what was
measured, never what the answer is. A hypothesis that cannot be graded (a head the model lacks,
a role the course does not define, no heads, another model's hypothesis) is refused in one line
naming what is allowed (:class:`HypothesisError`).
"""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass, field

from attncircuits.analysis import circuit_check as cc
from attncircuits.analysis import definitions as D
from attncircuits.checkpoints.mysteries import load_mystery, mystery_names
from attncircuits.checkpoints.pretrained import load_pretrained
from attncircuits.core.heads import Head, head_name
from attncircuits.data.tasks import Repeated

__all__ = ["Grade", "Grader", "HypothesisError", "grade", "grade_function", "grader_for", "parse"]

KEYS = ("model", "heads", "compositions")
WIDTH = 79  # the book's code column


class HypothesisError(ValueError):
    """A hypothesis that cannot be graded; the message is one line naming what is allowed."""


@dataclass(frozen=True)
class Hypothesis:
    model: str
    heads: dict[Head, str]
    compositions: tuple[tuple[Head, Head, str], ...]


def _heads_allowed(n_layers: int, n_heads: int) -> str:
    return " and ".join(f"{layer}.0-{layer}.{n_heads - 1}" for layer in range(n_layers))


def _head(value, n_layers: int, n_heads: int, model: str) -> Head:
    allowed = f"{model}'s heads are {_heads_allowed(n_layers, n_heads)}"
    try:
        if isinstance(value, str):
            layer, head = (int(p) for p in value.split("."))
        else:
            layer, head = (int(p) for p in value)
    except (ValueError, TypeError):
        raise HypothesisError(f"{value!r} is not a head: write 'layer.head', e.g. '0.1'; {allowed}") from None
    if not (0 <= layer < n_layers and 0 <= head < n_heads):
        raise HypothesisError(f"{model} has no head {layer}.{head}: {allowed}")
    return layer, head


def parse(hypothesis, model_name: str, n_layers: int, n_heads: int) -> Hypothesis:
    """The hypothesis as a :class:`Hypothesis`, or a :class:`HypothesisError` in one line."""
    form = "{'model': ..., 'heads': {'L.H': role}, 'compositions': [(writer, reader, 'Q'|'K'|'V')]}"
    if not isinstance(hypothesis, dict):
        raise HypothesisError(f"a hypothesis is a dict {form}, got {type(hypothesis).__name__}")
    unknown = sorted(set(map(str, hypothesis)) - set(KEYS))
    if unknown:
        raise HypothesisError(f"unknown key {unknown[0]!r} in the hypothesis; its keys are {', '.join(KEYS)}")
    if hypothesis.get("model") != model_name:
        others = ", ".join(n for n in [*mystery_names(), "attn-only-2l"] if n != model_name)
        got = hypothesis.get("model")
        said = "names no model" if got is None else f"is about {got!r}"
        raise HypothesisError(f"this hypothesis {said}; this grader grades {model_name!r} (set 'model': "
                              f"{model_name!r}, or grade it with grader_for one of {others})")
    heads_in = hypothesis.get("heads") or {}
    if not isinstance(heads_in, dict) or not heads_in:
        raise HypothesisError(f"the hypothesis names no head: give 'heads': {{'L.H': role}} with roles from "
                              f"{', '.join(cc.ROLES)}")
    heads = {}
    for key, role in heads_in.items():
        h = _head(key, n_layers, n_heads, model_name)
        if role not in cc.ROLES:
            raise HypothesisError(f"{role!r} (head {head_name(*h)}) is not a role of the course; the roles are "
                                  f"{', '.join(cc.ROLES)}")
        if h in heads:
            raise HypothesisError(f"head {head_name(*h)} is named twice; give each head one role")
        heads[h] = role
    comps = []
    for item in hypothesis.get("compositions") or ():
        if not (isinstance(item, (tuple, list)) and len(item) == 3):
            raise HypothesisError(f"a composition is (writer, reader, kind), e.g. ('0.1', '1.0', 'K'); got {item!r}")
        w, r = (_head(x, n_layers, n_heads, model_name) for x in item[:2])
        kind = str(item[2]).upper()
        if kind not in cc.KINDS:
            raise HypothesisError(f"composition kind {item[2]!r} is not one of Q, K, V")
        if w[0] >= r[0]:
            raise HypothesisError(f"{head_name(*w)}->{head_name(*r)}: a head composes with a head of an earlier "
                                  "layer; write (writer, reader, kind), writer first")
        for x in (w, r):
            if x not in heads:
                raise HypothesisError(f"composition {head_name(*w)}->{head_name(*r)} names head {head_name(*x)}, "
                                      "which has no role in 'heads'; give it one or drop the composition")
        if (w, r, kind) in comps:
            raise HypothesisError(f"composition {head_name(*w)}->{head_name(*r)} {kind} is named twice; "
                                  "name each (writer, reader, kind) once")
        comps.append((w, r, kind))
    return Hypothesis(model_name, heads, tuple(comps))


@dataclass
class Grade:
    """What the grader measured: ``passed``, the numbers, and one line per failing part."""

    passed: bool
    faithfulness: float | None = None
    completeness: float | None = None
    failures: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(textwrap.fill(line, WIDTH, subsequent_indent="    ", break_long_words=False,
                                        break_on_hyphens=False) for line in self.lines)

    @property
    def first_failure(self) -> str | None:
        return self.failures[0] if self.failures else None


class Grader:
    """Grades hypotheses about ``model`` on ``task`` (the measurements are made once, then reused)."""

    def __init__(self, name: str, model, task, n_rows: int = 256, role_rows: int = 64):
        # rows of the task for the ablations, and of random tokens for the role scores
        self.name, self.model, self.task, self.n_rows, self.role_rows = name, model, task, n_rows, role_rows

    @functools.cached_property
    def roles(self):
        return cc.role_scores(self.model, self.task, n_rows=self.role_rows)

    @functools.cached_property
    def z(self):
        return cc.composition_z(self.model) if self.model.cfg.n_layers > 1 else {}

    @functools.cached_property
    def ablator(self):
        return cc.Ablator(self.model, self.task, n_rows=self.n_rows)

    def role_table(self) -> str:
        """Every head's score for every role, one row a head, under a row of the roles' levels (``*``:
        at or above the level; ``+``: at or above it by less than the margin of
        :mod:`attncircuits.analysis.definitions`, ``~``: under it by less: knife edges)."""
        cols = list(cc.ROLES)
        short = {r: cc.ROLES[r].short for r in cols}
        lines = ["head " + " ".join(f"{short[r]:>8}" for r in cols),
                 "level" + " ".join(f"{cc.ROLES[r].threshold:>7.2f} " for r in cols)]
        n_layers, n_heads = self.model.cfg.n_layers, self.model.cfg.n_heads
        for layer in range(n_layers):
            for h in range(n_heads):
                cells = []
                for r in cols:
                    v = float(self.roles[r][layer, h])
                    cells.append(f"{v:>7.2f}{_mark(v, cc.ROLES[r].threshold)}")
                lines.append(f"{head_name(layer, h):>4} " + " ".join(cells))
        return "\n".join(lines)

    def parse(self, hypothesis) -> Hypothesis:
        return parse(hypothesis, self.name, self.model.cfg.n_layers, self.model.cfg.n_heads)

    def grade(self, hypothesis, show: bool = True) -> Grade:
        """Grade ``hypothesis``; print the report when ``show``. Bad input prints its one line."""
        try:
            hyp = self.parse(hypothesis)
        except HypothesisError as err:
            g = Grade(False, failures=[str(err)], lines=[f"✗ cannot grade: {err}"])
            if show:
                print(g)
            return g
        g = self._grade(hyp)
        if show:
            print(g)
        return g

    def _grade(self, hyp: Hypothesis) -> Grade:
        fails: list[str] = []
        best = cc.best_roles(self.roles)
        for h, role in sorted(hyp.heads.items()):
            r = cc.ROLES[role]
            score = float(self.roles[role][h])
            if score < r.threshold:
                fails.append(f"role: {head_name(*h)} as {role}: score {score:.2f}, needs {r.threshold:.2f} "
                             f"({r.what}; chapter {r.chapter}){_near(score, r.threshold, D.MARGIN)}")
            elif best.get(h) != role:
                fails.append(f"role: {head_name(*h)} as {role}: score {score:.2f} passes, but another role "
                             f"fits {head_name(*h)} better (score over threshold; chapters 4-6)")
        for w, r, kind in hyp.compositions:
            z = self.z[(w, r, kind)]
            if z < cc.COMPOSES:
                fails.append(f"composition: {head_name(*w)}->{head_name(*r)} {kind}: {z:+.1f} baseline sd, "
                             f"needs {cc.COMPOSES:+.1f} (chapter 5){_near(z, cc.COMPOSES, D.COMPOSES.margin)}")
        first = min(layer for layer, _ in hyp.heads)
        read = {r for _, r, _ in hyp.compositions}
        for h in sorted(hyp.heads):
            if h[0] > first and h not in read:
                fails.append(f"composition: {head_name(*h)} reads no named head (no Q, K or V composition "
                             "into it is named; chapter 5)")
        ab = self.ablator
        shares = cc.group_shares(ab, hyp.heads)
        for role, share in shares.items():
            if share < cc.NEEDED:
                named = ", ".join(head_name(*h) for h, x in sorted(hyp.heads.items()) if x == role)
                adds = (f"add {share:.0%} of the task" if share >= 0.005 else "add nothing to the task"
                        + ("" if share > -0.005 else f" (ablating them too does {-share:.0%} better)"))
                fails.append(f"needed: the {role} heads ({named}) {adds}, needs {cc.NEEDED:.0%} "
                             "(chapter 6's ablations)")
        faith, comp = ab.faithfulness(hyp.heads), ab.completeness(hyp.heads)
        if faith < cc.FAITHFUL:
            fails.append(f"faithfulness: the named heads alone {_recover(faith)}, needs {cc.FAITHFUL:.0%}")
        if comp < cc.COMPLETE:
            fails.append(f"completeness: ablating the named heads removes {comp:.0%} of the task, needs "
                         f"{cc.COMPLETE:.0%}")
        gap = cc.left_out(ab, hyp.heads)
        if gap.gap > cc.LEFT_OUT:
            names = ", ".join(head_name(*h) for h in gap.removed)
            which, whose = ((names, f"{names}'s") if len(gap.removed) == 1 else
                            (f"the {hyp.heads[gap.removed[0]]} heads ({names})", "their"))
            model = f"{gap.in_model:.0%}" if gap.in_model >= 0 else "less than none"
            fails.append(f"left out: without {which}, the other named heads {_recover(gap.in_circuit)} and the "
                         f"whole model {model}: a head you did not name does {whose} work too (at most "
                         f"{cc.LEFT_OUT:.0%} apart; chapter 6's ablations)")
        n_h, n_c = len(hyp.heads), len(hyp.compositions)
        lines = [f"{self.name}: {n_h} head{'s' * (n_h != 1)}, {n_c} composition{'s' * (n_c != 1)} named",
                 f"  faithfulness {faith:.2f}  completeness {comp:.2f}  (each needs "
                 f"{cc.FAITHFUL:.2f})"]
        lines += [f"~ role: {head_name(*h)} as {role} passes by less than {D.MARGIN:g} "
                  f"({float(self.roles[role][h]):.3f}, needs {cc.ROLES[role].threshold:.2f}): another run may not"
                  for h, role in sorted(hyp.heads.items())
                  if 0 <= float(self.roles[role][h]) - cc.ROLES[role].threshold < D.MARGIN]
        if fails:
            lines += [f"✗ {f}" for f in fails]
            explain = f"{faith:.0%}" if faith > 0 else "none"
            lines.append(f"✗ not yet: {len(fails)} "
                         f"{'part fails' if len(fails) == 1 else 'parts fail'}; the named heads "
                         f"explain {explain} of the task")
        else:
            lines.append("✓ passes: every role, composition and ablation checks out")
        return Grade(not fails, faith, comp, fails, lines)


def _mark(score: float, level: float) -> str:
    near = abs(score - level) < D.MARGIN
    return ("+" if near else "*") if score >= level else ("~" if near else " ")


def _near(score: float, level: float, margin: float) -> str:
    """The note a failure near its level carries: another run may land on the other side."""
    return f"; near the level (within {margin:g}): another run may pass it" if abs(score - level) < margin else ""


def _recover(share: float) -> str:
    return f"recover {share:.0%} of the task" if share >= 0 else "do worse than no heads at all"


@functools.lru_cache(maxsize=None)
def grader_for(name: str) -> Grader:
    """The grader of shipped mystery ``name`` (or of chapter 6's ``attn-only-2l`` on repeated
    random tokens, the course's own known circuit)."""
    if name == "attn-only-2l":
        model = load_pretrained("attn-only-2l").model
        return Grader(name, model, Repeated(model.cfg.d_vocab, model.cfg.n_ctx, seq_len=40), n_rows=32, role_rows=16)
    m = load_mystery(name)
    return Grader(name, m.model, m.task)


def grade(hypothesis, show: bool = True) -> Grade:
    """Grade a hypothesis against the model its ``'model'`` names; bad input: one line."""
    name = hypothesis.get("model") if isinstance(hypothesis, dict) else None
    allowed = [*mystery_names(), "attn-only-2l"]
    if name not in allowed:
        said = "names no model" if name is None else f"names {name!r}"
        msg = f"the hypothesis {said}; set 'model' to one of {', '.join(allowed)}"
        g = Grade(False, failures=[msg], lines=[f"✗ cannot grade: {msg}"])
        if show:
            print(g)
        return g
    return grader_for(name).grade(hypothesis, show)


def grade_function(fn, show: bool = True) -> Grade | None:
    """Grade the hypothesis that ``fn()`` returns (an exercise's function); one line, and None,
    while ``fn`` is still a stub, so that a learner's notebook runs on."""
    try:
        hypothesis = fn()
    except NotImplementedError:
        print(f"○ {getattr(fn, '__name__', 'your function')} is not written yet: return a hypothesis dict")
        return None
    return grade(hypothesis, show)
