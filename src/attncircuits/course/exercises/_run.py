"""Running a learner's function for a check: copied inputs, a time limit, one line per failure.

Part of the check machinery (see :mod:`._core`): everything here turns what the learner's code
does (raise, run too long, return a stub's ``...``) into a :class:`_Stop` carrying the message.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import copy
import ctypes
import dis
import functools
import inspect
import linecache
import sys
import sysconfig
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from attncircuits.course.exercises._case import Case, _Stop
from attncircuits.course.exercises._withhold import Withheld, withhold

_PACKAGE_DIR = str(Path(__file__).resolve().parents[2])
_LIBRARY_DIRS = tuple(
    {str(Path(p).resolve()) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"])}
) + (_PACKAGE_DIR,)



_STOPPING: set[int] = set()  # the threads whose time is up


def _arm(ident: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_TimeLimit))


class _TimeLimit(BaseException):
    """Raised inside the learner's call when its time is up (a BaseException, so that a bare
    ``except Exception`` in the learner's code cannot swallow it). While a thread's time is up,
    each one raised in the learner's code turns on a line tracer in that thread that raises
    again at the learner's next line, so a bare ``except:`` that swallows one meets another in its
    own handler, where no ``try`` catches it, and the call ends."""

    def __init__(self, *args):
        super().__init__(*args)
        ident = threading.get_ident()
        frame = sys._getframe(1)
        if ident not in _STOPPING or not _learners(frame.f_code.co_filename):
            return
        while frame is not None and frame.f_code.co_filename != __file__:
            frame.f_trace, frame.f_trace_lines = _raise_at_next_line, True
            frame = frame.f_back
        sys.settrace(_raise_at_next_line)


#: code that is never the learner's: this file, the interpreter's frozen modules, the standard
#: library and installed packages (where a finalizer or an import may run while a stopped thread
#: unwinds: an exception raised there reaches no caller and ends as an "unraisable exception"). A
#: learner's loop is in a notebook or a script; the exception sent every few ms still lands anywhere.
_NOT_LEARNERS = (__file__, "<frozen",
                 *sorted({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}))


def _learners(filename: str) -> bool:
    return not filename.startswith(_NOT_LEARNERS)


def _raise_at_next_line(frame, event, arg):
    """A trace function (see :class:`_TimeLimit`)."""
    if threading.get_ident() in _STOPPING and _learners(frame.f_code.co_filename):
        raise _TimeLimit()
    return None


class _Worker(threading.Thread):
    """The thread a learner's call runs in; it ends quietly however its time-out lands. Once its
    call is over it is ``finished``: the stopper no longer sends it exceptions (under ``lock``, so
    none is sent after the last one is cleared), and the thread's own teardown, outside ``run``,
    never meets one (it would end as an "unraisable exception")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock, self.finished = threading.Lock(), False

    def run(self) -> None:
        ident = threading.get_ident()
        clear = functools.partial(ctypes.pythonapi.PyThreadState_SetAsyncExc, ctypes.c_ulong(ident), None)
        try:
            try:
                super().run()
            except _TimeLimit:
                pass
            finally:
                with self.lock:
                    self.finished = True
                _STOPPING.discard(ident)
                sys.settrace(None)
                clear()
        except _TimeLimit:  # one landed in the finally above, before it was cleared
            with self.lock:
                self.finished = True
            clear()


class _WrongMethod(BaseException):
    """Raised inside the learner's call when it uses a method the exercise rules out."""


class Method:
    """What the exercise rules out, judged by what the learner's code asks torch to do, not by
    how long it takes (which depends on the machine): more than ``max_calls`` torch calls (a Python
    loop over tokens calls torch once per token) or a result of ``max_numel`` elements or more
    (the dense ``d_vocab x d_vocab`` matrix). The call is stopped at once with ``message``. (A
    line tracer counting the learner's Python lines hung the worker thread on a right answer.)"""

    def __init__(self, message: str, max_calls: int | None = None, max_numel: int | None = None):
        self.message, self.max_calls, self.max_numel = message, max_calls, max_numel

    def mode(self) -> "_Watch":
        return _Watch(self)


class _Watch(TorchFunctionMode):
    """Counts the torch calls of a learner's function and stops it when :class:`Method` rules them
    out (defined once here: a class built inside the worker thread on every call could hang it)."""

    def __init__(self, rule: Method):
        super().__init__()
        self.rule, self.calls = rule, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        if self.rule.max_calls is not None and self.calls > self.rule.max_calls:
            raise _WrongMethod()
        out = func(*args, **(kwargs or {}))
        if self.rule.max_numel is not None and isinstance(out, torch.Tensor) and out.numel() >= self.rule.max_numel:
            raise _WrongMethod()
        return out


# ---- running the learner's function --------------------------------------------------------------
NOT_ATTEMPTED = "not attempted yet (fill in the function above, then run this cell again)"


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
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:  # the learner's stub as it came
            exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
            return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
        return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis

    return all(trivial(s) for s in body)


def untouched(fn) -> bool:
    """Whether ``fn`` is a stub no one has filled in (its body only a docstring, ``pass``, ``...``
    or ``raise NotImplementedError``): a check then says "not attempted yet" before it builds any
    case (a learner's notebook runs every check cell before any exercise is done)."""
    return inspect.isfunction(inspect.unwrap(fn)) and _is_stub(fn)


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


_LIVE: list[threading.Thread] = []  # workers stopped by a time-out that had not ended yet


def _run_with_time_limit(call: Callable[[], Any], limit: float) -> tuple[Any, float]:
    """(result, seconds). Raises _TimeLimit when ``call`` takes longer than ``limit`` seconds.

    The call runs in a daemon thread that the caller waits for at most ``limit`` seconds. A signal
    could not do this: it only interrupts Python code, so a minutes-long ``torch.linalg.eigvals``
    would hold the notebook until it ended. When time is up the worker is sent an exception, again
    every few milliseconds until it ends (so that a bare ``except:`` in a loop cannot swallow it:
    one of them lands outside the ``try``); a long C operation runs to its end and the worker stops
    at the next Python instruction. At exit the interpreter waits for such workers, so it never
    finalises under a running torch kernel ("terminate called without an active exception").
    """
    start = time.perf_counter()
    box: dict = {}
    grad = torch.is_grad_enabled()  # grad mode is per thread

    def target():
        try:
            with torch.set_grad_enabled(grad):
                box["result"] = call()
        except BaseException as err:  # handed to the caller's thread below
            box["error"] = err

    worker = _Worker(target=target, daemon=True, name="attncircuits-exercise-check")
    worker.start()
    try:
        worker.join(limit)
    except KeyboardInterrupt:
        _stop_thread(worker)
        raise
    if worker.is_alive():
        _stop_thread(worker)
        raise _TimeLimit()
    if "error" in box:
        raise box["error"]
    return box.get("result"), time.perf_counter() - start


def _stop_thread(worker: threading.Thread, wait: float = 2.0) -> None:
    """Raise _TimeLimit inside ``worker`` until it ends (at most ``wait`` seconds here; a worker
    inside a long C call is then left to a reaper thread that keeps at it until it ends)."""

    if worker.ident is not None:
        _STOPPING.add(worker.ident)

    def hit() -> None:
        lock = getattr(worker, "lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            if worker.ident is not None and worker.is_alive() and not getattr(worker, "finished", False):
                _arm(worker.ident)

    deadline = time.perf_counter() + wait
    while worker.is_alive() and time.perf_counter() < deadline:
        hit()
        worker.join(0.002)
    if worker.is_alive():
        _LIVE.append(worker)

        def reap() -> None:
            while worker.is_alive():
                hit()
                worker.join(0.01)

        threading.Thread(target=reap, daemon=True, name="attncircuits-exercise-reaper").start()


@atexit.register
def _wait_for_stopped_workers() -> None:
    """At exit, let a stopped worker's C call finish before the interpreter shuts down."""
    for worker in _LIVE:
        worker.join(60)


def _stub_called(tb, fn: Callable) -> str | None:
    """The name of the learner's function whose stub raised NotImplementedError, when that is a
    function ``fn`` calls (an earlier exercise not done yet); None when it is ``fn`` itself."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    if not frames or str(Path(frames[-1].co_filename).resolve()).startswith(_LIBRARY_DIRS):
        return ""  # raised by a library: not a stub
    code = frames[-1]
    own = getattr(inspect.unwrap(fn), "__code__", None)  # a check may wrap the learner's function
    if code is getattr(fn, "__code__", None) or code is own or code.co_name in ("<lambda>", "<module>"):
        return None
    return code.co_name


def _call(fn: Callable, case: Case, limit: float, slow_hint: str, method: Method | None = None,
          after: Callable[[tuple, dict], str | None] | None = None, withheld=()) -> Any:
    """The learner's output on copies of ``case``'s inputs, or _Stop with the message; ``after``
    reads the copies once the call has returned (a message when they changed); ``withheld``: the
    package's answers to the exercise, which the call may not use (:func:`withhold`)."""
    args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs)

    def call():
        if method is None:
            return fn(*args, **kwargs)
        with method.mode():
            return fn(*args, **kwargs)

    try:
        with torch.enable_grad() if case.grad else torch.no_grad(), withhold(withheld, fn):
            out, _ = _run_with_time_limit(call, limit)
    except _WrongMethod:
        raise _Stop(f"on {case.label}: {method.message}")
    except Withheld as err:
        raise _Stop(f"your function calls `{err.name}`, the package's own answer to this exercise: write "
                    "it yourself (the cells after the exercise use the package's)")
    except NotImplementedError as err:
        stub = _stub_called(err.__traceback__, fn)
        if stub is None:
            raise _Stop(NOT_ATTEMPTED, None)
        if stub:
            raise _Stop(
                f"your function calls `{stub}`, which is not done yet (it raises NotImplementedError): "
                f"finish that exercise first, then run this cell again"
            )
        raise _Stop(f"raised NotImplementedError{_where(err.__traceback__, fn)} on {case.label}: {_first_line(err)}")
    except _TimeLimit:
        raise _Stop(
            f"too slow: stopped waiting after {limit:.1f} s on {case.label} (the reference takes well "
            f"under that); {slow_hint}"
        )
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # anything the learner's code raises becomes one line
        raise _Stop(f"raised {type(err).__name__}{_where(err.__traceback__, fn)} on {case.label}: {_first_line(err)}")
    if out is Ellipsis or (out is None and _is_stub(fn)):
        raise _Stop(NOT_ATTEMPTED, None)
    changed = after(args, kwargs) if after is not None else None
    if changed:
        raise _Stop(f"on {case.label}: {changed}")
    return out


def probe(fn: Callable, case: Case, time_limit: float = 30.0) -> Any:
    """The learner's output on ``case``, or None when the call fails in any way (the check's own
    cases then say how): for a property read off the output before the comparison, such as its
    gradient (``Case(grad=True)``)."""
    try:
        return _call(fn, case, time_limit, "")
    except _Stop:
        return None
