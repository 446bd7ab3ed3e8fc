"""A circuit hypothesis, parsed strictly: what chapter 12's grader (:mod:`.grading`) grades.

A hypothesis is a small dict::

    {"model": "mystery-2",
     "heads": {"0.1": "two-back", "1.0": "skip-induction"},     # head -> a role of ROLES
     "compositions": [("0.1", "1.0", "K")]}                      # writer, reader, Q/K/V

On a one-layer grammar model (mystery 2) a skip-trigram head's role is what the head does, and a
hypothesis says it: ``"skip_trigrams": {"0.0": [("T3", "cue1", "A2"), ...]}``, each head's
skip-trigrams as (source, destination, output) = (trigger, cue, answer), by the task's token names
or ids (:mod:`.grammar_heads`).

A head is ``"L.H"`` (digits) or a pair of ints, a role one string of
:data:`~attncircuits.analysis.circuit_check.ROLES`, the compositions a list of (writer, reader,
kind) with kind one of ``'Q'``, ``'K'``, ``'V'``. Anything else (a float or a bool for a head, a
nested list, a role given as a list, compositions given as an int) is refused in one line naming
the form (:class:`HypothesisError`); nothing is rounded, truncated or coerced into a head or a
token.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from attncircuits.analysis import circuit_check as cc
from attncircuits.analysis.grammar_heads import grammar_model
from attncircuits.checkpoints.mysteries import mystery_names
from attncircuits.core.heads import Head, head_name

__all__ = ["Hypothesis", "HypothesisError", "KEYS", "from_truth", "parse", "shown"]

KEYS = ("model", "heads", "compositions", "skip_trigrams")


class HypothesisError(ValueError):
    """A hypothesis that cannot be graded; the message is one line naming what is allowed."""


@dataclass(frozen=True)
class Hypothesis:
    model: str
    heads: dict[Head, str]
    compositions: tuple[tuple[Head, Head, str], ...]
    #: a grammar model's skip-trigram heads: each one's (trigger, cue, answer) token ids
    skip_trigrams: dict[Head, frozenset[tuple[int, int, int]]] = field(default_factory=dict)


def _heads_allowed(n_layers: int, n_heads: int) -> str:
    return " and ".join(f"{layer}.0-{layer}.{n_heads - 1}" for layer in range(n_layers))


HEAD_FORM = "a head is 'L.H' (layer.head, e.g. '0.1') or a pair of ints (0, 1)"
COMP_FORM = "a composition is (writer, reader, kind), e.g. ('0.1', '1.0', 'K')"
TRIGRAM_FORM = "a skip-trigram is (trigger, cue, answer) by token name or id, e.g. ('T3', 'cue1', 'A2')"
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


def parse(hypothesis, model_name: str, n_layers: int, n_heads: int, model=None, task=None) -> Hypothesis:
    """The hypothesis as a :class:`Hypothesis`, or a :class:`HypothesisError` in one line: any
    value JSON or Python can hold is either a hypothesis or refused naming the form it breaks.
    ``model`` and ``task`` (the grader's) say whether ``'skip_trigrams'`` is asked, and its tokens."""
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
    trigrams = _skip_trigrams(hypothesis.get("skip_trigrams"), heads, n_layers, n_heads, model_name, model, task)
    return Hypothesis(model_name, heads, tuple(comps), trigrams)


def from_truth(name: str, truth: dict) -> dict:
    """The hypothesis a mystery's ground truth (``ground_truth.json``, or
    :func:`~attncircuits.analysis.circuit_check.derive_circuit`'s dict) states about model ``name``."""
    hyp = {"model": name, "heads": dict(truth["heads"]), "compositions": [tuple(c) for c in truth["compositions"]]}
    if "skip_trigrams" in truth:
        hyp["skip_trigrams"] = {h: [tuple(x) for x in v] for h, v in truth["skip_trigrams"].items()}
    return hyp


def _token(value, task, names: list[str]) -> int | None:
    """``value`` as a token id of ``task``: one of its token names or an int id; else None."""
    if isinstance(value, str):
        return names.index(value.strip()) if value.strip() in names else None
    return int(value) if _is_int(value) and 0 <= value < len(names) else None


def _skip_trigrams(given, heads: dict, n_layers: int, n_heads: int, model_name: str, model, task) -> dict:
    """``'skip_trigrams'`` parsed: each named skip-trigram head's set of (trigger, cue, answer)."""
    if given is None:
        return {}
    if model is None or not grammar_model(model, task):
        raise HypothesisError(f"'skip_trigrams' describes the skip-trigram heads of a one-layer grammar model "
                              f"(mystery-2); {model_name} is none: drop the key")
    if not isinstance(given, dict):
        raise HypothesisError(f"'skip_trigrams' is a dict {{'L.H': [(trigger, cue, answer), ...]}}, got "
                              f"{type(given).__name__}; {TRIGRAM_FORM}")
    names = task.token_names()
    kinds = (("trigger", task.triggers), ("cue", task.cues), ("answer", task.answer_tokens))
    out = {}
    for key, triples in given.items():
        h = _head(key, n_layers, n_heads, model_name)
        if heads.get(h) != "skip-trigram":
            has = "has no role in 'heads'" if h not in heads else f"is named {heads[h]} in 'heads'"
            raise HypothesisError(f"'skip_trigrams' lists head {head_name(*h)}, which {has}; list the "
                                  "skip-trigrams of the heads named skip-trigram")
        if h in out:
            raise HypothesisError(f"head {head_name(*h)} is listed twice in 'skip_trigrams'")
        if not isinstance(triples, (list, tuple, set, frozenset)):
            raise HypothesisError(f"head {head_name(*h)}'s skip-trigrams are a list of (trigger, cue, answer), "
                                  f"got {shown(triples)}; {TRIGRAM_FORM}")
        seen = set()
        for item in triples:
            if not (isinstance(item, (tuple, list)) and len(item) == 3):
                raise HypothesisError(f"{shown(item)} (head {head_name(*h)}) is not a skip-trigram: {TRIGRAM_FORM}")
            ids = tuple(_token(x, task, names) for x in item)
            for x, tok, (kind, allowed) in zip(item, ids, kinds):
                if tok not in allowed:
                    what = ("is no token of the task" if tok is None else
                            f"is no {kind}" if isinstance(x, str) else f"({names[tok]}) is no {kind}")
                    listed = ", ".join(names[a] for a in allowed)
                    raise HypothesisError(f"{shown(x)} in {shown(item)} (head {head_name(*h)}) {what}: "
                                          f"{TRIGRAM_FORM}; the {kind}s are {listed}")
            if ids in seen:
                raise HypothesisError(f"skip-trigram {' '.join(names[x] for x in ids)} of head {head_name(*h)} "
                                      "is listed twice")
            seen.add(ids)
        out[h] = frozenset(seen)
    return out
