"""The contract every check keeps, whatever its chapter: the caller's inputs are left as they were,
the output has the type the exercise's text asks, and beside the fixed cases the learner's
function meets cases drawn from the exercise's input description, edges included.

Part of the check machinery (see :mod:`._core`, whose ``run_check`` applies all of it).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import random
import re
import zlib
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor


# ---- inputs left as they were ----------------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    """Whether ``a`` (the copy the learner's function was given, after the call) still equals
    ``b`` (the case's own input): tensors and numpy arrays entry by entry (NaN equal to NaN),
    containers item by item, a module by its parameters and buffers, a dataclass by its fields;
    anything else is not compared."""
    if isinstance(b, Tensor):
        if not isinstance(a, Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = a.detach(), b.detach()
        if a.is_floating_point() or a.is_complex():
            return bool((a.eq(b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    if isinstance(b, np.ndarray):  # e.g. ``pm[:, 0] = -np.inf`` on the caller's array
        if not isinstance(a, np.ndarray) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        nan = a.dtype.kind in "fc"
        return bool(np.array_equal(a, b, equal_nan=nan))
    if isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, torch.nn.Module):
        return isinstance(a, torch.nn.Module) and _same(dict(a.state_dict()), dict(b.state_dict()))
    if dataclasses.is_dataclass(b) and not isinstance(b, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(b))
    if isinstance(b, (int, float, str, bool)) or b is None:
        return type(a) is type(b) and (a == b or (isinstance(b, float) and math.isnan(a) and math.isnan(b)))
    return True


def positional_names(fn: Callable | None) -> list[str]:
    """The names of ``fn``'s parameters that a positional argument can fill, in order, up to the
    first ``*args`` or keyword-only one (none for a builtin without a signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        names.append(p.name)
    return names


_SIGNATURE = re.compile(r"``\s*\w+\(([^()]*)\)")


def text_names(doc: str | None) -> list[str]:
    """The parameter names of the first call written ``name(a, b [shape], c=1)`` in ``doc`` (a
    check's docstring gives the exercise's stub so: ``next_token_loss(logits, tokens)``)."""
    m = _SIGNATURE.search(doc or "")
    if m is None:
        return []
    inner = re.sub(r"\[[^\]]*\]", "", m.group(1))  # shapes: ``pattern [batch, head, q, k]``
    names = [re.match(r"\s*\*{0,2}(\w*)", part).group(1) for part in inner.split(",")]
    return [n for n in names if n] if all(names) or names == [""] else []


def arg_names(fn: Callable | None, n: int, *fallbacks: list[str] | Callable | None) -> list[str]:
    """The names the messages give the first ``n`` arguments: the learner's own function's (the
    stub's, once the learner filled it in), position by position, then where it has none there (a
    ``lambda *a``, too few parameters) those of each fallback in turn (the exercise's text, the
    reference), else "argument i"."""
    lists = [positional_names(fn)] + [f if isinstance(f, list) else positional_names(f) for f in fallbacks]
    out = []
    for i in range(n):
        name = next((names[i] for names in lists if i < len(names) and names[i] not in out), None)
        out.append(name or f"argument {i + 1}")
    return out


def _hooks(model: torch.nn.Module) -> int:
    """The forward hooks on ``model`` and its submodules (a state_dict does not show them)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def changed_inputs(given: tuple, kwargs_given: dict, case, names: list[str]) -> str | None:
    """The message when the learner's function changed an input in place, else None."""
    for name, a, b in [*zip(names, given, case.args), *((k, kwargs_given[k], v) for k, v in case.kwargs.items())]:
        left = _hooks(a) - _hooks(b) if isinstance(a, torch.nn.Module) and isinstance(b, torch.nn.Module) else 0
        if left > 0:
            return (f"your function leaves {left} hook(s) on `{name}`: every later run of the "
                    "model goes through them. Remove each (handle.remove()), or pass them for one run only "
                    "(run_with_hooks, or a `with model.hooks(...)` block)")
        try:
            same = _same(a, b)
        except Exception:
            same = True
        if not same:
            return (f"your function changed `{name}` in place; the caller's inputs must stay as they were "
                    f"(write `x = x * s`, not `x *= s`; copy with `.clone()` or `list(...)` before editing)")
    return None


# ---- the return type the text asks -----------------------------------------------------------------
def _kind(x) -> str:
    if isinstance(x, Tensor):
        return f"a {x.ndim}-d tensor" if x.ndim < 2 or x.numel() <= 1 else f"a tensor of shape {list(x.shape)}"
    mod = type(x).__module__
    return f"a {mod}.{type(x).__name__}" if mod not in ("builtins",) else f"a{'n' if type(x).__name__[0] in 'aeiou' else ''} {type(x).__name__}"


def wrong_type(got, returns) -> str | None:
    """The message when ``got`` is not of the type the exercise asks (``float``, ``int``, ``str``,
    or a ``tuple`` or ``list`` given as the other), else None. A float is a Python or numpy float;
    an int a Python or numpy integer, never a bool. The
    message says what ``got`` is before any fix (a complex number, a tensor of 16 numbers): a fix
    that cannot work on it (``float()`` of a complex tensor) is never suggested."""
    if returns is None:
        return None
    if returns in (tuple, list) and isinstance(got, (tuple, list)) and not isinstance(got, returns):
        fix = ("`return a, b` makes one; a list never equals a tuple: [1, 2] == (1, 2) is False" if returns is tuple
               else "`list(...)` turns it into one")
        return f"returns {_kind(got)}; the exercise asks for a {returns.__name__} ({fix})"
    if returns is str and not isinstance(got, str):
        return f"returns {_kind(got)}; the exercise asks for a str, one of the words its text lists"
    is_bool = isinstance(got, (bool, np.bool_))
    if returns is float:
        ok = isinstance(got, (float, np.floating)) and not is_bool
        fix = "`float(...)` turns it into one"
    elif returns is int:
        ok = isinstance(got, (int, np.integer)) and not is_bool
        fix = "`int(...)` turns it into one"
    else:
        return None
    if ok:
        return None
    asks = f"the exercise asks for a{'n' if returns is int else ''} {returns.__name__}"
    complex_ = (isinstance(got, Tensor) and got.is_complex()) or isinstance(got, (complex, np.complexfloating))
    if complex_:
        what = f"a complex {got.ndim}-d tensor" if isinstance(got, Tensor) else "a complex number"
        return (f"returns {what}; {asks}: a complex value has no single float (take the part the text "
                f"asks for, e.g. `.real`, then {fix.split(' turns')[0]})")
    if isinstance(got, Tensor) and got.numel() > 1:
        return (f"returns {_kind(got)}, {got.numel()} numbers where {asks}, one number: is a mean or a sum "
                f"over an axis missing (a batch of {got.shape[0]}?)")
    return f"returns {_kind(got)}; {asks} ({fix})"


# ---- generated cases -------------------------------------------------------------------------------
class Draw:
    """Seeded draws for one generated case: ``Draw(name, i)`` gives the same numbers every time
    for the same check and index. ``i`` lets a generator go through its edge cases first
    (``draw.edge(n)`` is the edge number ``i`` while ``i < n``, else None)."""

    def __init__(self, name: str, i: int):
        seed = zlib.crc32(f"{name}/{i}".encode())
        self.i, self.rng = i, random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def edge(self, n: int) -> int | None:
        return self.i if self.i < n else None

    def int(self, lo: int, hi: int) -> int:
        """A uniform integer in ``[lo, hi]``, the ends drawn more often (a size of 1, the largest)."""
        r = self.rng.random()
        return lo if r < 0.15 else hi if r < 0.3 else self.rng.randint(lo, hi)

    def randn(self, *shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=self.gen) * scale

    def rand(self, *shape: int, lo: float = 0.0, hi: float = 1.0) -> Tensor:
        return lo + (hi - lo) * torch.rand(*shape, generator=self.gen)

    def choice(self, options):
        return options[self.rng.randrange(len(options))]


def _number(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _values(x: Tensor) -> str:
    """A small tensor's values, numpy-style (``[[4 1 3 0 5]]``): the brackets show its shape."""
    if x.ndim == 0:
        return _number(x.item())
    if x.ndim == 1:
        return "[" + " ".join(_number(v) for v in x.tolist()) + "]"
    return "[" + " ".join(_values(row) for row in x) + "]"


def describe(args: tuple, names: list[str], note: str = "") -> str:
    """A generated case in a few words, each input by its name: small tensors and lists by value,
    larger tensors by shape, a model by its sizes (``logits: a 1 x 5 x 6 tensor, tokens: [[4 1 3
    0 5]]``)."""

    def one(x) -> str:
        if isinstance(x, Tensor):
            if x.numel() <= 8 and x.ndim <= 3 and not x.is_complex():
                return _values(x)
            return f"a {' x '.join(map(str, x.shape))} tensor"
        cfg = getattr(x, "cfg", None)
        if cfg is not None and all(hasattr(cfg, k) for k in ("n_layers", "n_heads", "d_head", "d_vocab", "n_ctx")):
            heads = f"{cfg.n_heads} head{'s' * (cfg.n_heads != 1)} of {cfg.d_head}"
            return (f"a {cfg.n_layers}-layer model ({heads}, d_model {cfg.d_model}, d_vocab {cfg.d_vocab}, "
                    f"n_ctx {cfg.n_ctx})")
        if isinstance(x, slice):
            return f"slice({x.start}, {x.stop})"
        if isinstance(x, (list, tuple)) and len(x) <= 12:
            return repr(type(x)(round(v, 4) if isinstance(v, float) else v for v in x))
        if isinstance(x, (list, tuple)):
            return f"a {type(x).__name__} of {len(x)}"
        return repr(x) if isinstance(x, (int, float, str)) or dataclasses.is_dataclass(x) else type(x).__name__

    parts = ", ".join(f"{n}: {one(a)}" for n, a in zip(names, args))
    return parts + (f"; {note}" if note else "")
