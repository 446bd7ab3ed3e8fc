"""What the course's words mean: one definition per head role and per verdict.

Every chapter, the detectors, the grader (:mod:`attncircuits.course.grader`), the mysteries'
ground truth (:mod:`attncircuits.analysis.circuit_check`), the phase change
(:mod:`attncircuits.analysis.phase`) and the reproduction runs read their levels from here; a test
(``tests/test_definitions.py``) fails when a chapter compares a score with a number of its own.

Each :class:`Level` names a word ("an induction head"), the quantity it is read from and the value
the quantity must reach (``score >= value``). A score within :data:`MARGIN` of the value is *near*
the level: a verdict on it says so instead of flipping silently (another training run may put the
same head on the other side). A score under half the value is *far below* it: "no
induction head in layer 0" means every layer-0 score is under half of :data:`INDUCTION_HEAD`.

Two different things were once called by one word and now have two names:

* :data:`INDUCTION_HEAD` (prefix matching >= 0.3) says which *heads* are induction heads;
* :data:`FORMED` (the best head's prefix matching >= 0.5) says when a *model* has formed its
  induction heads during training, the level its phase change is read against (chapters 7, 11,
  13). A head at 0.4 is an induction head in a model that has not yet formed them.

Why these values. Olsson et al. (2022) define an induction head by what it does on repeated
random tokens (prefix matching, with copying) and rank heads by the score rather than cut it at
a fixed value; a cut only has to fall in the gap between the heads that do it and those that do
not. 0.3 is over seven times the uniform share of a 25-token window and falls in that gap for
the shipped two-layer and four-layer models (their heads' prefix matching, 25 random tokens x 4,
is under 0.22 or above 0.85). The same 0.3 is the level of every other attention role (a head
"attends where its role says" when 0.3 of its attention goes there), so a previous-token head and
an induction head are judged alike. A copying score (chapter 4: Elhage et al. (2021)'s positive
eigenvalue share, or chapter 4's score on the logits) counts a head as copying from 0.5: what it
writes promotes the token it reads more often than not. :data:`FORMED` is 0.5, the level chapter
7's live run trains to, above the 0.3 of a single head so that "formed" means the rise is well
under way and not one head crossing the cut. A positional head (chapter 3) puts over half of its
position-only attention at one offset (or on the last few tokens).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from attncircuits.core.heads import head_name

WIDTH = 79  # the book's code column

#: how close to a level a score is *near* it (a knife edge another training run may cross)
MARGIN = 0.05


@dataclass(frozen=True)
class Level:
    """A word defined by a quantity reaching a value: ``score >= value``."""

    word: str  # what the level defines, e.g. "an induction head"
    quantity: str  # the score it is read from, e.g. "prefix matching"
    value: float
    margin: float = MARGIN

    def __str__(self) -> str:
        return f"{self.quantity} >= {self.value:g}"

    def holds(self, score):
        """``score`` reaches the level (elementwise on a tensor or array)."""
        return score >= self.value

    def clearly(self, score):
        """``score`` reaches the level by more than its margin."""
        return score >= self.value + self.margin

    def far_below(self, score):
        """``score`` is under half the level: nothing like the word at all."""
        return score < self.value / 2

    def near(self, score) -> bool:
        """``score`` lies within the margin of the level, on either side."""
        return abs(float(score) - self.value) < self.margin

    def verdict(self, score) -> str:
        """``"0.32 >= 0.3 (near the level)"``: the score, which side and whether it is near."""
        s = float(score)
        side = ">=" if s >= self.value else "<"
        near = " (near the level)" if self.near(s) else ""
        return f"{s:.2f} {side} {self.value:g}{near}"

    def heads(self, scores) -> list[tuple[int, int]]:
        """The ``(layer, head)`` whose score ``[layer, head]`` reaches the level."""
        return [(int(l), int(h)) for l, h in (scores >= self.value).nonzero().tolist()]

    def named(self, heads, scores) -> str:
        """``"1.0 (0.91), 1.1 (0.32, near)"``: the heads with their scores, the near ones marked."""
        return ", ".join(
            f"{head_name(l, h)} ({float(scores[l, h]):.2f}{', near' if self.near(scores[l, h]) else ''})"
            for l, h in heads) or "none"

    def line(self, what: str, scores, indent: str = "", heads=None) -> str:
        """``"induction heads (prefix matching >= 0.3): 1.0 (0.91), 1.1 (0.90)"``, folded to the
        book's 79 columns (``heads``: those to list, by default every head that reaches the level)."""
        heads = self.heads(scores) if heads is None else heads
        return textwrap.fill(f"{what} ({self}): {self.named(heads, scores)}", WIDTH,
                             initial_indent=indent, subsequent_indent=indent + "    ")


#: where a head attends: an attention role holds when this share of its attention goes there
ATTENDS = Level("a head with an attention role", "attention where the role says", 0.3)
#: chapter 6: attention to the token after an earlier copy of the current one, 25 random tokens x 4
INDUCTION_HEAD = Level("an induction head", "prefix matching", ATTENDS.value)
#: chapter 6: attention to the previous token, on text (or random tokens in the grader)
PREVIOUS_TOKEN_HEAD = Level("a previous-token head", "previous-token score", ATTENDS.value)
#: chapter 6: attention to an earlier copy of the current token
DUPLICATE_TOKEN_HEAD = Level("a duplicate-token head", "duplicate-token score", ATTENDS.value)
#: chapter 4: what a head writes promotes what it reads (logits of the attended token)
COPYING_HEAD = Level("a copying head", "copying score", 0.5)
#: chapter 4: the same read from the OV circuit's eigenvalues (share with a positive real part)
COPYING_EIGEN = Level("a copying head", "positive-eigenvalue share", 0.5)
#: chapter 4: the attended token maps to the task's answer (not to itself) for one cue
SKIP_TRIGRAM_HEAD = Level("a skip-trigram head", "skip-trigram score", 0.5)
#: chapter 5: a composition is real this many baseline deviations above chance
COMPOSES = Level("a composition", "composition z", 3.0, margin=0.5)
#: chapter 3: a head attends by position (from W_pos alone) at offset 0, 1 or the last few tokens
POSITIONAL_HEAD = Level("a positional head", "attention by position at a fixed offset", 0.5)
#: chapters 7, 11, 13: a model has formed induction heads (the phase change's level)
FORMED = Level("formed induction heads", "the best head's prefix matching", 0.5)

#: every definition, for the book's table and the tests
ALL: dict[str, Level] = {
    "ATTENDS": ATTENDS, "INDUCTION_HEAD": INDUCTION_HEAD, "PREVIOUS_TOKEN_HEAD": PREVIOUS_TOKEN_HEAD,
    "DUPLICATE_TOKEN_HEAD": DUPLICATE_TOKEN_HEAD, "COPYING_HEAD": COPYING_HEAD,
    "COPYING_EIGEN": COPYING_EIGEN, "SKIP_TRIGRAM_HEAD": SKIP_TRIGRAM_HEAD, "COMPOSES": COMPOSES,
    "POSITIONAL_HEAD": POSITIONAL_HEAD,
    "FORMED": FORMED,
}


def table() -> str:
    """Every definition, one line each: its name, the word, the quantity and the value."""
    return "\n".join(f"{name:<21}{lv.word:<32}{lv}" for name, lv in ALL.items())
