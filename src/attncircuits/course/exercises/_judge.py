"""Judging one output of a learner's function: right, or the first thing wrong with it (its
type, its structure, a named mistake that reproduces it, or a symptom computed from the answer).

Part of the check machinery (see :mod:`._core`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attncircuits.course.exercises._case import Case, Diagnosis, _Stop
from attncircuits.course.exercises._compare import _close, _finite, _generic_mismatch, _numbers_as_list, _structure
from attncircuits.course.exercises._contract import wrong_type


def _dims(case: Case) -> dict[str, int]:
    """Sizes a factor in a wrong answer may be: a model's d_head, d_model, n_heads, ... among the
    case's arguments."""
    dims: dict[str, int] = {}
    for a in case.args:
        cfg = getattr(a, "cfg", None)
        for name in ("d_head", "n_heads", "d_model", "n_ctx"):
            v = getattr(cfg, name, None)
            if isinstance(v, int) and name not in dims:
                dims[name] = v
        if isinstance(a, Tensor):
            for i, n in enumerate(a.shape):
                dims.setdefault(f"length of the input's axis {i}", n)
    return dims


def _fits(diagnosis: Diagnosis, case: Case, expected, got, canonical, atol, rtol) -> bool:
    """Whether the learner's output on ``case`` is what ``diagnosis``'s mistake gives there (True
    when the diagnosis says nothing about that case). A property (``applies``) must hold on every
    case where the output is wrong: a property that holds on one case only is no diagnosis."""
    if diagnosis.applies is not None:
        try:
            with torch.no_grad():
                g = canonical(got) if canonical else got
                e = canonical(expected) if canonical else expected
                if _close(g, e, atol, rtol):
                    return True  # right here: nothing to explain
                return bool(diagnosis.applies(got, expected, case))
        except Exception:  # the property cannot be read off this output: not verified
            return False
    try:
        with torch.no_grad():
            wrong = diagnosis.wrong(expected, case)
        if wrong is None:
            return True
        g = canonical(got) if canonical else got
        w = canonical(wrong) if canonical else wrong
        return _close(_nan_marked(g), _nan_marked(w), atol, rtol)  # the mistake's NaN is the learner's
    except Exception:
        return True


_NAN = 1.2345e30  # stands for NaN when a mistake's output is compared with the learner's


def _nan_marked(x):
    if isinstance(x, Tensor) and x.is_floating_point():
        return torch.nan_to_num(x, nan=_NAN, posinf=float("inf"), neginf=float("-inf"))
    if isinstance(x, float) and x != x:
        return _NAN
    if isinstance(x, (list, tuple)):
        return type(x)(_nan_marked(v) for v in x)
    return x


def _another(got, case, reference, canonical, atol, rtol) -> str | None:
    """"this is head 2's answer" when the learner's output is the reference's on a neighbouring input."""
    if case.others is None or reference is None:
        return None
    try:
        g = canonical(got) if canonical else got
        for label, args in case.others():
            with torch.no_grad():
                other = reference(*args, **case.kwargs)
            if _close(g, canonical(other) if canonical else other, atol, rtol):
                return f"this is the answer for {label}, not for the one asked (is an index fixed, or mixed up?)"
    except Exception:
        return None
    return None


def _compare_one(got, expected, case, diagnoses, atol, rtol, canonical, compare, reference=None, returns=None,
                 outputs=None):
    """(None, []) when ``got`` is right; else (the message, the named diagnoses that match here, to
    be confirmed on the other cases). The wrong type (``returns``) and structure problems raise
    _Stop directly; ``outputs`` names the items of a tuple in messages."""
    bad_type = wrong_type(got, returns)
    if bad_type:
        raise _Stop(bad_type)
    if compare is not None:
        return compare(got, expected, case), []  # None or a message
    got = _numbers_as_list(got, expected)
    try:
        _structure(got, expected, finite=canonical is None)
    except _Stop as stop:  # a wrong type or shape: a property of the output may still name it,
        found = []  # once it holds on the other cases too
        for diagnosis in diagnoses:
            try:
                if diagnosis.applies is not None and diagnosis.applies(got, expected, case):
                    found.append(diagnosis)
            except Exception:
                continue
        if found:
            return stop.message, found
        raise
    g = canonical(got) if canonical else got
    e = canonical(expected) if canonical else expected
    _finite(g, e)  # after canonical: entries it leaves out (the masked part) may be anything
    if _close(g, e, atol, rtol):
        return None, []
    if isinstance(e, Tensor) and isinstance(g, Tensor) and g.shape == e.shape and bool((g == 0).all()) and bool((e != 0).any()):
        return "your output is all zeros (nothing was written into it, or everything was masked)", []
    candidates: list[Diagnosis] = []
    for diagnosis in diagnoses:
        try:
            with torch.no_grad():
                if diagnosis.applies is not None:
                    if diagnosis.applies(got, expected, case):
                        candidates.append(diagnosis)
                    continue
                wrong = diagnosis.wrong(expected, case)
        except Exception:  # a diagnosis that does not apply to this case
            continue
        if wrong is None:
            continue
        w = canonical(wrong) if canonical else wrong
        if _close(g, w, atol, rtol) and not _close(w, e, atol, rtol):
            candidates.append(diagnosis)

    def generic() -> str:
        return _another(got, case, reference, canonical, atol, rtol) or _generic_mismatch(g, e, atol, rtol, _dims(case), outputs)

    return generic, candidates


