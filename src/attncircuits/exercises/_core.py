"""The machinery every exercise check shares: run a learner's function safely, say what is wrong.

A chapter's check is a list of cases, the package's reference function, and named diagnoses::

    from ._core import Case, Diagnosis, run_check, shipped, random_model

    def check_attention_scores(fn) -> bool:
        model = shipped("attn-only-1l").model
        cases = [
            Case("attn-only-1l, head 0", (model, 0), kind="shipped"),
            Case("random 2-layer model", (random_model(n_layers=2, seed=1), 1), kind="random"),
        ]
        return run_check(fn, cases, reference=attention_scores, diagnoses=[
            Diagnosis("scores are not divided by sqrt(d_head)",
                      lambda ref, case: ref * math.sqrt(case.args[0].cfg.d_head)),
        ])

``run_check`` prints exactly one message (a line; wrapped at 79 columns when long, so it fits the
book's column) and returns True or False. It never raises for anything the learner's function does:

- not attempted yet: the function raises ``NotImplementedError``, returns ``...``, or returns
  ``None`` from a body that is only a docstring, ``pass`` or ``...``;
- raises inside: the exception's type and first line, and the line of the learner's code it came
  from (never a traceback);
- too slow: each call runs in a thread that is waited for at most ``time_limit`` seconds, then
  stopped (see :func:`._run._run_with_time_limit`); the message gives the time waited;
- wrong type, wrong shape (expected vs got, with "transposed" or "a missing batch axis" where
  that explains it), NaN/inf where the answer is finite, wrong device, wrong dtype;
- a value mismatch: the diagnoses are tried in order, and the first whose wrong answer matches the
  learner's output gives the message; then the generic ones (the wrong sign, the transpose, a
  constant factor); then "right on the shipped model but wrong on the random one" when the
  learner passes every case of one kind and fails another; else the largest difference and where.

Writing a check:

- :class:`Case` holds the label printed in messages, the positional and keyword arguments, and its
  ``kind`` (``"shipped"``, ``"random"`` or ``"hand-built"``). Arguments are deep-copied before
  every call, so a learner's function that edits its input in place cannot break the notebook.
  ``expected`` is computed by the reference unless given.
- :class:`Diagnosis` is a typical wrong answer (or, with ``applies``, a property of one): ``wrong(expected, case)`` transforms the
  reference's output (or recomputes from ``case.args``) into what that mistake produces, and
  ``message`` is printed when the learner's output matches it. Return ``None`` from ``wrong``
  when the mistake does not apply to a case. A diagnosis that equals the right answer on a case
  (e.g. a mask that changes nothing) is skipped there.
- ``canonical`` maps an output to what is compared, after the type and shape checks: e.g. the
  product of two factors (factors are unique only up to an invertible matrix between them), or a
  sorted list.
- ``time_limit`` (seconds per call) and ``slow_hint`` (what to say when a call runs past it).
- ``compare(got, expected, case)`` replaces the numeric comparison for outputs that are not
  tensors or numbers (e.g. a list of token triples); it returns ``None`` when they agree, else
  the message.
- Outputs may be tensors, Python numbers (a one-element tensor is accepted for a number), or tuples
  and lists of those; a dataclass or other object needs ``canonical`` or ``compare``.

The chapter's module keeps its cases small (a shipped model is loaded once per session by
:func:`shipped`; :func:`random_model` builds a seeded small model), so a check runs in well under a
second and nbval stays fast.
"""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..model import AttnOnlyConfig, AttnOnlyTransformer
from ..pretrained import load_pretrained
from ._compare import _close, _describe_type, _generic_mismatch, _structure
from ._run import _call, _Stop

__all__ = ["Case", "Diagnosis", "run_check", "shipped", "random_model", "random_tokens", "report", "WIDTH"]

WIDTH = 79  # the book's code column: printed lines wrap here
DEFAULT_TIME_LIMIT = 10.0  # seconds per call; a reference answer takes well under one

@dataclass
class Case:
    """One input the learner's function is run on; ``label`` names it in messages."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    kind: str = "shipped"  # "shipped", "random" or "hand-built"
    expected: Any = None  # the reference's output; computed by run_check when None


@dataclass
class Diagnosis:
    """A typical mistake: ``wrong(expected, case)`` is what it produces, ``message`` names it.

    Where a mistake is better recognised by a property of the learner's output than by its exact
    value (e.g. attention on future keys, whatever else is wrong), give ``applies(got, expected,
    case) -> bool`` instead of ``wrong``."""

    message: str
    wrong: Callable[[Any, Case], Any] | None = None
    applies: Callable[[Any, Any, Case], bool] | None = None


# ---- reporting -----------------------------------------------------------------------------------
def report(name: str, ok: bool | None, message: str) -> bool:
    """Print one message for check ``name``: ✓ correct, ✗ wrong, ○ not attempted. Returns ``ok``."""
    mark = {True: "✓", False: "✗", None: "○"}[ok]
    text = f"{mark} {name}: {message}"
    print(textwrap.fill(text, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))
    return bool(ok)

# ---- the check -----------------------------------------------------------------------------------
def run_check(
    fn: Callable,
    cases: Sequence[Case],
    reference: Callable | None = None,
    diagnoses: Sequence[Diagnosis] = (),
    *,
    name: str | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    canonical: Callable[[Any], Any] | None = None,
    compare: Callable[[Any, Any, Case], str | None] | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    slow_hint: str = "look for a Python loop over tokens or positions and use tensor operations",
) -> bool:
    """Run ``fn`` on every case against ``reference`` and print one message; True when all agree.

    See the module docstring for what each argument does and what the messages say.
    """
    name = name or getattr(fn, "__name__", "your function")
    try:
        if not callable(fn):
            raise _Stop(f"expected a function, got {_describe_type(fn)}; pass the function itself, without calling it")
        passed: list[Case] = []
        failed: list[tuple[Case, str]] = []
        for case in cases:
            expected = case.expected
            if expected is None:
                if reference is None:
                    raise ValueError(f"case {case.label!r} has no expected value and the check has no reference")
                with torch.no_grad():
                    expected = reference(*case.args, **case.kwargs)
            got = _call(fn, case, time_limit, slow_hint)
            try:
                problem = _compare_one(got, expected, case, diagnoses, atol, rtol, canonical, compare)
            except _Stop as stop:  # a wrong type, shape, dtype, ...: said for this case like the rest
                problem = stop.message
            if problem is not None:
                failed.append((case, problem))
                break  # the first wrong case says enough
            passed.append(case)
        if not failed:
            kinds = ", ".join(f"{sum(c.kind == k for c in passed)} {k}" for k in dict.fromkeys(c.kind for c in passed))
            return report(name, True, f"correct on {len(passed)} case{'s' * (len(passed) != 1)}: {kinds}")
        case, problem = failed[0]
        passed_kinds = {c.kind for c in passed}
        if passed and case.kind not in passed_kinds:
            kinds = " and ".join(sorted(passed_kinds))
            raise _Stop(f"right on the {kinds} case{'s' * (len(passed) > 1)} but wrong on {case.label}: {problem}")
        raise _Stop(f"on {case.label}: {problem}")
    except _Stop as stop:
        return report(name, stop.ok, stop.message)


def _compare_one(got, expected, case, diagnoses, atol, rtol, canonical, compare) -> str | None:
    """None when ``got`` is right; else the message (structure problems raise _Stop directly)."""
    if compare is not None:
        return compare(got, expected, case)
    try:
        _structure(got, expected)
    except _Stop:  # a wrong type or shape: a diagnosis that reads the output may still name it
        for diagnosis in diagnoses:
            try:
                if diagnosis.applies is not None and diagnosis.applies(got, expected, case):
                    return diagnosis.message
            except Exception:
                continue
        raise
    g = canonical(got) if canonical else got
    e = canonical(expected) if canonical else expected
    if _close(g, e, atol, rtol):
        return None
    for diagnosis in diagnoses:
        try:
            with torch.no_grad():
                if diagnosis.applies is not None:
                    if diagnosis.applies(got, expected, case):
                        return diagnosis.message
                    continue
                wrong = diagnosis.wrong(expected, case)
        except Exception:  # a diagnosis that does not apply to this case
            continue
        if wrong is None:
            continue
        w = canonical(wrong) if canonical else wrong
        if not _close(w, e, atol, rtol) and _close(g, w, atol, rtol):
            return diagnosis.message
    return _generic_mismatch(g, e, atol, rtol)


# ---- inputs for the cases ------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def shipped(name: str):
    """A shipped checkpoint (``attn-only-0l``, ``-1l`` or ``-2l``), loaded once per session."""
    return load_pretrained(name)


def random_model(n_layers: int = 1, seed: int = 0, **config) -> AttnOnlyTransformer:
    """A small model with seeded random weights (default sizes: d_model 32, 4 heads of 8, 64
    tokens, n_ctx 16); keyword arguments override :class:`AttnOnlyConfig` fields."""
    sizes = dict(d_model=32, n_heads=4, d_head=8, d_vocab=64, n_ctx=16)
    sizes.update(config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AttnOnlyTransformer(AttnOnlyConfig(n_layers=n_layers, **sizes)).eval()


def random_tokens(d_vocab: int, shape: tuple[int, ...], seed: int = 0) -> Tensor:
    """Seeded uniformly random token ids of the given shape (a long tensor)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, d_vocab, shape, generator=gen)

