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
- too slow: each call runs in a thread that is waited for at most ``time_limit`` seconds, then
  stopped, even through a bare ``except:`` (see :func:`._run._run_with_time_limit`); a method the
  exercise rules out is judged by what it computes, not by time (:class:`Method`);
- wrong type, wrong shape (expected vs got, with "transposed" or "a missing batch axis" where
  that explains it), NaN/inf where the answer is finite, wrong device, wrong dtype;
- a value mismatch: all zeros first; then the named diagnoses whose wrong answer matches the
  learner's output on this case, the first that also matches on every other case (the learner's
  function runs on all of them) giving the message; then, computed from the reference in
  :mod:`._compare`, another head's answer (``Case.others``), the wrong sign, a transpose or two
  swapped axes, a shift by one along an axis, a factor that is an axis length, ln 2, 100 or a
  square root; then "right on the shipped model but wrong on the random one" when the learner
  passes every case of one kind and fails another; else the largest difference and where.

Every chapter's check is wrapped in :func:`guarded`: it runs with float32 as the default dtype,
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

from attncircuits.checkpoints import modelset
from attncircuits.checkpoints.pretrained import load_pretrained
from attncircuits.course.exercises._compare import _close, _describe_type, _finite, _generic_mismatch, _numbers_as_list, _structure
from attncircuits.course.exercises._run import Method, _call, _first_line, _Stop
from attncircuits.models.attn_only import AttnOnlyConfig, AttnOnlyTransformer

__all__ = [
    "Case", "Diagnosis", "Method", "guarded", "other_heads", "run_check", "shipped", "random_model", "random_tokens", "report",
    "WIDTH",
]

WIDTH = 79  # the book's code column: printed lines wrap here
DEFAULT_TIME_LIMIT = 30.0  # seconds per call: only a runaway loop gets near it (methods are judged by Method)

@dataclass
class Case:
    """One input the learner's function is run on; ``label`` names it in messages."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    kind: str = "shipped"  # "shipped", "random" or "hand-built"
    expected: Any = None  # the reference's output; computed by run_check when None
    others: Callable[[], list[tuple[str, tuple]]] | None = None  # (label, args) of neighbouring inputs
    grad: bool = False  # run the learner's call with autograd on (to check its gradient)


def other_heads(args: tuple, index: int, n: int, label: str = "head {}") -> Callable[[], list[tuple[str, tuple]]]:
    """``Case.others`` for a head argument at position ``index`` of ``args``: the same call on each
    other head ``0 .. n - 1`` (or, for a ``(layer, head)`` pair, each other pair of ``n`` layers x
    the model's heads is not guessed: pass the pairs). When the learner's answer is the reference's
    on one of them, the message says so ("this is head 2's answer")."""

    def others():
        here = args[index]
        out = []
        for h in range(n) if not isinstance(n, (list, tuple)) else n:
            if h != here:
                out.append((label.format(h if not isinstance(h, tuple) else ".".join(map(str, h))),
                            args[:index] + (h,) + args[index + 1 :]))
        return out

    return others


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

# ---- every check: restored torch state, never an exception ------------------------------------------
def guarded(check: Callable[[Callable], bool]) -> Callable[[Callable], bool]:
    """Wrap a chapter's check: it runs with the torch state the references assume (float32
    default, no autograd, the random generator's state saved and restored) on one thread (the
    cases are small: a thread pool only waits for itself, badly so on a busy machine), and
    reports anything that goes wrong while it builds its cases or compares as one ✗ line, so a
    learner's ``torch.set_default_dtype(torch.float64)`` or an output no comparison expected never
    breaks the notebook."""

    @functools.wraps(check)
    def run(fn, *args, **kwargs) -> bool:
        dtype, threads, grad = torch.get_default_dtype(), torch.get_num_threads(), torch.is_grad_enabled()
        try:
            with torch.random.fork_rng(), modelset.shipped_models():
                torch.set_default_dtype(torch.float32)
                torch.set_grad_enabled(False)
                torch.set_num_threads(1)
                return check(fn, *args, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # a fault in comparing: one line, the notebook goes on
            name = getattr(fn, "__name__", "your function")
            return report(name, False, f"the check could not compare your output ({type(err).__name__}: "
                                       f"{_first_line(err, 100)}); look at what your function returns")
        finally:
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

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
) -> bool:
    """Run ``fn`` on every case against ``reference`` and print one message; True when all agree.

    When a case is wrong the learner's function still runs on the other cases, and a named
    diagnosis is given only when it fits every case it applies to (so that a mistake two wrong
    methods share on one input is told apart on another). See the module docstring for the rest.
    """
    name = name or getattr(fn, "__name__", "your function")
    try:
        if not callable(fn):
            raise _Stop(f"expected a function, got {_describe_type(fn)}; pass the function itself, without calling it")
        passed: list[Case] = []
        failed: tuple | None = None  # (case, message, candidate diagnoses)
        seen: list[tuple[Case, Any, Any]] = []  # (case, expected, got) of every case run
        for case in cases:
            expected = case.expected
            if expected is None:
                if reference is None:
                    raise ValueError(f"case {case.label!r} has no expected value and the check has no reference")
                with torch.no_grad():
                    expected = reference(*case.args, **case.kwargs)
            try:
                got = _call(fn, case, time_limit, slow_hint, method)
            except _Stop:
                if failed is None:
                    raise
                continue  # a later case only helps to tell diagnoses apart
            seen.append((case, expected, got))
            if failed is not None:
                continue
            try:
                problem, candidates = _compare_one(got, expected, case, diagnoses, atol, rtol, canonical, compare,
                                                   reference)
            except _Stop as stop:  # a wrong type, shape, dtype, ...: said for this case like the rest
                problem, candidates = stop.message, []
            except Exception as err:  # an output no comparison expected (a meta tensor, 10**400, ...)
                problem, candidates = (f"your output could not be compared ({type(err).__name__}: "
                                       f"{_first_line(err, 100)}); it should be like {_describe_type(expected)}"), []
            if problem is None:
                passed.append(case)
            else:
                failed = (case, problem, candidates)
                if not candidates:
                    break
        if failed is None:
            kinds = ", ".join(f"{sum(c.kind == k for c in passed)} {k}" for k in dict.fromkeys(c.kind for c in passed))
            return report(name, True, f"correct on {len(passed)} case{'s' * (len(passed) != 1)}: {kinds}")
        case, problem, candidates = failed
        for diagnosis in candidates:
            if all(_fits(diagnosis, c, e, g, canonical, atol, rtol) for c, e, g in seen if c is not case):
                problem = diagnosis.message
                break
        if callable(problem):
            problem = problem()
        passed_kinds = {c.kind for c in passed}
        if passed and case.kind not in passed_kinds:
            kinds = " and ".join(sorted(passed_kinds))
            raise _Stop(f"right on the {kinds} case{'s' * (len(passed) > 1)} but wrong on {case.label}: {problem}")
        raise _Stop(f"on {case.label}: {problem}")
    except _Stop as stop:
        return report(name, stop.ok, stop.message)


def _fits(diagnosis: Diagnosis, case: Case, expected, got, canonical, atol, rtol) -> bool:
    """Whether the learner's output on ``case`` is what ``diagnosis``'s mistake gives there (True
    when the diagnosis says nothing about that case)."""
    try:
        with torch.no_grad():
            if diagnosis.applies is not None:
                return True  # a property of one output; not checked across cases
            wrong = diagnosis.wrong(expected, case)
        if wrong is None:
            return True
        g = canonical(got) if canonical else got
        w = canonical(wrong) if canonical else wrong
        return _close(g, w, atol, rtol)
    except Exception:
        return True


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


def _compare_one(got, expected, case, diagnoses, atol, rtol, canonical, compare, reference=None):
    """(None, []) when ``got`` is right; else (the message, the named diagnoses that match here, to
    be confirmed on the other cases). Structure problems raise _Stop directly."""
    if compare is not None:
        return compare(got, expected, case), []  # None or a message
    got = _numbers_as_list(got, expected)
    try:
        _structure(got, expected, finite=canonical is None)
    except _Stop:  # a wrong type or shape: a diagnosis that reads the output may still name it
        for diagnosis in diagnoses:
            try:
                if diagnosis.applies is not None and diagnosis.applies(got, expected, case):
                    return diagnosis.message, []
            except Exception:
                continue
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
        return _another(got, case, reference, canonical, atol, rtol) or _generic_mismatch(g, e, atol, rtol, _dims(case))

    return generic, candidates


# ---- inputs for the cases ------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _loaded(name: str):
    ckpt = load_pretrained(name)
    return ckpt, {k: v.detach().clone() for k, v in ckpt.model.state_dict().items()}, ckpt.model.cfg.to_dict()


def shipped(name: str):
    """A shipped checkpoint (``attn-only-0l``, ``-1l`` or ``-2l``), loaded once per session.

    Before it is handed out its weights and config are compared with the copy kept at loading (a
    few milliseconds), and restored when anything changed them: a learner's code that edits the
    model a check uses cannot make later checks fail."""
    ckpt, state, cfg = _loaded(name)
    model = ckpt.model
    try:
        now = model.state_dict()
        intact = (model.cfg.to_dict() == cfg and now.keys() == state.keys()
                  and all(now[k].shape == v.shape and torch.equal(now[k], v) for k, v in state.items()))
    except Exception:
        intact = False
    if not intact:
        _loaded.cache_clear()
        ckpt = _loaded(name)[0]
    ckpt.model.eval()
    for param in ckpt.model.parameters():
        param.requires_grad_(False)
    return ckpt


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

