"""Chapter 12's grader: a hypothesis (:mod:`.hypothesis`) about a model's circuit, checked against
the model itself. The grader knows no answer; it measures what the hypothesis claims with the
course's tools (:mod:`attncircuits.analysis.circuit_check`). A circuit here is what the
faithfulness literature the chapter cites calls one: a subgraph of the model, heads (nodes) and
compositions (edges), that alone performs the task (Wang et al. 2023, the IOI circuit; Conmy et
al. 2023, ACDC). Each rule, and why:

1. **role**: each named head's score for its role reaches that role's threshold (``ROLES``), and
   the role is the head's *best*: the one whose score is highest *relative to its threshold*
   (score / threshold), ``copying`` only where no other role fits, since copying says what a head
   writes and the others where it looks (:func:`~attncircuits.analysis.circuit_check.best_roles`).
   A head scoring 0.98 copying (0.5 threshold: 1.96) and 0.84 skip-induction (0.25: 3.36) is a
   skip-induction head. A role is a claim about a node; the best one, so that the verdict does
   not depend on which of two passing roles a learner happened to try.
2. **compositions** (the edges): each named composition stands at least ``COMPOSES`` baseline
   deviations above chapter 5's random baseline (Elhage et al. 2021's composition score); every
   named head of a later layer reads a named head of an earlier one, and every named head of an
   earlier layer feeds a named head of a later one (a head that neither reads nor is read has no
   edge into the circuit's path from the tokens to the answer, so naming it claims nothing the
   ablations can test; before this rule, chapters 5-6's circuit passed with two of its layer-0
   heads feeding nothing named). A hypothesis therefore lists at least one composition into each
   named head after the circuit's first layer and one out of each named head before its last.
3. **needed** (minimality, Wang et al. 2023): with two or more roles named, ablating the heads of
   one role from the named circuit loses at least ``NEEDED`` of the task. With one role the
   share is the faithfulness itself, and rule 4 says it.
4. **faithfulness and completeness** by mean-ablation (Wang et al. 2023; chapter 6): the named
   heads alone (every other head replaced by its mean output) recover at least ``FAITHFUL`` of
   the loss gap between the model and the model with every head ablated, and ablating them loses
   at least ``COMPLETE`` of it. Completeness is measured against the same gap, so it can exceed 1
   (1.01: without the named heads the model does slightly *worse* than with every head ablated,
   the other heads' mean outputs pushing it further off).
5. **nothing left out** (Wang et al. 2023's completeness per subset): removing a named head, or
   one role's heads, from the circuit loses at most ``LEFT_OUT`` more of the task than removing
   them from the whole model (:func:`~attncircuits.analysis.circuit_check.left_out`): an unnamed
   head that does a named one's work fails it, though the named heads alone may recover the task.
   It is said only of a faithful circuit: of one that is not, rule 4 already says heads are
   missing, and "a head you did not name does X's work" would point at the wrong one.
6. **skip-trigrams** (on a one-layer grammar model, mystery 2): each head named
   ``skip-trigram`` comes with the list of the skip-trigrams it implements, ``(trigger, cue,
   answer)``, and the list is exactly the head's, read from its QK and OV circuits as
   :mod:`.grammar_heads` defines it (chapter 4's reading of a head). The role alone is the task's
   own name, so naming both heads of a two-head model "skip-trigram" would claim nothing the
   learner measured; a node's claim on such a model is what it computes, as the IOI circuit's is
   (Wang et al. 2023 name each head class by the tokens it attends to and what it writes). A
   wrong skip-trigram is told which measurement fails (the attention, or the answer's rank in
   the OV row), one left out only how many are missing.

:meth:`Grader.grade` prints the numbers and one line for each part that fails, saying what was
measured, never what the answer is. These rules cannot together refuse every hypothesis about a
model that does its task only where the course's measurements do not see its circuit (a
composition the weights-only score puts under ``COMPOSES`` while the head needs it): the mystery
trainer accepts a model only when the circuit it derives passes (:mod:`attncircuits.train.mystery`).
"""
from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass, field

from attncircuits.analysis import circuit_check as cc
from attncircuits.analysis import definitions as D
from attncircuits.analysis.grammar_heads import SkipTrigrams, grammar_model
from attncircuits.analysis.hypothesis import Hypothesis, HypothesisError, parse
from attncircuits.core.heads import head_name

__all__ = ["Grade", "Grader", "WIDTH"]

WIDTH = 79  # the book's code column


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

    @functools.cached_property
    def skip_trigrams(self) -> SkipTrigrams | None:
        """What each head of a one-layer grammar model implements (rule 6); None on other models."""
        return SkipTrigrams(self.model, self.task) if grammar_model(self.model, self.task) else None

    def parse(self, hypothesis) -> Hypothesis:
        return parse(hypothesis, self.name, self.model.cfg.n_layers, self.model.cfg.n_heads, self.model, self.task)

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
        last = max(layer for layer, _ in hyp.heads)
        wrote = {w for w, _, _ in hyp.compositions}
        for h in sorted(hyp.heads):
            if h[0] > first and h not in read:
                fails.append(f"composition: {head_name(*h)} reads no named head (no Q, K or V composition "
                             "into it is named; chapter 5)")
            if h[0] < last and h not in wrote:
                fails.append(f"composition: {head_name(*h)} feeds no named head (no composition out of it is "
                             "named: a head of an earlier layer is in the circuit through a later named head "
                             "that reads it; chapter 5)")
        fails += self._skip_trigram_failures(hyp)
        ab = self.ablator
        faith, comp = ab.faithfulness(hyp.heads), ab.completeness(hyp.heads)
        shares = cc.group_shares(ab, hyp.heads)
        for role, share in shares.items():
            if share < cc.NEEDED and len(shares) > 1:  # one role: its share is the faithfulness, said below
                named = ", ".join(head_name(*h) for h, x in sorted(hyp.heads.items()) if x == role)
                adds = (f"add {share:.0%} of the task" if share >= 0.005 else "add nothing to the task"
                        + ("" if share > -0.005 else f" (ablating them too does {-share:.0%} better)"))
                why = ("" if faith >= cc.FAITHFUL else
                       f"; the named heads together {_recover(faith)}, so what these heads work with (the "
                       "heads that feed them, or that they feed) may be unnamed, and ablated here")
                fails.append(f"needed: the {role} heads ({named}) {adds} to the other named heads, needs "
                             f"{cc.NEEDED:.0%} (chapter 6's ablations){why}")
        if faith < cc.FAITHFUL:
            fails.append(f"faithfulness: the named heads alone {_recover(faith)}, needs {cc.FAITHFUL:.0%}: "
                         "the task needs heads you did not name (ablated here), in these layers or others")
        if comp < cc.COMPLETE:
            fails.append(f"completeness: ablating the named heads removes {comp:.0%} of the task, needs "
                         f"{cc.COMPLETE:.0%}")
        gap = cc.left_out(ab, hyp.heads)
        if gap.gap > cc.LEFT_OUT and faith >= cc.FAITHFUL:  # else the faithfulness line says it
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


    def _skip_trigram_failures(self, hyp: Hypothesis) -> list[str]:
        """Rule 6: each skip-trigram head's list is exactly its skip-trigrams (a grammar model)."""
        st = self.skip_trigrams
        if st is None:
            return []
        names, fails = self.task.token_names(), []
        for h in sorted(h for h, role in hyp.heads.items() if role == "skip-trigram"):
            if h not in hyp.skip_trigrams:
                fails.append(f"skip-trigrams: {head_name(*h)} is named skip-trigram with no list of what it implements: "
                             f"give 'skip_trigrams': {{'{head_name(*h)}': [(trigger, cue, answer), ...]}}, read from its "
                             "QK and OV circuits (chapter 4)")
                continue
            listed, true = hyp.skip_trigrams[h], st.of(h[1])
            for triple in sorted(listed - true, key=lambda x: (x[1], x[0])):
                fails.append(f"skip-trigrams: {head_name(*h)} does not implement "
                             f"{names[triple[0]]} ... {names[triple[1]]} -> {names[triple[2]]}: "
                             f"{st.why_not(h[1], triple)}")
            if missing := len(true - listed):
                fails.append(f"skip-trigrams: {head_name(*h)} implements {missing} skip-trigram{'s' * (missing != 1)} "
                             "your list leaves out (a trigger it attends to from a cue, over half its attention, "
                             "with the answer its OV circuit ranks first for it)")
        return fails


def _mark(score: float, level: float) -> str:
    near = abs(score - level) < D.MARGIN
    return ("+" if near else "*") if score >= level else ("~" if near else " ")


def _near(score: float, level: float, margin: float) -> str:
    """The note a failure near its level carries: another run may land on the other side."""
    return f"; near the level (within {margin:g}): another run may pass it" if abs(score - level) < margin else ""


def _recover(share: float) -> str:
    return f"recover {share:.0%} of the task" if share >= 0 else "do worse than no heads at all"
