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
- too slow: each call runs under a time limit (``signal.setitimer`` on the main thread, which stops
  the call; elsewhere a thread joined with a timeout) and the message gives the time taken;
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
- :class:`Diagnosis` is a typical wrong answer: ``wrong(expected, case)`` transforms the
  reference's output (or recomputes from ``case.args``) into what that mistake produces, and
  ``message`` is printed when the learner's output matches it. Return ``None`` from ``wrong``
  when the mistake does not apply to a case. A diagnosis that equals the right answer on a case
  (e.g. a mask that changes nothing) is skipped there.
- ``canonical`` maps an output to what is compared, after the type and shape checks: e.g. the
  product of two factors (factors are unique only up to an invertible matrix between them), or a
  sorted list.
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

import ast
import copy
import dis
import functools
import inspect
import linecache
import math
import signal
import sysconfig
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..model import AttnOnlyConfig, AttnOnlyTransformer

__all__ = ["Case", "Diagnosis", "run_check", "shipped", "random_model", "random_tokens", "report", "WIDTH"]

WIDTH = 79  # the book's code column: printed lines wrap here
DEFAULT_TIME_LIMIT = 10.0  # seconds per call; a reference answer takes well under one
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
_LIBRARY_DIRS = tuple(
    {str(Path(p).resolve()) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"])}
) + (_PACKAGE_DIR,)


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
    """A typical mistake: ``wrong(expected, case)`` is what it produces, ``message`` names it."""

    message: str
    wrong: Callable[[Any, Case], Any]


# ---- reporting -----------------------------------------------------------------------------------
def report(name: str, ok: bool | None, message: str) -> bool:
    """Print one message for check ``name``: ✓ correct, ✗ wrong, ○ not attempted. Returns ``ok``."""
    mark = {True: "✓", False: "✗", None: "○"}[ok]
    text = f"{mark} {name}: {message}"
    print(textwrap.fill(text, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))
    return bool(ok)


class _Stop(Exception):
    """Ends a check early with a message (internal)."""

    def __init__(self, message: str, ok: bool | None = False):
        super().__init__(message)
        self.message, self.ok = message, ok


class _TimeLimit(BaseException):
    """Raised inside the learner's call when its time is up (a BaseException, so that a bare
    ``except Exception`` in the learner's code cannot swallow it)."""


# ---- running the learner's function --------------------------------------------------------------
def _is_stub(fn: Callable) -> bool:
    """True when ``fn``'s body is only a docstring, ``pass``, ``...`` or ``raise NotImplementedError``."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):  # no source: read the bytecode
        code = getattr(fn, "__code__", None)
        trivial_ops = {"RESUME", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "POP_TOP"}
        return code is not None and all(i.opname in trivial_ops for i in dis.get_instructions(code))
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not funcs:
        return False
    body = funcs[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]

    def trivial(stmt) -> bool:
        if isinstance(stmt, ast.Pass):
            return True
        return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis

    return all(trivial(s) for s in body)


def _where(tb, fn: Callable) -> str:
    """' at line N of <where> (`code`)' for the deepest frame of the learner's own code."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    own = [(c, n) for c, n in frames if not str(Path(c.co_filename).resolve()).startswith(_LIBRARY_DIRS)]
    if not own:
        return ""
    code, lineno = own[-1]
    line = linecache.getline(code.co_filename, lineno).strip()
    if code is getattr(fn, "__code__", None):
        lineno = lineno - code.co_firstlineno + 1  # counted from the `def` line
        where = f"line {lineno} of {code.co_name}"
    else:
        where = f"line {lineno} of {code.co_name}" if code.co_name != "<module>" else f"line {lineno}"
    return f" at {where} (`{line}`)" if line else f" at {where}"


def _first_line(err: BaseException, limit: int = 160) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_with_time_limit(call: Callable[[], Any], limit: float) -> tuple[Any, float]:
    """(result, seconds). Raises _TimeLimit when ``call`` takes longer than ``limit`` seconds.

    On the main thread (a notebook kernel, pytest) an interval timer interrupts the call itself, so
    nothing keeps running afterwards. Elsewhere the call runs in a daemon thread that is abandoned
    when the limit passes (Python cannot stop a thread); its result is then ignored.
    """
    start = time.perf_counter()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):

        def on_alarm(signum, frame):
            raise _TimeLimit()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            result = call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return result, time.perf_counter() - start
    box: dict = {}

    def target():
        try:
            box["result"] = call()
        except BaseException as err:  # handed to the caller's thread below
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        raise _TimeLimit()
    if "error" in box:
        raise box["error"]
    return box["result"], time.perf_counter() - start


def _call(fn: Callable, case: Case, limit: float, name: str) -> Any:
    args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs)
    try:
        with torch.no_grad():
            out, _ = _run_with_time_limit(lambda: fn(*args, **kwargs), limit)
    except NotImplementedError:
        raise _Stop("not attempted yet (fill in the function above, then run this cell again)", None)
    except _TimeLimit:
        raise _Stop(
            f"too slow: stopped after {limit:.1f} s on {case.label} (the reference takes well under a "
            "second); look for a Python loop over tokens or positions and use tensor operations"
        )
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # anything the learner's code raises becomes one line
        raise _Stop(f"raised {type(err).__name__}{_where(err.__traceback__, fn)} on {case.label}: {_first_line(err)}")
    if out is Ellipsis or (out is None and _is_stub(fn)):
        raise _Stop("not attempted yet (fill in the function above, then run this cell again)", None)
    return out


# ---- comparing -----------------------------------------------------------------------------------
def _describe_type(x) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of shape {list(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"


def _structure(got, expected, what: str = "the output") -> None:
    """Type, length, shape, device, dtype and finiteness; raises _Stop naming the first problem."""
    if got is None and expected is not None:
        raise _Stop(f"{what} is None: did you forget to `return` the result?")
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            raise _Stop(f"{what} should be a {type(expected).__name__} of {len(expected)}, got {_describe_type(got)}")
        if len(got) != len(expected):
            raise _Stop(f"{what} should have {len(expected)} items, got {len(got)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            _structure(g, e, f"item {i} of {what}")
        return
    if isinstance(expected, bool) or not isinstance(expected, (Tensor, int, float)):
        if type(got) is not type(expected) and not isinstance(got, type(expected)):
            raise _Stop(f"{what} should be {_describe_type(expected)}, got {_describe_type(got)}")
        return
    if isinstance(expected, (int, float)):
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise _Stop(f"{what} should be a number, got {_describe_type(got)}")
        if not math.isfinite(got) and math.isfinite(expected):
            raise _Stop(f"{what} is {got}; the answer is finite (a log of 0, or a division by 0?)")
        return
    if not isinstance(got, Tensor):
        raise _Stop(f"{what} should be a torch.Tensor of shape {list(expected.shape)}, got {_describe_type(got)}")
    gs, es = tuple(got.shape), tuple(expected.shape)
    if gs != es:
        hint = ""
        if sorted(gs) == sorted(es) and len(gs) >= 2 and gs[:-2] + gs[-2:][::-1] == es:
            hint = ": transposed (swap the last two axes, or the order of a product)"
        elif sorted(gs) == sorted(es):
            hint = ": the axes are in the wrong order"
        elif tuple(d for d in gs if d != 1) == tuple(d for d in es if d != 1):
            hint = ": an axis of size 1 is missing or extra (keep the batch axis?)"
        raise _Stop(f"{what} has shape {list(gs)}, expected {list(es)}{hint}")
    if got.device != expected.device:
        raise _Stop(f"{what} is on device {got.device}, expected {expected.device} (where the inputs are)")
    if got.dtype != expected.dtype:
        raise _Stop(f"{what} has dtype {got.dtype}, expected {expected.dtype}")
    if got.is_floating_point() or got.is_complex():
        bad = ~torch.isfinite(got) & torch.isfinite(expected)
        if bool(bad.any()):
            kind = "NaN" if bool(torch.isnan(got[bad]).any()) else "inf"
            raise _Stop(
                f"{what} has {kind} in {int(bad.sum())} of {got.numel()} entries where the answer is finite "
                "(a log of 0, a division by 0, or a softmax over only -inf?)"
            )


def _close(got, expected, atol: float, rtol: float) -> bool:
    if isinstance(expected, (tuple, list)):
        return isinstance(got, (tuple, list)) and len(got) == len(expected) and all(
            _close(g, e, atol, rtol) for g, e in zip(got, expected)
        )
    if isinstance(expected, Tensor):
        if not isinstance(got, Tensor) or got.shape != expected.shape:
            return False
        if not (expected.is_floating_point() or expected.is_complex()):
            return bool(torch.equal(got.to(expected.dtype), expected))
        g, e = got.detach().to(expected.dtype), expected.detach()
        same_nonfinite = torch.equal(torch.isfinite(g), torch.isfinite(e))
        fin = torch.isfinite(e)
        return same_nonfinite and bool(torch.allclose(g[fin], e[fin], atol=atol, rtol=rtol)) and bool(
            torch.equal(g[~fin], e[~fin]) if (~fin).any() else True
        )
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        g = got.item() if isinstance(got, Tensor) and got.numel() == 1 else got
        return isinstance(g, (int, float)) and math.isclose(g, expected, rel_tol=rtol, abs_tol=atol)
    return got == expected


def _generic_mismatch(got, expected, atol: float, rtol: float) -> str:
    """Name the wrong sign, a transpose or a constant factor; else the largest difference."""
    if isinstance(expected, (tuple, list)):
        for i, (g, e) in enumerate(zip(got, expected)):
            if not _close(g, e, atol, rtol):
                return f"item {i}: " + _generic_mismatch(g, e, atol, rtol)
        return "the items differ"
    if isinstance(expected, (int, float)):
        g = got.item() if isinstance(got, Tensor) else got
        if math.isclose(-g, expected, rel_tol=rtol, abs_tol=atol):
            return f"got {g:.6g}, expected {expected:.6g}: the wrong sign"
        return f"got {g:.6g}, expected {expected:.6g}"
    if not isinstance(expected, Tensor) or not expected.is_floating_point():
        return "the values differ"
    g, e = got.detach().to(expected.dtype), expected.detach()
    fin = torch.isfinite(e) & torch.isfinite(g)
    if not torch.equal(torch.isfinite(g), torch.isfinite(e)):
        n = int((torch.isfinite(g) != torch.isfinite(e)).sum())
        return f"-inf/inf in {n} entries differ from the answer's (where is the mask applied?)"
    if _close(-g, e, atol, rtol):
        return "the wrong sign (the values match the answer negated)"
    if e.ndim >= 2 and e.shape[-1] == e.shape[-2] and _close(g.transpose(-1, -2), e, atol, rtol):
        return "transposed: the values match the answer with the last two axes swapped"
    ef, gf = e[fin].double(), g[fin].double()
    denom = float((ef * ef).sum())
    if denom > 0:
        c = float((gf * ef).sum()) / denom
        if abs(c - 1) > 1e-3 and _close(g, e * c, atol, rtol * 10):
            return f"off by a constant factor: your values are {c:.4g} times the answer"
    diff = (g - e).abs().masked_fill(~fin, 0)
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    return (
        f"values differ by up to {float(diff.max()):.3g} (at index {list(idx)}: got {float(g[idx]):.5g}, "
        f"expected {float(e[idx]):.5g})"
    )


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
            got = _call(fn, case, time_limit, name)
            try:
                problem = _compare_one(got, expected, case, diagnoses, atol, rtol, canonical, compare)
            except _Stop as stop:  # a wrong type, shape, dtype, ...: said for this case like the rest
                problem = stop.message
            if problem is not None:
                failed.append((case, problem))
                break  # the first wrong case says enough
            passed.append(case)
        if not failed:
            labels = ", ".join(c.label for c in passed)
            return report(name, True, f"correct on {len(passed)} case{'s' * (len(passed) != 1)} ({labels})")
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
    _structure(got, expected)
    g = canonical(got) if canonical else got
    e = canonical(expected) if canonical else expected
    if _close(g, e, atol, rtol):
        return None
    for diagnosis in diagnoses:
        try:
            with torch.no_grad():
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
    from ..pretrained import load_pretrained

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

