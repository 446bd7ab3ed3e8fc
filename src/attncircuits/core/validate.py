"""Checks of what a user passes in: one check per kind of input, one message style.

A public function checks each argument once, where it is entered, and the functions it calls on
the way down trust what they are given. Every check returns the value in the form the code needs
(a Python ``int``, a ``[batch, pos]`` long tensor, a list of ``(layer, head)`` pairs) or raises one
line that names the input, says what is wrong with it and what to pass instead::

    head 4 does not exist; valid heads: 0..3
    layer must be an int, got 0.5
    tokens has 1 token per row, but a next-token loss needs at least 2 (one to predict)

Indices are Python ints, numpy integers or 0-d integer tensors; a float (even ``1.0``), a bool, a
string or ``None`` is refused rather than rounded, and negative indices do not wrap. Token ids come
in any container a user has (lists, numpy arrays of any integer type, including the ``uint16`` that
``data.tokenize_documents`` returns, and integer tensors).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch
from torch import Tensor

from attncircuits.core.heads import Head  # (layer, head)

#: visible stand-ins for whitespace that token strings may use (as ``data.visible`` prints them)
VISIBLE_WHITESPACE = {"·": " ", "⏎": "\n", "⇥": "\t", "␍": "\r"}


# ---- integers: indices and sizes ----------------------------------------------------------------
def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, Tensor) and value.ndim == 0 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool


def index(value: Any, name: str) -> int:
    """``value`` as a Python int; anything that is not an integer is refused (never rounded)."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def count(value: Any, name: str, minimum: int = 1, maximum: int | None = None, why: str = "") -> int:
    """A size (``seq_len``, ``batch_size``, ``k`` ...) in ``minimum..maximum``; ``why`` says what needs the bound."""
    n = index(value, name)
    if n < minimum or (maximum is not None and n > maximum):
        bound = f"at least {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{name} must be {bound}{f' ({why})' if why else ''}, got {n}")
    return n


def number(value: Any, name: str, minimum: float | None = None, above: bool = False) -> float:
    """A finite real number (``minimum``: the lowest allowed, excluded when ``above``) as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and (value < minimum or above and value == minimum):
        raise ValueError(f"{name} must be {'above' if above else 'at least'} {minimum}, got {value!r}")
    return float(value)


def path(value: Any, name: str) -> Path:
    """A file or folder name (a ``str`` or ``os.PathLike``; not an int, None or bytes) as a Path."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or Path), got {_short(value)}")
    return Path(value)


# ---- model depth, layers and heads --------------------------------------------------------------
def depth(model, what: str, at_least: int = 1, exactly: int | None = None) -> None:
    """Refuse a model too shallow (or, with ``exactly``, of another depth) for ``what``."""
    n = model.cfg.n_layers
    if n == 0 and at_least == 1:
        raise ValueError(
            f"this model has no attention layers (n_layers=0), so it has no {what}; "
            "load a model with layers, e.g. load_pretrained('attn-only-1l')"
        )
    if n < at_least:
        raise ValueError(
            f"{what} needs two layers (a later head reading an earlier one), but this model has n_layers={n}; "
            "load a two-layer model, e.g. load_pretrained('attn-only-2l')"
        )
    if exactly is not None and n != exactly:
        raise ValueError(
            f"{what} is written for exactly two layers (direct, single-head and virtual-head terms); "
            f"this model has n_layers={n}. Use a 2-layer model such as attn-only-2l"
        )


def in_range(value: Any, n: int, name: str, what: str) -> int:
    """An index into ``n`` things (``what``: "heads", "positions" ...): ``0 <= value < n``, no wrapping."""
    i = index(value, name)
    if not 0 <= i < n:
        valid = f"0..{n - 1}" if n else "none"
        raise IndexError(f"{name} {i} does not exist; valid {what}: {valid}")
    return i


def layer(model, value: Any, name: str = "layer", first: int = 0) -> int:
    """A layer index of ``model`` (or of a model with ``model`` layers, when an int); ``first`` is
    the lowest allowed (1 for a head that reads an earlier layer)."""
    n = model if isinstance(model, int) else model.cfg.n_layers
    i = index(value, name)
    if 0 <= i < first < n:
        raise IndexError(f"{name} {i} has no earlier layer to compose with; use {first}..{n - 1}")
    if n == 0:
        raise IndexError(f"{name} {i} does not exist; valid layers: none: the model has no layers")
    return in_range(i, n, name, "layers")


def head(model, value: Any, name: str = "head") -> int:
    """A head index within a layer of ``model``."""
    return in_range(value, model.cfg.n_heads, name, "heads")


def head_list(model, values: Any, name: str = "heads") -> list[int]:
    """A non-empty list of head indices within one layer."""
    if isinstance(values, (str, bytes)) or _is_int(values) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of head indices, got {values!r}")
    out = [head(model, v, "head") for v in values]
    if not out:
        raise ValueError(f"{name} is empty; pass at least one head")
    return out


def _is_pair(x: Any) -> bool:
    return isinstance(x, (tuple, list)) and len(x) == 2 and not any(isinstance(v, (tuple, list)) for v in x)


def head_pair(model, value: Any, name: str = "head") -> Head:
    """One ``(layer, head)`` pair of ``model``."""
    if not _is_pair(value):
        what = "a head" if name == "head" else name
        raise TypeError(f"{what} must be a (layer, head) pair of ints, got {value!r}")
    return layer(model, value[0], f"{name} layer" if name != "head" else "layer"), head(model, value[1], name)


def heads(model, value: Any, name: str = "heads") -> list[Head]:
    """One ``(layer, head)`` pair or a list of them, each checked; returns a list of int pairs."""
    if _is_pair(value):  # one pair of scalars, e.g. (0, 1)
        value = [value]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a (layer, head) pair or a list of them, got {value!r}")
    return [head_pair(model, item) for item in value]


# ---- token ids ----------------------------------------------------------------------------------
def int_tensor(value: Any, name: str, what: str = "token ids") -> Tensor:
    """Integers (``what``) from a list, a numpy array of any integer type (``uint16`` included) or a
    tensor, as an int64 tensor; floats, bools, strings and None are refused."""
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be {what} (a list, array or tensor of ints), got {value!r}")
    if isinstance(value, Tensor):
        if value.is_meta:
            raise TypeError(f"{name} is a tensor on the meta device (a shape without values); pass a tensor with data")
        t = value
    else:
        try:
            arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
        except ValueError:  # numpy cannot stack rows of different lengths
            raise ValueError(f"{name} is a ragged list (rows of different lengths); pad the rows to one length "
                             "or pass one row at a time") from None
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be {what} (a list, array or tensor of ints), got {_short(value)}")
        if arr.dtype.kind in "ui" or arr.size == 0:  # torch has few kernels for uint16; [] reads as float
            arr = arr.astype(np.int64)
        t = torch.from_numpy(np.ascontiguousarray(arr).reshape(arr.shape))  # (which makes a 0-d array 1-d)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be integer {what}, got dtype {t.dtype}")
    return t.to(torch.int64)


def _short(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


def _check_range(t: Tensor, d_vocab: int | None) -> None:
    if d_vocab is None:  # no vocabulary at hand: only negative ids are certainly wrong
        if t.numel() and int(t.min()) < 0:
            raise ValueError(f"token id {int(t.min())} is negative; token ids count from 0")
        return
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= d_vocab):
        bad = int(t[(t < 0) | (t >= d_vocab)][0])
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {d_vocab}); check the tokenizer")


def token_id(value: Any, d_vocab: int, name: str = "token") -> int:
    """One token id in ``[0, d_vocab)``, as a Python int."""
    i = index(value, name)
    if not 0 <= i < d_vocab:
        raise ValueError(f"token id {i} is outside the vocabulary [0, {d_vocab}); check the tokenizer")
    return i


def token_ids(value: Any, d_vocab: int | None, name: str = "tokens", ndim: int | None = None, allow_empty: bool = True) -> Tensor:
    """Token ids of any shape (``ndim`` to require one), each in ``[0, d_vocab)`` (``None``: not
    scanned), as an int64 tensor."""
    unsigned = str(getattr(value, "dtype", "")).startswith(("uint", "torch.uint"))  # no id below 0 to scan for
    t = int_tensor(value, name)
    if ndim is not None and t.ndim != ndim:
        want = "one 1-D sequence of token ids" if ndim == 1 else f"{ndim}-D token ids"
        raise ValueError(f"{name} must be {want}, got shape {tuple(t.shape)}; flatten it first")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} is empty; pass at least one token id")
    if d_vocab is not None or not unsigned:
        _check_range(t, d_vocab)
    return t


def token_rows(
    value: Any, n_ctx: int | None = None, d_vocab: int | None = None, min_len: int = 1, why: str = "", name: str = "tokens"
) -> Tensor:
    """``[pos]`` or ``[batch, pos]`` ids, at most ``n_ctx`` and at least ``min_len`` per row (``why``
    names what needs them), in ``[0, d_vocab)``: a ``[batch, pos]`` int64 tensor."""
    t = int_tensor(value, name)
    if t.ndim == 0:
        raise ValueError(f"{name} is a single number ({int(t)}), not a sequence of token ids; pass [{int(t)}] for one token")
    if t.ndim == 1:
        t = t[None]
    if t.ndim != 2:
        raise ValueError(f"{name} must be [pos] or [batch, pos], got shape {tuple(t.shape)}")
    if t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(f"empty input: {name} has shape {tuple(t.shape)}; pass at least one token")
    if n_ctx is not None and t.shape[1] > n_ctx:
        raise ValueError(
            f"sequence has {t.shape[1]} tokens but the model has n_ctx={n_ctx}; pass a shorter text or split it into windows"
        )
    if t.shape[1] < min_len:
        raise ValueError(
            f"{name} has {t.shape[1]} token(s) per row, but {why or 'this'} needs at least {min_len}; pass longer rows"
        )
    _check_range(t, d_vocab)
    return t


def tokens(model, value: Any, min_len: int = 1, why: str = "", name: str = "tokens") -> Tensor:
    """Model input (:func:`token_rows` with the model's ``n_ctx`` and ``d_vocab``), as a
    ``[batch, pos]`` long tensor on the model's device."""
    t = token_rows(value, model.cfg.n_ctx, model.cfg.d_vocab, min_len, why, name)
    return t.to(next(model.parameters()).device)


# ---- text and token strings ---------------------------------------------------------------------
def text(value: Any, name: str = "text") -> str:
    """A ``str`` that is valid Unicode (no lone surrogate, which no encoder can write)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{name} holds a lone surrogate {value[err.start]!r} at index {err.start}, which is not valid Unicode; "
            "remove it (text read with errors='surrogateescape' has them)"
        ) from None
    return value


def token(tokenizer, value: Any, d_vocab: int | None = None, ids: bool = True, name: str = "token") -> int:
    """One token: a string that is exactly one token (``·``/``⏎``/``⇥`` may stand for whitespace) or,
    with ``ids``, an id in ``[0, d_vocab)`` (default: the tokenizer's vocabulary)."""
    d_vocab = tokenizer.get_vocab_size() if d_vocab is None else d_vocab
    if isinstance(value, str):
        if not value:
            raise ValueError("empty string: type one token, e.g. '·self' (· stands for a space)")
        raw = "".join(VISIBLE_WHITESPACE.get(c, c) for c in text(value, f"{name} string"))
        found = tokenizer.encode(raw).ids
        if len(found) != 1:
            pieces = ["".join({v: k for k, v in VISIBLE_WHITESPACE.items()}.get(c, c) for c in tokenizer.decode([i])) for i in found]
            raise ValueError(
                f"{value!r} is not a single token: it splits into {len(found)} tokens, {' | '.join(pieces)}; "
                f"pick one of those pieces{f', or an id in [0, {d_vocab})' if ids else ''}"
            )
        if found[0] >= d_vocab:
            raise ValueError(f"{value!r} is token id {found[0]}, outside the vocabulary [0, {d_vocab}) of this model")
        return found[0]
    if not ids or not _is_int(value):
        kind = "a one-token string" if not ids else "an id (int) or a one-token string"
        raise TypeError(f"{name} must be {kind}, got {value!r}")
    return token_id(value, d_vocab, name)


def token_list(tokenizer, values: Any, d_vocab: int, name: str = "tokens") -> Tensor:
    """A non-empty vocabulary subset from ids and one-token strings; one error lists every bad entry."""
    if isinstance(values, (str, bytes)) or _is_int(values) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of ids or one-token strings, got {values!r}")
    values = list(values)
    out, bad = [], []
    for v in values:
        try:
            out.append(token(tokenizer, v, d_vocab))
        except (TypeError, ValueError) as err:
            bad.append(str(err))
    if bad:
        raise ValueError(
            f"{len(bad)} of the {len(values)} tokens are not in the vocabulary: "
            + "; ".join(bad)
            + ". Use one-token strings (check with tokenizer.encode) or ids"
        )
    if not out:
        raise ValueError(f"the token subset {name} is empty; pass at least one token")
    return torch.tensor(out, dtype=torch.long)


# ---- repeated random sequences ------------------------------------------------------------------
def max_repeat_len(n_ctx: int, n_repeats: int = 2, prepend_eot: bool = True) -> int:
    """The longest sequence that fits ``n_repeats`` times (plus the start token) in ``n_ctx``."""
    return (n_ctx - int(prepend_eot)) // n_repeats


def repeats(
    seq_len: Any, n_repeats: Any, n_ctx: int | None, prepend_eot: bool = True, min_len: int = 1, min_repeats: int = 1, why: str = ""
) -> tuple[int, int]:
    """``(seq_len, n_repeats)`` of a repeated random sequence, checked to fit ``n_ctx`` (when given);
    ``min_len``/``min_repeats`` (with ``why``) for measures that need longer sequences or more copies."""
    seq_len = count(seq_len, "seq_len", min_len, why=why if min_len > 1 else "")
    n_repeats = count(n_repeats, "n_repeats", min_repeats, why=why if min_repeats > 1 else "")
    need = seq_len * n_repeats + int(prepend_eot)
    if n_ctx is not None and need > n_ctx:
        best = max_repeat_len(n_ctx, n_repeats, prepend_eot)
        raise ValueError(
            f"{n_repeats} copies of {seq_len} tokens{' plus the start token' if prepend_eot else ''} need {need} "
            f"positions but the model has n_ctx={n_ctx}; the maximum seq_len for {n_repeats} copies is {best}"
        )
    return seq_len, n_repeats


def repeat_args(model, seq_len, n_repeats, batch_size, min_len: int = 1, min_repeats: int = 1, why: str = ""):
    """Checked ``(seq_len, n_repeats, batch_size)`` of repeated tokens that fit the model (``seq_len``
    None: the longest that fits)."""
    n_repeats = count(n_repeats, "n_repeats", min_repeats, why=why if min_repeats > 1 else "")
    if seq_len is None:
        seq_len = max_repeat_len(model.cfg.n_ctx, n_repeats)
    seq_len, n_repeats = repeats(seq_len, n_repeats, model.cfg.n_ctx, min_len=min_len, why=why)
    return seq_len, n_repeats, count(batch_size, "batch_size")


# ---- edits of a forward pass --------------------------------------------------------------------
def ablations(model, value: Any, batch: int, pos: int) -> dict:
    """``ablate`` of a forward pass on ``[batch, pos]`` tokens, ``{(layer, head): replacement}``: each
    value a finite number, a float tensor that broadcasts to the head's output
    ``[batch, pos, d_model]`` (both returned as tensors), or a function of that output."""
    out: dict = {}
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"ablate must be a dict {{(layer, head): replacement}}, got {_short(value)}")
    want = (batch, pos, model.cfg.d_model)
    for key, v in (value or {}).items():
        l, h = head_pair(model, key)
        if callable(v) and not isinstance(v, Tensor):
            out[(l, h)] = v
            continue
        what = f"ablate[{(l, h)}]"
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number, np.ndarray, Tensor)):
            raise TypeError(f"{what} must be a number, a tensor [batch, pos, d_model] or a function, got {_short(v)}")
        t = _float_tensor(v, what)
        if len(t.shape) > 3 or any(a not in (1, b) for a, b in zip(reversed(t.shape), reversed(want))):
            raise ValueError(f"{what} has shape {tuple(t.shape)}, which does not fit the head's output [batch, pos, d_model] = "
                             f"{list(want)}")
        out[(l, h)] = t
    return out


def patterns(model, value: Any, batch: int, pos: int) -> dict:
    """``patterns`` of a forward pass on ``[batch, pos]`` tokens, ``{(layer, head): pattern}``: each a
    float tensor ``[q, k]`` or ``[batch, q, k]`` (at least ``pos`` square; it is cut to ``pos``) whose
    rows are attention weights: >= 0, summing to 1."""
    out: dict = {}
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"patterns must be a dict {{(layer, head): pattern}}, got {_short(value)}")
    for key, p in (value or {}).items():
        l, h = head_pair(model, key)
        what = f"patterns[{(l, h)}]"
        t = _float_tensor(p, what)
        if t.ndim not in (2, 3) or t.shape[-1] != t.shape[-2] or t.shape[-1] < pos or t.ndim == 3 and t.shape[0] not in (1, batch):
            raise ValueError(f"{what} has shape {tuple(t.shape)}; a pattern is [q, k] or [batch, q, k] with q = k >= {pos} "
                             f"(the tokens' length) and batch 1 or {batch}")
        rows, sums = t[..., :pos, :pos], t[..., :pos, :pos].sum(-1)
        if bool((rows < 0).any()) or not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            raise ValueError(f"{what} is not an attention pattern: each query's weights must be >= 0 and sum to 1 over the keys "
                             f"(got weights from {float(rows.min()):.3g}, row sums {float(sums.min()):.3g}..{float(sums.max()):.3g})")
        out[(l, h)] = t
    return out


def _float_tensor(value: Any, what: str) -> Tensor:
    if isinstance(value, Tensor) and value.is_meta:
        raise TypeError(f"{what} is a tensor on the meta device (a shape without values); pass a tensor with data")
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{what} must be a float tensor, got {_short(value)}") from None
    if t.dtype == torch.bool or t.is_complex() or not bool(torch.isfinite(t).all()):
        raise ValueError(f"{what} must hold finite real numbers, got {_short(value)}")
    return t if t.is_floating_point() else t.float()
