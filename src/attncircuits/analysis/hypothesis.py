"""A circuit hypothesis, parsed strictly: what chapter 12's grader (:mod:`.grading`) grades.

A hypothesis is a small dict::

    {"model": "mystery-2",
     "heads": {"0.1": "two-back", "1.0": "skip-induction"},     # head -> a role of ROLES
     "compositions": [("0.1", "1.0", "K")]}                      # writer, reader, Q/K/V

A head is ``"L.H"`` (digits) or a pair of ints, a role one string of
:data:`~attncircuits.analysis.circuit_check.ROLES`, the compositions a list of (writer, reader,
kind) with kind one of ``'Q'``, ``'K'``, ``'V'``. Anything else (a float or a bool for a head, a
nested list, a role given as a list, compositions given as an int) is refused in one line naming
the form (:class:`HypothesisError`); nothing is rounded, truncated or coerced into a head.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from attncircuits.analysis import circuit_check as cc
from attncircuits.checkpoints.mysteries import mystery_names
from attncircuits.core.heads import Head, head_name

__all__ = ["Hypothesis", "HypothesisError", "KEYS", "parse", "shown"]

KEYS = ("model", "heads", "compositions")


class HypothesisError(ValueError):
    """A hypothesis that cannot be graded; the message is one line naming what is allowed."""


@dataclass(frozen=True)
class Hypothesis:
    model: str
    heads: dict[Head, str]
    compositions: tuple[tuple[Head, Head, str], ...]


def _heads_allowed(n_layers: int, n_heads: int) -> str:
    return " and ".join(f"{layer}.0-{layer}.{n_heads - 1}" for layer in range(n_layers))


HEAD_FORM = "a head is 'L.H' (layer.head, e.g. '0.1') or a pair of ints (0, 1)"
COMP_FORM = "a composition is (writer, reader, kind), e.g. ('0.1', '1.0', 'K')"
FORM = "{'model': ..., 'heads': {'L.H': role}, 'compositions': [(writer, reader, 'Q'|'K'|'V')]}"


def _is_int(x) -> bool:
    """An int of Python's or numpy's, never a bool (``True`` is no layer) nor a float (``1.7`` is
    no head: ``int()`` would make it one)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _head(value, n_layers: int, n_heads: int, model: str) -> Head:
    """``value`` as a head: ``"L.H"`` (digits only) or a pair of ints; anything else refused in
    one line naming the form (nothing is rounded or truncated into a head)."""
    allowed = f"{model}'s heads are {_heads_allowed(n_layers, n_heads)}"
    parts = None
    if isinstance(value, str):
        pieces = value.strip().split(".")
        if len(pieces) == 2 and all(p.isascii() and p.isdigit() for p in pieces):
            parts = tuple(int(p) for p in pieces)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(p) for p in value):
        parts = tuple(int(p) for p in value)
    if parts is None:
        raise HypothesisError(f"{shown(value)} is not a head: {HEAD_FORM}; {allowed}")
    layer, head = parts
    if not (0 <= layer < n_layers and 0 <= head < n_heads):
        raise HypothesisError(f"{model} has no head {layer}.{head}: {allowed}")
    return layer, head


def shown(value, limit: int = 40) -> str:
    """``value`` as a short repr with its type where the repr hides it (a one-line message)."""
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text if isinstance(value, (str, tuple, list, dict)) else f"{text} ({type(value).__name__})"


def parse(hypothesis, model_name: str, n_layers: int, n_heads: int) -> Hypothesis:
    """The hypothesis as a :class:`Hypothesis`, or a :class:`HypothesisError` in one line: any
    value JSON or Python can hold is either a hypothesis or refused naming the form it breaks."""
    if not isinstance(hypothesis, dict):
        raise HypothesisError(f"a hypothesis is a dict {FORM}, got {type(hypothesis).__name__}")
    unknown = sorted(set(map(str, hypothesis)) - set(KEYS))
    if unknown:
        raise HypothesisError(f"unknown key {unknown[0]!r} in the hypothesis; its keys are {', '.join(KEYS)}")
    got = hypothesis.get("model")
    if not (isinstance(got, str) and got == model_name):
        others = ", ".join(n for n in [*mystery_names(), "attn-only-2l"] if n != model_name)
        said = "names no model" if got is None else f"is about {shown(got)}"
        raise HypothesisError(f"this hypothesis {said}; this grader grades {model_name!r} (set 'model': "
                              f"{model_name!r}, or grade it with grader_for one of {others})")
    heads_in = hypothesis.get("heads")
    roles = ", ".join(cc.ROLES)
    if heads_in is not None and not isinstance(heads_in, dict):
        raise HypothesisError(f"'heads' is a dict {{'L.H': role}}, got {type(heads_in).__name__}; the roles are "
                              f"{roles}")
    if not heads_in:
        raise HypothesisError(f"the hypothesis names no head: give 'heads': {{'L.H': role}} with roles from {roles}")
    heads = {}
    for key, role in heads_in.items():
        h = _head(key, n_layers, n_heads, model_name)
        if not isinstance(role, str) or role not in cc.ROLES:
            what = "is not a role of the course" if isinstance(role, str) else "is not a role: a role is one string"
            raise HypothesisError(f"{shown(role)} (head {head_name(*h)}) {what}; the roles are {roles}")
        if h in heads:
            raise HypothesisError(f"head {head_name(*h)} is named twice; give each head one role")
        heads[h] = role
    comps_in = hypothesis.get("compositions")
    if comps_in is None:
        comps_in = ()
    if not isinstance(comps_in, (list, tuple)):
        raise HypothesisError(f"'compositions' is a list of (writer, reader, kind), e.g. [('0.1', '1.0', 'K')] "
                              f"or [] for none, got {type(comps_in).__name__}")
    comps = []
    for item in comps_in:
        if not (isinstance(item, (tuple, list)) and len(item) == 3):
            raise HypothesisError(f"{COMP_FORM}; got {shown(item)}")
        w, r = (_head(x, n_layers, n_heads, model_name) for x in item[:2])
        if not isinstance(item[2], str) or item[2].strip().upper() not in cc.KINDS:
            raise HypothesisError(f"composition kind {shown(item[2])} is not one of 'Q', 'K', 'V'")
        kind = item[2].strip().upper()  # as a head's "L.H", spaces around it are no mistake
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
