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
  ``None`` from a body that is only a docstring, ``pass`` or ``...``; when the stub that raised is
  another function the learner's calls (an earlier exercise), the message names it;
- raises inside: the exception's type and first line, and the line of the learner's code it came
  from (never a traceback);
- too slow: each call runs in a thread that is waited for at most ``CALL_FACTOR`` times the
  reference's time on that case (at least ``MIN_CALL_LIMIT`` seconds), and all of a check's calls
  for at most ``time_limit`` seconds, then stopped, even through a bare ``except:`` (see
  :func:`._run._run_with_time_limit`); a method the exercise rules out is judged by what it
  computes, not by time (:class:`Method`);
- an input changed in place (each argument the learner's function was given is compared with the
  case's own after the call: "your function changed `logits` in place");
- not the type the text asks (``returns=float``: "returns a 0-d tensor; the exercise asks for a
  float");
- wrong type, wrong shape (expected vs got, with "transposed" or "a missing batch axis" where
  that explains it), NaN/inf where the answer is finite, wrong device, wrong dtype;
- a value mismatch: all zeros first; then the named diagnoses whose wrong answer matches the
  learner's output on this case and also on every other case (the learner's function runs on
  all of them) giving the message: a mistake's recomputed answer only when no other mistake's
  with another message fits too (two mistakes that give the same output on every case are not
  told apart by naming either: the message then says what was measured), else the first
  property of the output that fits (``applies``); then, computed from the reference in
  :mod:`._compare`, another head's answer (``Case.others``), the wrong sign, a transpose or two
  swapped axes, a shift by one along an axis, a factor that is an axis length, ln 2, 100 or a
  square root; then "right on the shipped model but wrong on the random one" when the learner
  passes every case of one kind and fails another; else the largest difference and where (with
  the output's axes named when the check gives ``axes``: "at [batch 0, query 4, key 3]").

Messages call the inputs by the names of the exercise's stub: the learner's own function's
parameters (the stub's, once filled in), and where it has none (a ``lambda *a``, too few
parameters) the names of the call the check's docstring opens with (``next_token_loss(logits,
tokens)``: every check's does, and a test holds them to the notebooks' stubs), then the
reference's. A correct function gets one form of ✓ line for every check: "correct on 28 cases
(4 fixed, 24 generated)", or "correct on 4 cases" for a check with no generated ones.

``run_check`` applies :func:`guarded`'s guard itself (so every check has it; a chapter wraps its
check in :func:`guarded` too when building the cases may fail): it runs with float32 as the default dtype,
no autograd, one thread and the random state saved, all restored afterwards, and anything that
fails while it builds its cases or compares becomes one ✗ line. :func:`shipped` restores a
shipped model that anything edited.

Writing a check:

- :class:`Case` holds the label printed in messages, the positional and keyword arguments, and its
  ``kind`` (``"shipped"``, ``"random"`` or ``"hand-built"``). Arguments are deep-copied before
  every call, so a learner's function that edits its input in place cannot break the notebook.
  ``expected`` is computed by the reference unless given.
- :class:`Diagnosis` is a typical wrong answer (or, with ``applies``, a property of one): ``wrong(expected, case)`` transforms the
  reference's output (or recomputes from ``case.args``) into what that mistake produces, and
  ``message`` is printed when the learner's output matches it. Return ``None`` from ``wrong``
  when the mistake does not apply to a case. A diagnosis that equals the right answer on a case
  (e.g. a mask that changes nothing) is skipped there. A property (``applies``) names a mistake
  only when it holds on every case the learner's output gets wrong, so make it a verified fact
  about the output (``g @ W_U`` is the answer), not a guess (the last axis has d_model entries).
- ``canonical`` maps an output to what is compared, after the type and shape checks: e.g. the
  product of two factors (factors are unique only up to an invertible matrix between them), or a
  sorted list.
- ``time_limit`` (seconds for all calls of the check) and ``slow_hint`` (what to say when a call
  runs past its limit).
- ``generate(draw: Draw)`` returns the arguments of one generated case (or a ``Case`` whose label
  is a note such as "resid's variance is 1e-8"): ``N_GENERATED`` of them, seeded by the check's
  name and the index, run after the fixed cases; ``draw.edge(n)`` walks through ``n`` edges the
  text allows first (the extreme at the last position, values of 0, ``None`` first, a variance
  near zero, one element, the largest shape). A failure on one shows the case's inputs (values
  when small, else shapes; a model by its sizes) with what the function got and what was
  expected. The cases are drawn once a session and the reference's output on each is kept.
  :mod:`._draws` has the draws several chapters share (small models, tokens, causal patterns);
  a ``Case`` returned by ``generate`` may carry ``others`` and ``expected``.
- ``withheld``: the package's own answers to the exercise (functions, or ``(class, method)``
  pairs), which the learner's function may not call while the check runs it: "your function calls
  `composition_score`, the package's own answer to this exercise".
- ``returns`` (``float`` or ``int``): the type the text asks; ``outputs``: names of a tuple's
  items for messages; ``axes``: names of a tensor output's axes for messages (``("batch",
  "query", "key")``); ``identities``: :class:`Identity` facts the text states about the inputs.
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

import contextlib
import functools
import sys
import textwrap
import time
from typing import Any, Callable, Sequence

import torch

from attncircuits.checkpoints import modelset
from attncircuits.course.exercises._case import Case, Diagnosis, Identity, _Stop
from attncircuits.course.exercises._compare import _describe_type, name_axes
from attncircuits.course.exercises._contract import Draw, arg_names, changed_inputs, describe, text_names
from attncircuits.course.exercises._inputs import other_heads, random_model, random_tokens, shipped
from attncircuits.course.exercises._judge import _compare_one, _fits
from attncircuits.course.exercises._run import NOT_ATTEMPTED, Method, _call, _first_line, untouched

__all__ = [
    "Case", "Diagnosis", "Draw", "Identity", "Method", "guarded", "other_heads", "run_check", "shipped", "random_model",
    "random_tokens", "report", "WIDTH",
]

WIDTH = 79  # the book's code column: printed lines wrap here
DEFAULT_TIME_LIMIT = 30.0  # seconds for all of a check's calls: only a runaway loop gets near it
MIN_CALL_LIMIT = 5.0  # seconds one call may always take, however fast the reference
CALL_FACTOR = 100  # ... and this many times the reference's time on the same case
N_GENERATED = 24  # generated cases per check, when it has a generator
CASES_RUN: dict[str, tuple[list, tuple]] = {}  # "ch10.check_frozen_ln" -> (its last cases, identities), for tests


# ---- reporting -----------------------------------------------------------------------------------
def report(name: str, ok: bool | None, message: str) -> bool:
    """Print one message for check ``name``: ✓ correct, ✗ wrong, ○ not attempted. Returns ``ok``."""
    mark = {True: "✓", False: "✗", None: "○"}[ok]
    text = f"{mark} {name}: {message}"
    print(textwrap.fill(text, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))
    return bool(ok)


# ---- every check: restored torch state, never an exception ------------------------------------------
@contextlib.contextmanager
def _torch_state():
    """The torch state the references assume (float32 default, no autograd, one thread, the
    random state saved), the learner's own restored afterwards."""
    dtype, threads, grad = torch.get_default_dtype(), torch.get_num_threads(), torch.is_grad_enabled()
    try:
        with torch.random.fork_rng(), modelset.shipped_models():
            torch.set_default_dtype(torch.float32)
            torch.set_grad_enabled(False)
            torch.set_num_threads(1)
            yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _safely(fn, check: Callable[[], bool]) -> bool:
    try:
        with _torch_state():
            return check()
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # a fault in comparing: one line, the notebook goes on
        name = getattr(fn, "__name__", "your function")
        return report(name, False, f"the check could not compare your output ({type(err).__name__}: "
                                   f"{_first_line(err, 100)}); look at what your function returns")


def guarded(check: Callable[[Callable], bool]) -> Callable[[Callable], bool]:
    """Wrap a chapter's check so that building its cases runs under the same guard as
    :func:`run_check` (which applies it itself): the torch state the references assume (float32
    default, no autograd, the random generator's state saved and restored) on one thread, and
    anything that goes wrong reported as one ✗ line, so a learner's
    ``torch.set_default_dtype(torch.float64)`` or an output no comparison expected never breaks
    the notebook."""

    @functools.wraps(check)
    def run(fn, *args, **kwargs) -> bool:
        if untouched(fn):  # the stub as it came: said before any case is built
            return report(getattr(fn, "__name__", "your function"), None, NOT_ATTEMPTED)
        return _safely(fn, lambda: check(fn, *args, **kwargs))

    run.guarded = True
    return run


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
    method: Method | None = None,
    generate: Callable[[Draw], tuple | Case] | None = None,
    n_generated: int | None = None,
    returns: type | None = None,
    outputs: Sequence[str] | None = None,
    axes: Sequence[str] | None = None,
    identities: Sequence[Identity] = (),
    withheld: Sequence = (),
) -> bool:
    """Run ``fn`` on every case, then on the generated ones, against ``reference`` and print one
    message; True when all agree.

    When a case is wrong the learner's function still runs on the other cases, and a named
    diagnosis is given only when it fits every case it applies to (so that a mistake two wrong
    methods share on one input is told apart on another) and no other diagnosis does. See the
    module docstring for the rest.
    """
    name = name or getattr(fn, "__name__", "your function")
    caller = sys._getframe(1)  # the chapter's check, whose cases CASES_RUN keeps
    key = f"{caller.f_globals.get('__name__', '').rsplit('.', 1)[-1]}.{caller.f_code.co_name}"
    text = text_names(getattr(caller.f_globals.get(caller.f_code.co_name), "__doc__", None))
    settings = dict(atol=atol, rtol=rtol, canonical=canonical, compare=compare, time_limit=time_limit,
                    slow_hint=slow_hint, method=method, returns=returns, outputs=outputs, axes=axes, text=text,
                    withheld=tuple(withheld))
    return _safely(fn, lambda: _judge_all(fn, name, key, cases, reference, diagnoses, settings, generate,
                                          N_GENERATED if n_generated is None else n_generated, identities))


_DRAWN: dict[tuple, list[Case]] = {}  # (check, n) -> its generated cases, drawn once a session
_GENERATED: dict[tuple, list[Case]] = {}  # (check, n, argument names) -> those cases, labelled with the names
_EXPECTED: dict[int, tuple[Any, float]] = {}  # id of a generated case's args -> the reference's output and its seconds


def _generated(name: str, generate, n: int, names: list[str]) -> list[Case]:
    """The check's generated cases: drawn once a session (they are seeded, and every call gets
    copies of their inputs), so a check run again costs only the calls; their labels describe
    the inputs by the names the messages use (the learner's own parameters'), and a learner who
    names them otherwise gets the same cases (the same ``args``, whose reference output is kept)."""
    if (name, n) not in _DRAWN:
        _DRAWN[(name, n)] = _draw_cases(name, generate, n)
    key = (name, n, tuple(names))
    if key not in _GENERATED:
        _GENERATED[key] = [Case(f"generated case {i + 1} ({describe(c.args, names, c.label)})", c.args, c.kwargs,
                                kind="generated", expected=c.expected, others=c.others)
                           for i, c in enumerate(_DRAWN[(name, n)])]
    return _GENERATED[key]


def _draw_cases(name: str, generate, n: int) -> list[Case]:
    out = []
    for i in range(n):
        made = generate(Draw(name, i))
        if not isinstance(made, Case):
            made = Case("", tuple(made))
        out.append(Case(made.label, tuple(made.args), made.kwargs, kind="generated", expected=made.expected,
                        others=made.others))
    return out


def _success(passed: list[Case]) -> str:
    """The ✓ line's message, one form for every check: how many cases, and how many of them were
    generated (``correct on 28 cases (4 fixed, 24 generated)``)."""
    n, generated = len(passed), sum(c.kind == "generated" for c in passed)
    message = f"correct on {n} case{'s' * (n != 1)}"
    return message + (f" ({n - generated} fixed, {generated} generated)" if generated else "")


def _judge_all(fn, name, key, cases, reference, diagnoses, s, generate, n_generated, identities) -> bool:
    try:
        if not callable(fn):
            raise _Stop(f"expected a function, got {_describe_type(fn)}; pass the function itself, without calling it")
        cases = list(cases)
        names = arg_names(fn, max([len(c.args) for c in cases] + [0]), s["text"], reference)
        if generate is not None:
            cases += _generated(key, generate, n_generated, names)
        CASES_RUN[key] = (cases, tuple(identities))
        deadline = time.perf_counter() + s["time_limit"]
        passed: list[Case] = []
        failed: tuple | None = None  # (case, message, candidate diagnoses, expected)
        seen: list[tuple[Case, Any, Any]] = []  # (case, expected, got) of every case run
        for case in cases:
            expected, limit = case.expected, s["time_limit"]
            if expected is None:
                if reference is None:
                    raise ValueError(f"case {case.label!r} has no expected value and the check has no reference")
                if case.kind == "generated" and id(case.args) in _EXPECTED:  # the reference ran on it before
                    expected, seconds = _EXPECTED[id(case.args)]
                else:
                    t = time.perf_counter()
                    with torch.no_grad():
                        expected = reference(*case.args, **case.kwargs)
                    seconds = time.perf_counter() - t
                    if case.kind == "generated":
                        _EXPECTED[id(case.args)] = (expected, seconds)
                limit = min(limit, max(MIN_CALL_LIMIT, CALL_FACTOR * seconds))
            limit = max(0.05, min(limit, deadline - time.perf_counter()))
            try:
                got = _call(fn, case, limit, s["slow_hint"], s["method"],
                            lambda a, k, case=case: changed_inputs(a, k, case, names), s["withheld"])
            except _Stop:
                if failed is None:
                    raise
                continue  # a later case only helps to tell diagnoses apart
            seen.append((case, expected, got))
            if failed is not None:
                continue
            try:
                problem, candidates = _compare_one(got, expected, case, diagnoses, s["atol"], s["rtol"],
                                                   s["canonical"], s["compare"], reference, s["returns"], s["outputs"])
            except _Stop as stop:  # a wrong type, shape, dtype, ...: said for this case like the rest
                problem, candidates = stop.message, []
            except Exception as err:  # an output no comparison expected (a meta tensor, 10**400, ...)
                problem, candidates = (f"your output could not be compared ({type(err).__name__}: "
                                       f"{_first_line(err, 100)}); it should be like {_describe_type(expected)}"), []
            if problem is None:
                passed.append(case)
            else:
                failed = (case, problem, candidates, expected)
                if not candidates:
                    break
        if failed is None:
            return report(name, True, _success(passed))
        case, problem, candidates, expected = failed
        fitting = [d for d in candidates
                   if all(_fits(d, c, e, g, s["canonical"], s["atol"], s["rtol"]) for c, e, g in seen if c is not case)]
        computed = {d.message for d in fitting if d.applies is None}  # the answer of one mistake, recomputed
        if len(computed) == 1:  # a mistake's answer only where the cases tell it from the other mistakes'
            problem = computed.pop()
        elif not computed and fitting:  # a property of the output (every row sums to 1 over the queries)
            problem = fitting[0].message
        if callable(problem):
            problem = problem()
        if s["axes"] and isinstance(expected, torch.Tensor) and expected.ndim == len(s["axes"]):
            problem = name_axes(problem, s["axes"])
        passed_kinds = {c.kind for c in passed}
        if passed and case.kind not in passed_kinds:
            kinds = " and ".join(sorted(passed_kinds))
            raise _Stop(f"right on the {kinds} case{'s' * (len(passed) > 1)} but wrong on {case.label}: {problem}")
        raise _Stop(f"on {case.label}: {problem}")
    except _Stop as stop:
        return report(name, stop.ok, stop.message)
