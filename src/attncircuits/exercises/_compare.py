"""Comparing a learner's output with the reference: structure first, then values, then a guess
at the mistake (sign, transpose, a constant factor) when no named diagnosis matched.

Part of the check machinery (see :mod:`._core`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._run import _Stop

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
    if not isinstance(expected, Tensor) or expected.is_complex():
        return "the values differ"
    integer = not expected.is_floating_point()
    dtype = torch.float64 if integer else expected.dtype
    g, e = got.detach().to(dtype), expected.detach().to(dtype)
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
    if integer:
        return (
            f"{int((diff > 0).sum())} of {diff.numel()} entries differ (e.g. at index {list(idx)}: got "
            f"{int(g[idx])}, expected {int(e[idx])})"
        )
    return (
        f"values differ by up to {float(diff.max()):.3g} (at index {list(idx)}: got {float(g[idx]):.5g}, "
        f"expected {float(e[idx]):.5g})"
    )
