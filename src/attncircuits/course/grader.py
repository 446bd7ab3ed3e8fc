"""Chapter 12's grader, for the chapter and its checks: :func:`grader_for` a shipped mystery (or
the course's own ``attn-only-2l``), :func:`grade` a hypothesis against the model it names, and
:func:`grade_function` an exercise's function. What a hypothesis is and the grader's rules are in
:mod:`attncircuits.analysis.hypothesis` and :mod:`attncircuits.analysis.grading` (a room below, so
that the mystery trainer grades what it derives with the same rules).
"""

from __future__ import annotations

import functools

from attncircuits.analysis.grading import Grade, Grader
from attncircuits.analysis.hypothesis import KEYS, Hypothesis, HypothesisError, parse, shown
from attncircuits.checkpoints.mysteries import load_mystery, mystery_names
from attncircuits.checkpoints.pretrained import load_pretrained
from attncircuits.data.tasks import Repeated

__all__ = ["Grade", "Grader", "Hypothesis", "HypothesisError", "KEYS", "grade", "grade_function", "grader_for",
           "parse"]


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
    if not (isinstance(name, str) and name in allowed):
        said = "names no model" if name is None else f"names {shown(name)}"
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
