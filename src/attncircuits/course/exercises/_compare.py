"""Comparing a learner's output with the reference: structure first, then values, then a guess
at the mistake (sign, transpose, a constant factor) when no named diagnosis matched.

Part of the check machinery (see :mod:`._core`).
"""

from __future__ import annotations

import math
import numbers
import re

import numpy as np
import torch
from torch import Tensor

from attncircuits.course.exercises._case import _Stop


# ---- comparing -----------------------------------------------------------------------------------
def _describe_type(x) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of shape {list(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    mod = type(x).__module__.split(".")[0]
    name = type(x).__name__ if mod == "builtins" else f"{mod}.{type(x).__name__}"
    return f"a{'n' if name[0] in 'aeiou' else ''} {name}"


def is_number(x) -> bool:
    """A real number of Python's or numpy's (``numpy.int64``, ``numpy.float32``), never a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _numbers_as_list(got, expected):
    """What the text allows, as the reference gives it: a 1-D tensor where a list (or tuple) of
    numbers is asked, as that list; numpy's numbers as Python's (one by one in a list or tuple);
    a numpy array where a tensor is asked, as a tensor (the text asks for the numbers)."""
    if (isinstance(expected, (tuple, list)) and isinstance(got, Tensor) and got.ndim == 1
            and len(got) == len(expected) and all(isinstance(e, (int, float)) and not isinstance(e, bool)
                                                   for e in expected)):
        return type(expected)(got.tolist())
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) and len(got) == len(expected):
        return type(got)(_numbers_as_list(g, e) for g, e in zip(got, expected))
    if isinstance(expected, (int, float)) and not isinstance(expected, bool) and isinstance(got, np.generic) \
            and is_number(got):
        return got.item()
    if isinstance(expected, Tensor) and isinstance(got, np.ndarray) and got.dtype.kind in "biufc":
        return torch.from_numpy(np.ascontiguousarray(got))
    return got


def _structure(got, expected, what: str = "the output", finite: bool = True) -> None:
    """Type, length, shape, device, dtype and finiteness; raises _Stop naming the first problem."""
    if got is None and expected is not None:
        raise _Stop(f"{what} is None: did you forget to `return` the result?")
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            raise _Stop(f"{what} should be a {type(expected).__name__} of {len(expected)}, got {_describe_type(got)}")
        if len(got) != len(expected):
            raise _Stop(f"{what} should have {len(expected)} items, got {len(got)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            _structure(g, e, f"item {i} of {what}", finite)
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
            raise _Stop(f"{what} is {got}; the answer is finite ({expected:.6g})")
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
    if got.dtype != expected.dtype and not _same_kind(got.dtype, expected.dtype):
        raise _Stop(f"{what} has dtype {got.dtype}, expected {expected.dtype}")
    if finite:
        _finite(got, expected, what)


_PRECISE = (torch.float32, torch.float64)


def _same_kind(got: torch.dtype, expected: torch.dtype) -> bool:
    """float32 and float64 both hold a float answer to the checks' tolerance (so do complex64
    and complex128, and int32 and int64 an integer one); half precision and a float for an integer
    do not."""
    if got in _PRECISE and expected in _PRECISE:
        return True
    if {got, expected} <= {torch.int32, torch.int64}:  # counts and ids: both hold them exactly
        return True
    return {got, expected} <= {torch.complex64, torch.complex128}


def _finite(got, expected, what: str = "the output") -> None:
    """NaN or inf where the answer is finite: raises _Stop saying how many and where."""
    if not isinstance(got, Tensor) or not isinstance(expected, Tensor) or got.shape != expected.shape:
        return
    if not (got.is_floating_point() or got.is_complex()):
        return
    bad = ~torch.isfinite(got) & torch.isfinite(expected)
    if not bool(bad.any()):
        return
    kind = "NaN" if bool(torch.isnan(got[bad]).any()) else "inf"
    first = [int(i) for i in bad.nonzero()[0]]
    where = f"first at index {first}"
    if got.ndim >= 2 and got.shape[-1] == got.shape[-2] and got.shape[-1] > 1:
        upper = torch.ones(got.shape[-2:], dtype=torch.bool).triu(1)
        if bool(bad[..., ~upper].logical_not().all()) and bool(bad.any()):
            where = "all above the diagonal (the masked future keys): they should be 0 after the softmax"
    n = int(bad.sum())
    raise _Stop(
        f"{what} has {kind} in {n} of {got.numel()} entries where the answer is finite, {where}"
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
        if bool(torch.isfinite(e).all()):  # the common case, without boolean indexing
            return bool(torch.allclose(g, e, atol=atol, rtol=rtol))  # a NaN in g is never close
        same_nonfinite = torch.equal(torch.isfinite(g), torch.isfinite(e))
        fin = torch.isfinite(e)
        return same_nonfinite and bool(torch.allclose(g[fin], e[fin], atol=atol, rtol=rtol)) and bool(
            torch.equal(g[~fin], e[~fin]) if (~fin).any() else True
        )
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        g = got.item() if isinstance(got, Tensor) and got.numel() == 1 else got
        return isinstance(g, (int, float)) and math.isclose(g, expected, rel_tol=rtol, abs_tol=atol)
    return got == expected


def _factor_name(c: float, dims: dict[str, int]) -> str | None:
    """What a factor ``c`` between the learner's values and the answer most likely is."""
    named = [(math.log(2), "ln 2 (a log base 2 where the natural log is asked, or the reverse)"),
             (100.0, "100 (a percentage where a fraction is asked, or the reverse)")]
    for name, n in dims.items():
        if n > 1:
            named.append((float(n), f"{n}, the {name} (a sum where a mean is asked, or the reverse)"))
            named.append((math.sqrt(n), f"sqrt({n}), the square root of the {name} (a missing or extra 1/sqrt scale)"))
    for value, text in named:
        for f, way in ((value, "times"), (1 / value, "divided by")):
            if math.isclose(c, f, rel_tol=2e-3):
                return f"your values are the answer {way} {text}"
    return None


def _shifted(g: Tensor, e: Tensor, atol: float, rtol: float) -> str | None:
    """'shifted by one along axis k' when the learner's values are the answer moved one step."""
    for ax in range(e.ndim):
        n = e.shape[ax]
        if n < 3:
            continue
        for d, way in ((1, "later"), (-1, "earlier")):
            a = g.narrow(ax, max(d, 0), n - 1)
            b = e.narrow(ax, max(-d, 0), n - 1)
            fin = torch.isfinite(a) & torch.isfinite(b)
            if int(fin.sum()) < max(2, fin.numel() // 2):
                continue
            if torch.allclose(a[fin], b[fin], atol=atol, rtol=rtol) and not torch.allclose(
                g.narrow(ax, 0, n - 1)[fin], b[fin], atol=atol, rtol=rtol
            ):
                return (f"shifted by one along axis {ax} (of size {n}): your entry i holds the answer's entry "
                        f"i {'-' if d == 1 else '+'} 1 (an off-by-one in an index or a slice)")
    return None


def _digits_apart(a: float, b: float, start: int) -> int:
    """The fewest significant digits, from ``start``, at which ``a`` and ``b`` print differently."""
    return next((d for d in range(start, 17) if f"{a:.{d}g}" != f"{b:.{d}g}"), 17)


def _generic_mismatch(got, expected, atol: float, rtol: float, dims: dict | None = None, names=None) -> str:
    """Name a symptom computed from the answer: all zeros, the wrong sign, a transpose, a shift by
    one, a factor that is an axis length, ln 2, 100 or a square root; else the largest difference."""
    dims = dims or {}
    if isinstance(expected, (tuple, list)):
        for i, (g, e) in enumerate(zip(got, expected)):
            if not _close(g, e, atol, rtol):
                item = f"{names[i]} (item {i})" if names and i < len(names) else f"item {i}"
                return f"{item}: " + _generic_mismatch(g, e, atol, rtol, dims)
        return "the items differ"
    if isinstance(expected, int):  # an index, a count or a truth value: no factor, no sign
        g = got.item() if isinstance(got, Tensor) else got
        return f"got {g}, expected {expected}"
    if isinstance(expected, float):
        g = got.item() if isinstance(got, Tensor) else got
        if g == 0 and expected != 0:
            return f"got 0, expected {expected:.6g}"
        if math.isclose(-g, expected, rel_tol=rtol, abs_tol=atol):
            return f"got {g:.6g}, expected {expected:.6g}: the wrong sign"
        if expected != 0 and g != 0:
            name = _factor_name(g / expected, dims)
            if name:
                return f"got {g:.6g}, expected {expected:.6g}: {name}"
        digits = _digits_apart(g, expected, 6)
        return f"got {g:.{digits}g}, expected {expected:.{digits}g}"
    if not isinstance(expected, Tensor):
        return "the values differ"
    if expected.is_complex():
        return "the values differ"
    integer = not expected.is_floating_point()
    dtype = torch.float64 if integer else expected.dtype
    g, e = got.detach().to(dtype), expected.detach().to(dtype)
    fin = torch.isfinite(e) & torch.isfinite(g)
    if not torch.equal(torch.isfinite(g), torch.isfinite(e)):
        n = int((torch.isfinite(g) != torch.isfinite(e)).sum())
        return f"-inf/inf in {n} entries differ from the answer's (where is the mask applied?)"
    if bool((g[fin] == 0).all()) and bool((e[fin] != 0).any()):
        return "your output is all zeros (nothing was written into it, or everything was masked)"
    full_g, full_e, full_fin = g, e, fin
    if e.numel() > 50_000:  # the symptoms show on a corner as well as on the whole, much faster
        corner = tuple(slice(0, min(n, 48)) for n in e.shape)
        g, e, fin = g[corner], e[corner], fin[corner]
    if bool(fin.any()) and _close(-g[fin], e[fin], atol, rtol):  # the masked -inf entries keep their sign
        return "the wrong sign (the values match the answer negated)"
    if e.ndim >= 2 and e.shape[-1] == e.shape[-2] and _close(g.transpose(-1, -2), e, atol, rtol):
        return "transposed: the values match the answer with the last two axes swapped"
    for a in range(e.ndim):
        for b in range(a + 1, e.ndim):
            if (a, b) != (e.ndim - 2, e.ndim - 1) and e.shape[a] == e.shape[b] and _close(g.transpose(a, b), e, atol, rtol):
                return f"axes {a} and {b} are swapped: the values match the answer with them exchanged"
    shift = _shifted(g, e, atol, rtol)
    if shift:
        return shift
    ef, gf = e[fin].double(), g[fin].double()
    denom = float((ef * ef).sum())
    if denom > 0:
        c = float((gf * ef).sum()) / denom
        if abs(c - 1) > 1e-3 and abs(c) > 1e-12 and _close(g, e * c, atol, rtol * 10):
            name = _factor_name(c, {**dims, **{f"length of axis {i}": n for i, n in enumerate(e.shape)}})
            if name:
                return name
            # an unnamed factor only where two entries or more of the answer are not zero (with one,
            # any other value is "a factor") and it is not within 2% of 1 (rounded numbers)
            if int((ef != 0).sum()) >= 2 and abs(c - 1) > 0.02:
                return f"off by a constant factor: your values are {c:.4g} times the answer"
    g, e, fin = full_g, full_e, full_fin
    diff = (g - e).abs().masked_fill(~fin, 0)
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    if integer:
        return (
            f"{int((diff > 0).sum())} of {diff.numel()} entries differ (e.g. at index {list(idx)}: got "
            f"{int(g[idx])}, expected {int(e[idx])})"
        )
    gi, ei = float(g[idx]), float(e[idx])
    digits = _digits_apart(gi, ei, 5)
    return (
        f"values differ by up to {float(diff.max()):.3g} (at index {list(idx)}: got {gi:.{digits}g}, "
        f"expected {ei:.{digits}g})"
    )


_INDEX = re.compile(r"(?:at )?index \[(\d+(?:, \d+)*)\]")
_AXIS = re.compile(r"(?<!\()\baxis (\d+)( \(of size|(?! \())")
_AXES = re.compile(r"\baxes (\d+) and (\d+)\b")
_LENGTH = re.compile(r"\bthe length of axis (\d+)")


def name_axes(message: str, axes) -> str:
    """``message`` with the output's axes named where it gives an index or an axis by number:
    "at index [0, 4, 3]" becomes "at [batch 0, query 4, key 3]", "along axis 1 (of size 9)"
    "along axis 1 (query, of size 9)", for a check that names its output's ``axes``."""
    axes = list(axes)

    def index(m):
        idx = m.group(1).split(", ")
        if len(idx) != len(axes):
            return m.group(0)
        return ("at " if m.group(0).startswith("at ") else "") + "[" + ", ".join(
            f"{a} {i}" for a, i in zip(axes, idx)) + "]"

    def axis(m):
        k = int(m.group(1))
        if k >= len(axes):
            return m.group(0)
        return f"axis {k} ({axes[k]}, of size" if m.group(2) else f"axis {k} ({axes[k]})"

    def pair(m):
        a, b = int(m.group(1)), int(m.group(2))
        if max(a, b) >= len(axes):
            return m.group(0)
        return f"axes {a} ({axes[a]}) and {b} ({axes[b]})"

    def length(m):
        k = int(m.group(1))
        return f"the length of the {axes[k]} axis (axis {k})" if k < len(axes) else m.group(0)

    message = _LENGTH.sub(length, message)  # before _AXIS, which would name it again
    return _AXES.sub(pair, _AXIS.sub(axis, _INDEX.sub(index, message)))
