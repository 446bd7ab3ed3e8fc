"""A fuzz of the public API: every function that takes token ids, heads, layers, token strings or
sizes, and the arguments a user types beside them (ablation values and attention patterns, the
positions a loss averages, config fields, checkpoint paths, devices, models to convert), called
with valid and invalid values of each, and every call classified. Token ids come also as values
that hold none: meta-device tensors, ragged lists, single numbers.

Each argument is drawn from a pool of values of its kind, every value marked valid or invalid for
that kind (``Val``); a call is valid when all its values are and the model meets the function's
depth requirement (and, where sizes interact, the target's own ``extra`` check). Outcomes:

- ``clear``: an invalid call refused with ValueError/TypeError/IndexError/KeyError/FileNotFoundError
  raised from inside ``attncircuits``, whose message names one of the bad inputs;
- ``correct``: a valid call that returned a finite result of the right shape;
- ``deep``: any other exception: raised from torch, numpy or Python internals, of another type, or
  with a message that does not name the bad input;
- ``silent``: an invalid call that returned, or a valid one whose result is NaN/inf or misshapen;
- ``refused``: a valid call that raised.

Used by ``tests/test_fuzz.py`` (bounded, derandomized, asserts no ``deep`` and no ``silent``) and by
``benchmarks/fuzz_report.py`` (prints the totals for a seed and a number of examples).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st

import attncircuits
from attncircuits import ModelConfig, Transformer, data
from attncircuits.analysis import losses
from attncircuits.analysis import scores as S
from attncircuits.analysis.circuits import (
    bigrams,
    composition,
    copying,
    factored,
    factored_matrix,
    induction,
    paths,
    skip_trigrams,
    two_layer_paths,
)
from attncircuits.checkpoints import pretrained
from attncircuits.checkpoints.pretrained import load_checkpoint, load_pretrained
from attncircuits.core import validate
from attncircuits.models import interop
from attncircuits.models.smeared import SmearedKeyTransformer, train_on_repeated_tokens, varied_repeats
from attncircuits.show.widgets.chapters import snapshot_steps_control

PACKAGE_DIR = Path(attncircuits.__file__).resolve().parent
OUR_ERRORS = (ValueError, TypeError, IndexError, KeyError, FileNotFoundError)
OUTCOMES = ("clear", "correct", "deep", "silent", "refused")
N_LAYERS, N_HEADS, D_VOCAB, N_CTX = 2, 4, 50, 16


class Lazy:
    """A value made when a call first needs it, not when the targets are listed: the listing runs
    in every pytest worker at collection, and a TransformerLens model or a tensor on the meta device
    imports TransformerLens or torch._dynamo (about 5 s) there."""

    def __init__(self, make: Callable[[], Any]):
        self.make = cache(make)


@dataclass(frozen=True)
class Val:
    """One argument value (``raw``: itself, or a :class:`Lazy` that makes it): whether it is valid
    for its kind, a label for reports, and the words of which an error refusing it must contain one."""

    raw: Any
    valid: bool
    label: str
    words: tuple[str, ...] = ()

    @property
    def value(self) -> Any:
        return self.raw.make() if isinstance(self.raw, Lazy) else self.raw

    def __repr__(self) -> str:
        return self.label


# ---- models and fixtures, built once ----------------------------------------------------------
@cache
def model(n_layers: int = N_LAYERS) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=n_layers, d_model=32, n_heads=N_HEADS, d_head=8, d_vocab=D_VOCAB, n_ctx=N_CTX)
    return Transformer(cfg).eval()


@cache
def smeared() -> SmearedKeyTransformer:
    torch.manual_seed(0)
    return SmearedKeyTransformer(ModelConfig(n_layers=1, d_model=32, n_heads=N_HEADS, d_head=8, d_vocab=D_VOCAB, n_ctx=N_CTX))


@cache
def tokenizer():
    from attncircuits.checkpoints.pretrained import CORPUS_DIR

    return data.load_tokenizer(CORPUS_DIR / "tokenizer.json")


@cache
def checkpoint():
    """A tiny checkpoint with two snapshots, for the snapshot explorer."""
    from attncircuits.checkpoints.pretrained import CORPUS_DIR, load_checkpoint, save_checkpoint, state_dict_for_save

    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=2048, n_ctx=N_CTX)
    snaps = {step: state_dict_for_save(Transformer(cfg)) for step in (0, 10)}
    out = Path(tempfile.mkdtemp(prefix="fuzz-ck-")) / "ck"
    return load_checkpoint(save_checkpoint(Transformer(cfg), out, CORPUS_DIR / "tokenizer.json", snapshots=snaps))


@cache
def counts() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return bigrams.count_bigrams(torch.randint(0, D_VOCAB, (2000,), generator=g), D_VOCAB)


# ---- pools of values, by kind -----------------------------------------------------------------
def ints(name: str, lo: int, hi: int | None, extra_invalid: tuple = (), include_none: bool | None = None) -> list[Val]:
    """An index or size in ``lo..hi`` (inclusive; ``hi=None``: no upper bound): in-range ints (also
    numpy and 0-d tensors) are valid; out of range, floats, bools, strings and None are not (None
    is valid when ``include_none``: the argument's default)."""
    w = (name,)
    top = lo + 1 if hi is None else hi
    out = [Val(lo, True, f"{name}={lo}"), Val(top, True, f"{name}={top}")]
    out += [Val(np.int64(top), True, f"{name}=np.int64({top})"), Val(torch.tensor(lo), True, f"{name}=tensor({lo})")]
    out += [Val(lo - 1, False, f"{name}={lo - 1}", w)]
    out += [Val(hi + 1, False, f"{name}={hi + 1}", w)] if hi is not None else []
    out += [Val(lo + 0.5, False, f"{name}={lo + 0.5}", w), Val(float(lo), False, f"{name}={float(lo)}", w)]
    out += [Val(str(lo), False, f"{name}='{lo}'", w), Val(True, False, f"{name}=True", w)]
    out += [Val(v, False, f"{name}={v!r}", w) for v in extra_invalid]
    if include_none is not None:
        out.append(Val(None, include_none, f"{name}=None", () if include_none else w))
    return out


def layers(m: Transformer, name: str = "layer", lo: int = 0) -> list[Val]:
    return ints(name, lo, max(lo, m.cfg.n_layers - 1), extra_invalid=(-1,))


def heads_of_layer(name: str = "head", include_none: bool | None = None) -> list[Val]:
    return ints(name, 0, N_HEADS - 1, extra_invalid=(-1, 1.9), include_none=include_none)


def head_lists(name: str = "heads", include_none: bool | None = None) -> list[Val]:
    """Lists of head indices within one layer."""
    w = ("head",)
    out = [Val([0, 2], True, f"{name}=[0, 2]"), Val((1,), True, f"{name}=(1,)"), Val(range(4), True, f"{name}=range(4)")]
    out += [Val([0, 4], False, f"{name}=[0, 4]", w), Val([-1], False, f"{name}=[-1]", w)]
    out += [Val([0.5], False, f"{name}=[0.5]", w), Val([None], False, f"{name}=[None]", w)]
    out += [Val(["0"], False, f"{name}=['0']", w), Val(3, False, f"{name}=3", w)]
    if include_none is not None:
        out.append(Val(None, include_none, f"{name}=None"))
    return out


def head_pairs(name: str = "heads", empty_ok: bool = True) -> list[Val]:
    """One ``(layer, head)`` or a list of them (valid for the 2-layer model)."""
    w = ("head", "layer")
    out = [Val((0, 1), True, f"{name}=(0, 1)"), Val([(1, 3), (0, 0)], True, f"{name}=[(1, 3), (0, 0)]")]
    out += [Val((np.int64(1), 2), True, f"{name}=(np.int64(1), 2)"), Val([[1, 2]], True, f"{name}=[[1, 2]]")]
    out += [Val((0.5, 1.9), False, f"{name}=(0.5, 1.9)", w), Val((0, -1), False, f"{name}=(0, -1)", w)]
    out += [Val((-1, 0), False, f"{name}=(-1, 0)", w), Val((2, 0), False, f"{name}=(2, 0)", w)]
    out += [Val((0, 4), False, f"{name}=(0, 4)", w), Val((0, None), False, f"{name}=(0, None)", w)]
    out += [Val([(0, "0")], False, f"{name}=[(0, '0')]", w), Val([3], False, f"{name}=[3]", w)]
    out += [Val((0, 1, 2), False, f"{name}=(0, 1, 2)", w), Val("0", False, f"{name}='0'", w)]
    out += [Val([], empty_ok, f"{name}=[]", () if empty_ok else w)]
    return out


def token_rows(
    min_len: int = 1, n_ctx: int = N_CTX, d_vocab: int = D_VOCAB, name: str = "tokens", model_free: bool = False
) -> list[Val]:
    """Token batches ``[pos]`` or ``[batch, pos]`` in every container a user has: lists, numpy
    arrays (uint16 as ``data.tokenize_documents`` returns, int32), int32/int64 tensors. Rows shorter
    than ``min_len`` are invalid; so are rows longer than ``n_ctx`` and ids ``>= d_vocab`` unless
    ``model_free`` (a function that has no model to bound them)."""
    w = ("token", name)
    g = torch.Generator().manual_seed(1)
    two = torch.randint(1, d_vocab, (2, 10), generator=g)
    out = [
        Val(two, True, f"{name}=long[2, 10]"),
        Val(two[0].tolist(), True, f"{name}=list[10]"),
        Val(two.numpy().astype(np.uint16), True, f"{name}=uint16[2, 10]"),
        Val(two.numpy().astype(np.int32), True, f"{name}=np.int32[2, 10]"),
        Val(two.to(torch.int32), True, f"{name}=int32[2, 10]"),
        Val(torch.randint(1, d_vocab, (3, n_ctx), generator=g), True, f"{name}=long[3, n_ctx]"),
        Val(two[:, :2], min_len <= 2, f"{name}=long[2, 2]", () if min_len <= 2 else w),
        Val(two[:1, :1], min_len <= 1, f"{name}=long[1, 1]", () if min_len <= 1 else w),
        Val([5], min_len <= 1, f"{name}=[5]", () if min_len <= 1 else w),
        Val(two.float(), False, f"{name}=float[2, 10]", w),
        Val(two.bool(), False, f"{name}=bool[2, 10]", w),
        Val(torch.full((2, 10), d_vocab), model_free, f"{name}=d_vocab", () if model_free else w),
        Val(torch.full((2, 10), -1), False, f"{name}=-1", w),
        Val(torch.zeros(2, 0, dtype=torch.long), False, f"{name}=[2, 0]", w),
        Val([], False, f"{name}=[]", w),
        Val(torch.ones(2, n_ctx + 1, dtype=torch.long), model_free, f"{name}=[2, n_ctx+1]", () if model_free else w + ("n_ctx",)),
        Val(torch.ones(2, 2, 3, dtype=torch.long), False, f"{name}=[2, 2, 3]", w),
        Val(None, False, f"{name}=None", w),
        Val("hello", False, f"{name}='hello'", w),
        Val([1, 2.5, 3], False, f"{name}=[1, 2.5, 3]", w),
        *no_values(name, ndim=2),
        Val(4, False, f"{name}=4", w), Val(np.array(4), False, f"{name}=np.array(4)", w),
        Val(torch.tensor(4), False, f"{name}=tensor(4)", w),
    ]
    return out


def no_values(name: str, ndim: int = 1) -> list[Val]:
    """Inputs that look like ids but hold none: a meta-device tensor (a shape without values) and a
    ragged list (rows of different lengths, no array)."""
    w = ("token", name)
    shape = (2, 3) if ndim == 2 else (3,)
    return [Val(Lazy(lambda: torch.ones(shape, dtype=torch.long, device="meta")), False, f"{name}=meta{list(shape)}", w),
            Val([[1, 2], [3]], False, f"{name}=ragged [[1, 2], [3]]", w)]


def token_stream(
    d_vocab: int = D_VOCAB, min_len: int = 1, name: str = "tokens", model_free: bool = False, empty_ok: bool = False
) -> list[Val]:
    """A 1-D stream of ids (a vocabulary subset, a list to decode, a text to count); ids ``>= d_vocab``
    are valid when ``model_free``, the empty stream when ``empty_ok``."""
    w = ("token", name)
    out = [
        Val([3, 1, 4, 1, 5], True, f"{name}=[3, 1, 4, 1, 5]"),
        Val(np.array([7, 8, 9], dtype=np.uint16), True, f"{name}=uint16[3]"),
        Val(torch.tensor([2, 3], dtype=torch.int32), True, f"{name}=int32[2]"),
        Val(torch.arange(d_vocab), True, f"{name}=arange(d_vocab)"),
        Val([4], min_len <= 1, f"{name}=[4]", () if min_len <= 1 else w),
        Val([d_vocab], model_free, f"{name}=[d_vocab]", () if model_free else w),
        Val([-1, 2], False, f"{name}=[-1, 2]", w),
        Val([0.5, 1.0], False, f"{name}=[0.5, 1.0]", w),
        Val([None], False, f"{name}=[None]", w),
        Val(None, False, f"{name}=None", w),
        Val([], empty_ok, f"{name}=[]", () if empty_ok else w),
        Val(torch.ones(2, 2, dtype=torch.long), False, f"{name}=[2, 2]", w),
        Val(np.array([1, 2], dtype=np.float32), False, f"{name}=float32[2]", w),
        *no_values(name),
    ]
    return out


def subsets() -> list[Val]:
    """A vocabulary subset (ids) or None, the whole vocabulary."""
    return [v for v in token_stream() if v.value is not None] + [Val(None, True, "tokens=None")]


def token_strings(d_vocab: int = 2048, name: str = "token", ids_ok: bool = True) -> list[Val]:
    """One token as a string (``·`` a space) or an id."""
    w = ("token", "string", "surrogate", "text")
    out = [Val("·self", True, f"{name}='·self'"), Val(" self", True, f"{name}=' self'"), Val("a", True, f"{name}='a'")]
    out += [Val("antidisestablishmentarianism", False, f"{name}='antidis…'", w), Val("", False, f"{name}=''", w)]
    out += [Val("\ud800", False, f"{name}='\\ud800'", w), Val(None, False, f"{name}=None", w)]
    out += [Val(b"self", False, f"{name}=b'self'", w), Val(["self"], False, f"{name}=['self']", w)]
    out += [Val(5, ids_ok, f"{name}=5", () if ids_ok else w), Val(np.uint16(7), ids_ok, f"{name}=uint16(7)", () if ids_ok else w)]
    out += [Val(d_vocab, False, f"{name}={d_vocab}", w), Val(-1, False, f"{name}=-1", w), Val(2.5, False, f"{name}=2.5", w)]
    out += [Val(True, False, f"{name}=True", w)]
    return out


def texts(name: str = "text") -> list[Val]:
    w = ("text", "string", "surrogate", "str")
    return [
        Val("def f(x):\n    return x", True, f"{name}=code"),
        Val("", True, f"{name}=''"),
        Val("naïve ☃ 𝔘", True, f"{name}=unicode"),
        Val("a\ud800b", False, f"{name}=lone surrogate", w),
        Val(None, False, f"{name}=None", w),
        Val(b"bytes", False, f"{name}=b'bytes'", w),
        Val(5, False, f"{name}=5", w),
    ]


def sizes(name: str, lo: int, hi: int | None = None, include_none: bool | None = None) -> list[Val]:
    """A count of at least ``lo`` (at most ``hi`` where the function has a bound)."""
    return ints(name, lo, hi, extra_invalid=(-3,), include_none=include_none)


def models(at_least: int = 1, exactly: int | None = None) -> list[Val]:
    """The tiny models with 0..3 layers; valid when they meet the function's depth requirement."""
    out = []
    for n in (0, 1, 2, 3):
        ok = n == exactly if exactly is not None else n >= at_least
        out.append(Val(n, ok, f"model({n}L)", () if ok else ("layer",)))
    return out


# ---- result checks ----------------------------------------------------------------------------
def finite(x) -> bool:
    """Every number in ``x`` (tensors, floats, containers, dataclasses) is finite."""
    if isinstance(x, torch.Tensor):
        return not x.is_floating_point() and not x.is_complex() or bool(torch.isfinite(x).all())
    if isinstance(x, np.ndarray):
        return x.dtype.kind not in "fc" or bool(np.isfinite(x).all())
    if isinstance(x, (float, int)):
        return math.isfinite(x)
    if isinstance(x, factored_matrix.FactoredMatrix):
        return finite(x.A) and finite(x.B)
    if isinstance(x, dict):
        return all(finite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(finite(v) for v in x)
    if dataclasses.is_dataclass(x):
        return all(finite(getattr(x, f.name)) for f in dataclasses.fields(x))
    return True


def shape(*want) -> Callable[[Any], bool]:
    return lambda r: tuple(r.shape) == tuple(want)


# ---- targets ----------------------------------------------------------------------------------
@dataclass
class Target:
    """A public function, the pools of its arguments (keyword -> list of ``Val``) and a check of a
    valid call's result. ``call(**values)`` makes the call; ``extra(**values)`` says whether values
    that are each valid are valid together (returns ``(valid, words)``)."""

    name: str
    call: Callable[..., Any]
    pools: dict[str, list[Val]]
    check: Callable[[Any], bool] = lambda r: True
    extra: Callable[..., tuple[bool, tuple[str, ...]]] | None = None
    examples: int = 12
    finite: bool = True
    owner_module: str = ""
    notes: str = ""
    seen: Counter = field(default_factory=Counter)


def _m(n):
    return model(n)


def fits(seq_len, n_repeats, n_ctx=N_CTX, prepend=1):
    """Whether ``n_repeats`` copies of ``seq_len`` (+ the start token) fit in ``n_ctx``."""
    try:
        ok = seq_len * n_repeats + prepend <= n_ctx
    except TypeError:
        return True, ()
    return ok, ("seq_len", "n_ctx", "n_repeats")


def row_len(tokens) -> int:
    t = torch.as_tensor(np.asarray(tokens, dtype=np.int64)) if not isinstance(tokens, torch.Tensor) else tokens
    return t.shape[-1]


def targets() -> list[Target]:
    m2 = model(2)
    tok = tokenizer
    L = {"layer": layers(m2)}  # for the 2-layer model
    Ln = {"layer": ints("layer", 0, None, extra_invalid=(-1, 3))}  # for the model drawn (see classify)
    T: list[Target] = []
    add = T.append

    # -- model.py
    add(Target("model.forward", lambda n, tokens: _m(n)(tokens), {"n": models(0), "tokens": token_rows()},
               check=lambda r: r.shape[-1] == D_VOCAB and r.ndim == 3))
    add(Target("model.forward(ablate)", lambda heads: m2(torch.ones(1, 4, dtype=torch.long), ablate=_ablate_dict(heads)),
               {"heads": head_pairs(empty_ok=True)}, check=shape(1, 4, D_VOCAB)))
    add(Target("model.check_head", lambda layer, head: m2.check_head(layer, head), {**L, "head": heads_of_layer()}))
    add(Target("model.check_tokens", lambda tokens: m2.check_tokens(tokens), {"tokens": token_rows()},
               check=lambda r: r.dtype == torch.long and r.ndim == 2))
    add(Target("model.run_with_cache", lambda n, tokens: _m(n).run_with_cache(tokens)[0], {"n": models(0), "tokens": token_rows()},
               check=lambda r: r.ndim == 3))

    # -- data.py token functions
    add(Target("data.encode", lambda text: data.encode(tok(), text), {"text": texts()}, check=lambda r: isinstance(r, list)))
    add(Target("data.decode", lambda ids: data.decode(tok(), ids), {"ids": token_stream(2048, name="ids", empty_ok=True)},
               check=lambda r: isinstance(r, str)))
    add(Target("data.token_str", lambda token_id: data.token_str(tok(), token_id),
               {"token_id": ints("token", 0, 2047, extra_invalid=(-1, None))}, check=lambda r: isinstance(r, str)))
    add(Target("data.token_strs", lambda ids: data.token_strs(tok(), ids), {"ids": token_stream(2048, name="ids", empty_ok=True)},
               check=lambda r: isinstance(r, list)))
    add(Target("data.token_id", lambda s: data.token_id(tok(), s), {"s": token_strings(ids_ok=False, name="s")},
               check=lambda r: isinstance(r, int) and 0 <= r < 2048))
    add(Target("data.tokenize_documents", lambda text: data.tokenize_documents(tok(), [("a.txt", "x = 1"), ("b.txt", text)]),
               {"text": texts()}, check=lambda r: r.dtype == np.uint16 and r.ndim == 1))
    add(Target("data.repeated_random_tokens",
               lambda batch_size, seq_len, n_repeats: data.repeated_random_tokens(batch_size, seq_len, n_repeats, D_VOCAB, 0, n_ctx=N_CTX),
               {"batch_size": sizes("batch_size", 1), "seq_len": sizes("seq_len", 1), "n_repeats": sizes("n_repeats", 1)},
               extra=lambda batch_size, seq_len, n_repeats: fits(seq_len, n_repeats),
               check=lambda r: r.ndim == 2 and r.dtype == torch.long))
    add(Target("data.random_windows",
               lambda tokens, batch_size, n_ctx: data.random_windows(tokens, batch_size, n_ctx, torch.Generator().manual_seed(0)),
               {"tokens": token_stream(model_free=True, empty_ok=True), "batch_size": sizes("batch_size", 1), "n_ctx": sizes("n_ctx", 1)},
               extra=lambda tokens, batch_size, n_ctx: (row_len(tokens) >= n_ctx, ("n_ctx", "token")),
               check=lambda r: r.ndim == 2))
    add(Target("data.repeated_windows",
               lambda batch_size, min_len: data.repeated_windows(np.arange(1, 40, dtype=np.uint16), batch_size, 16,
                                                                  torch.Generator().manual_seed(0), min_len=min_len),
               {"batch_size": sizes("batch_size", 1), "min_len": sizes("min_len", 1, 8)},
               check=lambda r: tuple(r.shape[1:]) == (16,)))

    # -- scores.py
    def rep_fit(seq_len=None, n_repeats=2, **_):
        if seq_len is None:
            return True, ()
        return fits(seq_len, n_repeats)

    add(Target("losses.repeated_tokens",
               lambda seq_len, n_repeats, batch_size: losses.repeated_tokens(m2, seq_len, n_repeats, batch_size),
               {"seq_len": sizes("seq_len", 1, include_none=True), "n_repeats": sizes("n_repeats", 1), "batch_size": sizes("batch_size", 1)},
               extra=rep_fit, check=lambda r: r.ndim == 2))
    add(Target("validate.heads", lambda heads: validate.heads(m2, heads), {"heads": head_pairs()},
               check=lambda r: all(isinstance(a, int) and isinstance(b, int) for a, b in r)))
    add(Target("scores.previous_token_scores", lambda n, tokens: S.previous_token_scores(_m(n), tokens),
               {"n": models(1), "tokens": token_rows(min_len=2)}, check=lambda r: r.shape[1] == N_HEADS))
    add(Target("scores.prefix_matching_mask", lambda seq_len, n_repeats: S.prefix_matching_mask(seq_len, n_repeats),
               {"seq_len": sizes("seq_len", 1), "n_repeats": sizes("n_repeats", 1)}, check=lambda r: r.ndim == 2))
    add(Target("scores.prefix_match_targets", lambda tokens: S.prefix_match_targets(tokens), {"tokens": token_rows(model_free=True)},
               check=lambda r: r.ndim == 3))
    add(Target("scores.prefix_matching_scores",
               lambda n, seq_len, n_repeats, batch_size: S.prefix_matching_scores(_m(n), seq_len, n_repeats, batch_size),
               {"n": models(1), "seq_len": sizes("seq_len", 1), "n_repeats": sizes("n_repeats", 2), "batch_size": sizes("batch_size", 1)},
               extra=rep_fit, check=lambda r: r.shape[1] == N_HEADS))
    add(Target("scores.prefix_matching_scores(tokens=)",
               lambda tokens: S.prefix_matching_scores(m2, 3, 2, tokens=tokens),
               {"tokens": [Val(losses.repeated_tokens(m2, 3, 2, 2), True, "tokens=repeated 3x2"),
                           Val(losses.repeated_tokens(m2, 3, 2, 2).numpy().astype(np.uint16), True, "tokens=uint16 repeated 3x2"),
                           Val(torch.ones(2, 4, dtype=torch.long), False, "tokens=[2, 4] (not 1 + 2 x 3)", ("token", "seq_len")),
                           Val(torch.ones(2, 9, dtype=torch.long), False, "tokens=[2, 9] (not 1 + 2 x 3)", ("token", "seq_len")),
                           Val(torch.full((2, 7), -1), False, "tokens=-1", ("token",))]},
               check=shape(N_LAYERS, N_HEADS)))
    add(Target("scores.copying_scores", lambda n, seq_len, batch_size: S.copying_scores(_m(n), seq_len, batch_size),
               {"n": models(1), "seq_len": sizes("seq_len", 1, 15), "batch_size": sizes("batch_size", 1)},
               check=lambda r: r.shape[1] == N_HEADS))
    add(Target("scores.head_scores", lambda n, tokens, seq_len, n_repeats: S.head_scores(_m(n), tokens, seq_len, n_repeats),
               {"n": models(1), "tokens": token_rows(min_len=2), "seq_len": sizes("seq_len", 1), "n_repeats": sizes("n_repeats", 2)},
               extra=lambda seq_len, n_repeats, **_: fits(seq_len, n_repeats), examples=10))
    add(Target("losses.repeated_token_loss", lambda seq_len, batch_size: losses.repeated_token_loss(m2, seq_len, batch_size),
               {"seq_len": sizes("seq_len", 2, include_none=True), "batch_size": sizes("batch_size", 1)},
               extra=lambda seq_len, **_: rep_fit(seq_len), check=lambda r: r.first > 0))
    add(Target("losses.repeated_loss_curve",
               lambda seq_len, n_repeats, batch_size: losses.repeated_loss_curve(m2, seq_len, n_repeats, batch_size),
               {"seq_len": sizes("seq_len", 2, include_none=True), "n_repeats": sizes("n_repeats", 1), "batch_size": sizes("batch_size", 1)},
               extra=rep_fit, check=lambda r: len(r.copy_means()) == r.n_repeats))
    add(Target("losses.per_token_loss", lambda n, tokens: losses.per_token_loss(_m(n), tokens),
               {"n": models(0), "tokens": token_rows(min_len=2)}, check=lambda r: r.ndim == 2))
    add(Target("losses.per_position_loss", lambda tokens: losses.per_position_loss(m2, tokens), {"tokens": token_rows(min_len=2)},
               check=lambda r: r.ndim == 1))
    add(Target("losses.loss_at_positions", lambda tokens, positions: losses.loss_at_positions(m2, tokens, positions),
               {"tokens": token_rows(min_len=2), "positions": [Val([1], True, "positions=[1]"), Val((1, 1), True, "positions=(1, 1)"),
                                                                 Val([0], False, "positions=[0]", ("position",)),
                                                                 Val([99], False, "positions=[99]", ("position",)),
                                                                 Val([1.5], False, "positions=[1.5]", ("position",)),
                                                                 Val([], False, "positions=[]", ("position",)),
                                                                 Val(None, False, "positions=None", ("position",))]},
               check=lambda r: r.ndim == 1))
    add(Target("losses.in_context_learning_score", lambda tokens, late, early: losses.in_context_learning_score(m2, tokens, late, early),
               {"tokens": [Val(torch.randint(1, D_VOCAB, (3, N_CTX)), True, "tokens=long[3, n_ctx]"),
                           Val(np.random.default_rng(0).integers(1, D_VOCAB, (3, N_CTX)).astype(np.uint16), True, "tokens=uint16[3, n_ctx]"),
                           Val(torch.randint(1, D_VOCAB, (3, N_CTX)).tolist(), True, "tokens=list[3, n_ctx]"),
                           Val(torch.ones(3, 2, dtype=torch.long), True, "tokens=[3, 2]"),
                           Val(torch.full((3, N_CTX), D_VOCAB), False, "tokens=d_vocab", ("token",)),
                           Val(None, False, "tokens=None", ("token",))],
                "late": ints("late", 1, 15, include_none=True), "early": ints("early", 1, 15, include_none=True)},
               extra=lambda tokens, late, early: (all(int(d if p is None else p) < row_len(tokens) for p, d in ((late, 15), (early, 2))),
                                                  ("late", "early", "position")),
               check=lambda r: isinstance(r, float)))
    add(Target("losses.icl_positions", lambda n_ctx, late, early: losses.icl_positions(n_ctx, late, early),
               {"n_ctx": sizes("n_ctx", 2), "late": ints("late", 1, 511), "early": ints("early", 1, 511)}))
    add(Target("losses.zero_ablation", lambda heads: losses.zero_ablation(m2, heads), {"heads": head_pairs()}))
    add(Target("losses.pattern_preserving_ablation", lambda tokens, heads: losses.pattern_preserving_ablation(m2, tokens, heads),
               {"tokens": token_rows(), "heads": head_pairs()}))
    add(Target("losses.ablated_loss", lambda tokens, heads, mode: losses.ablated_loss(m2, tokens, heads, mode),
               {"tokens": token_rows(min_len=2), "heads": head_pairs(),
                "mode": [Val("zero", True, "mode=zero"), Val("pattern", True, "mode=pattern"), Val("mean", False, "mode=mean", ("mode", "zero")),
                         Val(None, False, "mode=None", ("mode", "zero"))]},
               check=lambda r: isinstance(r, float)))
    add(Target("losses.ablation_effects", lambda tokens, heads: losses.ablation_effects(m2, tokens, "zero", None, heads),
               {"tokens": token_rows(min_len=2), "heads": head_pairs(empty_ok=True) + [Val(None, True, "heads=None")]},
               check=shape(N_LAYERS, N_HEADS), finite=False))
    add(Target("scores.value_weighted_pattern", lambda layer, head: S.value_weighted_pattern(m2, _cache2(), layer, head),
               {**L, "head": heads_of_layer()}, check=lambda r: r.ndim == 3))
    add(Target("scores.repeated_spans", lambda tokens, min_len, min_gap: S.repeated_spans(tokens, min_len, min_gap),
               {"tokens": token_stream(model_free=True, empty_ok=True), "min_len": sizes("min_len", 1), "min_gap": sizes("min_gap", 1)},
               check=lambda r: isinstance(r, list)))
    add(Target("HeadScores.best", lambda score, layer: _head_scores().best(score, layer),
               {"score": [Val("copying", True, "score=copying"), Val("previous_token", True, "score=previous_token"),
                          Val("nope", False, "score=nope", ("score",)), Val(None, False, "score=None", ("score",))],
                "layer": layers(m2) + [Val(None, True, "layer=None")]},
               check=lambda r: all(isinstance(x, int) for x in r)))
    # -- smeared.py
    add(Target("smeared.forward", lambda tokens: smeared()(tokens), {"tokens": token_rows()}, check=lambda r: r.ndim == 3))
    add(Target("smeared.varied_repeats", lambda batch_size, n_ctx, min_len: varied_repeats(batch_size, n_ctx, D_VOCAB, torch.Generator().manual_seed(0), min_len),
               {"batch_size": sizes("batch_size", 1), "n_ctx": sizes("n_ctx", 4), "min_len": sizes("min_len", 1)},
               extra=lambda batch_size, n_ctx, min_len: (min_len < n_ctx // 2, ("min_len", "n_ctx")),
               check=lambda r: r.ndim == 2))
    add(Target("smeared.train_on_repeated_tokens", lambda steps, batch_size: train_on_repeated_tokens(_fresh_smeared(), steps, batch_size),
               {"steps": sizes("steps", 1), "batch_size": sizes("batch_size", 1)}, check=lambda r: len(r) >= 1, examples=3))

    # -- circuits/bigrams.py
    add(Target("bigrams.count_bigrams", lambda tokens: bigrams.count_bigrams(tokens, D_VOCAB), {"tokens": token_stream(empty_ok=True)},
               check=shape(D_VOCAB, D_VOCAB)))
    add(Target("bigrams.bigram_count_table", lambda prev: bigrams.bigram_count_table(prev, prev, [1] * _len(prev), D_VOCAB),
               {"prev": token_stream(name="prev", empty_ok=True)}, check=shape(D_VOCAB, D_VOCAB)))
    add(Target("bigrams.resolve_token", lambda token: bigrams.resolve_token(tok(), token, 2048), {"token": token_strings()},
               check=lambda r: isinstance(r, int)))
    add(Target("bigrams.top_next_tokens", lambda token, k: bigrams.top_next_tokens(_logp(), token, k),
               {"token": ints("token", 0, D_VOCAB - 1, extra_invalid=(-1, None)), "k": sizes("k", 1, D_VOCAB)}))
    add(Target("bigrams.topk_agreement", lambda k: bigrams.topk_agreement(_logp(), counts(), k), {"k": sizes("k", 1, D_VOCAB)},
               check=shape(D_VOCAB)))

    # -- circuits/factored.py
    for fn in (factored.full_ov_circuit, factored.full_qk_circuit, factored.positional_qk_circuit, factored.qk_circuit_parts):
        add(Target(f"factored.{fn.__name__}", lambda n, layer, head, fn=fn: fn(_m(n), layer, head),
                   {"n": models(1), **Ln, "head": heads_of_layer(include_none=True)}))
    add(Target("factored.positional_attention", lambda n, layer, n_pos: factored.positional_attention(_m(n), layer, n_pos),
               {"n": models(1), **Ln, "n_pos": sizes("n_pos", 1, N_CTX, include_none=True)}, check=lambda r: r.ndim == 3))
    add(Target("factored.positional_heads", lambda layer, window, n_pos: factored.positional_heads(m2, layer, 0.5, window, n_pos),
               {**L, "window": sizes("window", 1), "n_pos": sizes("n_pos", 1, N_CTX, include_none=True)}))
    add(Target("QKParts.score", lambda q_token, q_pos: factored.qk_circuit_parts(m2, 0, 0).score(q_token, q_pos, 1, 0),
               {"q_token": ints("token", 0, D_VOCAB - 1, extra_invalid=(-1,)), "q_pos": ints("pos", 0, N_CTX - 1, extra_invalid=(-1,))}))

    # -- circuits/paths.py
    for fn in (paths.attention_patterns_from_weights, paths.path_expansion, paths.path_expansion_error):
        add(Target(f"paths.{fn.__name__}", lambda n, tokens, fn=fn: fn(_m(n), tokens), {"n": models(1), "tokens": token_rows()}))

    # -- circuits/skip_trigrams.py
    add(Target("skip_trigrams.resolve_tokens", lambda tokens: skip_trigrams.resolve_tokens(tok(), tokens, 2048),
               {"tokens": [Val(["·self", 5, np.uint16(9)], True, "tokens=['·self', 5, uint16]"), Val(("a",), True, "tokens=('a',)"),
                           Val(torch.tensor([1, 2]), True, "tokens=tensor[1, 2]"),
                           Val(["antidisestablishmentarianism"], False, "tokens=[long word]", ("token",)),
                           Val(["\ud800"], False, "tokens=[surrogate]", ("token", "surrogate")),
                           Val([2.5], False, "tokens=[2.5]", ("token",)), Val([None], False, "tokens=[None]", ("token",)),
                           Val([2048], False, "tokens=[2048]", ("token",)), Val([], False, "tokens=[]", ("token",)),
                           Val("self", False, "tokens='self' (not a list)", ("token",)), Val(None, False, "tokens=None", ("token",))]},
               check=lambda r: r.ndim == 1 and r.dtype == torch.long))
    add(Target("pretrained.frequent_tokens", lambda n: pretrained.frequent_tokens(tok(), n), {"n": sizes("n", 1)},
               check=lambda r: r.ndim == 1 and len(r) >= 1))
    add(Target("skip_trigrams.top_skip_trigrams", lambda n, layer, k, heads, tokens: skip_trigrams.top_skip_trigrams(_m(n), layer, k, heads, tokens),
               {"n": models(1), **Ln, "k": sizes("k", 1), "heads": head_lists(include_none=True),
                "tokens": subsets()}))
    add(Target("skip_trigrams.skip_trigram_effects", lambda triples, contexts, gap: skip_trigrams.skip_trigram_effects(m2, triples, contexts, gap=gap),
               {"triples": [Val([[1, 2, 3]], True, "triples=[[1, 2, 3]]"), Val(np.array([[1, 2, 3]], dtype=np.uint16), True, "triples=uint16"),
                            Val([[1, 2]], False, "triples=[[1, 2]]", ("triples",)), Val([[1, 2, D_VOCAB]], False, "triples=d_vocab", ("token",)),
                            Val([[1.5, 2, 3]], False, "triples=float", ("triples", "token")), Val(None, False, "triples=None", ("triples",))],
                "contexts": token_rows(min_len=3, name="contexts"), "gap": ints("gap", 1, None, include_none=True)}))
    add(Target("copying.copying_summary", lambda n, layer, k, tokens: copying.copying_summary(_m(n), layer, k, tokens, n_shuffles=2),
               {"n": models(1), **Ln, "k": sizes("k", 1), "tokens": subsets()}))
    add(Target("skip_trigrams.find_skip_trigram_bugs", lambda layer, k, tokens: skip_trigrams.find_skip_trigram_bugs(m2, layer, counts(), k, 1, 3, tokens),
               {**L, "k": sizes("k", 1), "tokens": subsets()}))
    add(Target("SkipTrigrams.triples", lambda head: skip_trigrams.top_skip_trigrams(m2, 0, 2, [1, 3]).triples(head),
               {"head": [Val(1, True, "head=1"), Val(3, True, "head=3"), Val(np.int64(3), True, "head=np.int64(3)"),
                         Val(0, False, "head=0 (not in table)", ("head",)), Val(1.0, False, "head=1.0", ("head",)),
                         Val(None, False, "head=None", ("head",)), Val(-1, False, "head=-1", ("head",))]}))

    # -- circuits/composition.py
    add(Target("composition.composition_score", lambda n, kind, writer, reader: composition.composition_score(_m(n), kind, writer, reader),
               {"n": models(2), "kind": [Val("q", True, "kind=q"), Val("K", True, "kind=K"), Val("x", False, "kind=x", ("kind",)),
                                          Val(None, False, "kind=None", ("kind",))],
                "writer": _pair_pool("writer", 0), "reader": _pair_pool("reader", 1)}))
    add(Target("composition.composition_scores", lambda n, writer_layer, reader_layer, n_baseline: composition.composition_scores(_m(n), writer_layer, reader_layer, n_baseline),
               {"n": models(2), "writer_layer": ints("writer_layer", 0, None), "reader_layer": ints("reader_layer", 1, None, extra_invalid=(0,)),
                "n_baseline": sizes("n_baseline", 2)},
               extra=lambda n, writer_layer, reader_layer, n_baseline: (int(writer_layer) < int(reader_layer) < n, ("layer",))))
    add(Target("composition.random_composition_baseline", lambda d_model, d_head, n_samples: composition.random_composition_baseline(d_model, d_head, n_samples),
               {"d_model": sizes("d_model", 1), "d_head": sizes("d_head", 1), "n_samples": sizes("n_samples", 2)}))
    add(Target("two_layer_paths.two_layer_path_expansion", lambda n, tokens: two_layer_paths.two_layer_path_expansion(_m(n), tokens),
               {"n": models(exactly=2), "tokens": token_rows()}))
    add(Target("two_layer_paths.virtual_head_pattern", lambda writer, reader: two_layer_paths.virtual_head_pattern(_cache2(), writer, reader),
               {"writer": heads_of_layer("writer"), "reader": heads_of_layer("reader")}, check=lambda r: r.ndim == 3))
    add(Target("composition.virtual_ov_circuit", lambda n, writer, reader: composition.virtual_ov_circuit(_m(n), writer, reader),
               {"n": models(exactly=2), "writer": heads_of_layer("writer"), "reader": heads_of_layer("reader")}))
    add(Target("two_layer_paths.term_importance", lambda n, tokens, batch_size: two_layer_paths.term_importance(_m(n), tokens, batch_size),
               {"n": models(exactly=2), "tokens": token_rows(min_len=2), "batch_size": sizes("batch_size", 1)}))
    add(Target("TermImportance.gain_layer", lambda layer: _term_importance().gain_layer(layer), {**L}))
    # -- circuits/induction.py
    add(Target("induction.writer_ov", lambda n, writers, layer: induction.writer_ov(_m(n), writers, layer),
               {"n": models(1), "writers": head_lists("writers", include_none=True), **Ln}))
    add(Target("induction.k_composition_circuit", lambda n, head, writers, layer: induction.k_composition_circuit(_m(n), layer, head, writers),
               {"n": models(2), "head": heads_of_layer(include_none=True), "writers": head_lists("writers", include_none=True),
                "layer": ints("layer", 1, None, extra_invalid=(-1,))}))
    add(Target("induction.induction_eigen_positivity", lambda n, layer, writers: induction.induction_eigen_positivity(_m(n), layer, writers),
               {"n": models(2), "layer": ints("layer", 1, None, extra_invalid=(-1,)), "writers": head_lists("writers", include_none=True)}))

    # -- widgets.py (the explorers that take tokens or layers)
    from attncircuits.show.widgets import head_explorer, snapshot_explorer

    add(Target("widgets.snapshot_explorer", lambda tokens, layer: (_explore(snapshot_explorer(checkpoint(), tokens, layer)), tokens),
               {"tokens": token_rows(d_vocab=2048), "layer": layers(m2)}, examples=4,
               check=lambda r: r[0] == row_len(r[1])))
    add(Target("widgets.head_explorer", lambda tokens, layers: _explore(head_explorer(m2, tok(), tokens, layers, k=3)),
               {"tokens": [Val(["!", 5], True, "tokens=['!', 5]"), Val([7, 9], True, "tokens=[7, 9]"),
                           Val(["·self"], False, "tokens=['·self'] (id >= 50)", ("token",)), Val([50], False, "tokens=[50]", ("token",)),
                           Val([], False, "tokens=[]", ("token",)), Val([0.5], False, "tokens=[0.5]", ("token",))],
                "layers": [Val([0, 1], True, "layers=[0, 1]"), Val(None, True, "layers=None"), Val([2], False, "layers=[2]", ("layer",)),
                           Val([0.5], False, "layers=[0.5]", ("layer",)), Val([-1], False, "layers=[-1]", ("layer",)),
                           Val(["0"], False, "layers=['0']", ("layer",))]}, examples=4, check=lambda r: r >= 2))
    add(Target("widgets.snapshot_steps_control", lambda steps: snapshot_steps_control(steps), {"steps": snapshot_steps()},
               check=lambda r: isinstance(r, (range, list)) and len(r) >= 1))

    # -- edits of a forward pass, the positions a loss averages, the phase change
    tokens24 = torch.ones(2, 4, dtype=torch.long)
    add(Target("model.forward(ablate=value)", lambda value: m2(tokens24, ablate={(0, 1): value}), {"value": ablate_values()},
               check=shape(2, 4, D_VOCAB)))
    add(Target("model.forward(patterns=)", lambda pattern: m2(tokens24, patterns={(1, 0): pattern}), {"pattern": pattern_values()},
               check=shape(2, 4, D_VOCAB)))
    add(Target("losses.ablation_effects(targets=)",
               lambda targets: losses.ablation_effects(m2, torch.ones(2, 6, dtype=torch.long), "zero", targets, [(0, 1)]),
               {"targets": target_positions(5)}, check=lambda r: bool(torch.isfinite(r[0, 1])), finite=False))
    add(Target("scores.phase_change_step", lambda layer, frac: S.phase_change_step(_history(), layer=layer, frac=frac),
               {"layer": ints("layer", 0, 1, extra_invalid=(5, -1)), "frac": fractions()}, check=lambda r: isinstance(r, int)))

    # -- configs, checkpoints, TransformerLens: the arguments a user types
    add(Target("model.ModelConfig", lambda d_model, n_ctx, init_std_embed: ModelConfig(d_model=d_model, n_heads=1, n_ctx=n_ctx, init_std_embed=init_std_embed),
               {"d_model": sizes("d_model", 1), "n_ctx": sizes("n_ctx", 1), "init_std_embed": std_values()},
               check=lambda r: isinstance(r.d_model, int) and isinstance(r.init_std_embed, float)))
    add(Target("pretrained.load_pretrained", lambda name, device: load_pretrained(name, device),
               {"name": [Val("attn-only-0l", True, "name='attn-only-0l'"), Val("gpt2", False, "name='gpt2'", ("model",)),
                         Val(4, False, "name=4", ("model",)), Val(None, False, "name=None", ("model",))],
                "device": devices()}, examples=4, check=lambda r: r.model.cfg.n_layers == 0))
    add(Target("pretrained.load_checkpoint", lambda directory, device: load_checkpoint(directory, device),
               {"directory": [Val(checkpoint().directory, True, "directory=Path"), Val(str(checkpoint().directory), True, "directory=str"),
                              Val(4, False, "directory=4", ("directory",)), Val(None, False, "directory=None", ("directory",)),
                              Val("x" * 300, False, "directory='x' * 300", ("directory",)),
                              Val("/nonexistent/ck", False, "directory=missing", ("directory",))],
                "device": devices()}, examples=6, check=lambda r: r.model.cfg.n_layers == 2))
    add(Target("data.load_corpus", lambda paths: data.load_corpus(paths), {"paths": corpus_paths()}, examples=6,
               check=lambda r: len(r.train) >= 1))
    add(Target("data.load_tokenizer", lambda path: data.load_tokenizer(path),
               {"path": [Val(_tokenizer_path(), True, "path=Path"), Val(str(_tokenizer_path()), True, "path=str"),
                         Val(4, False, "path=4", ("tokenizer",)), Val(None, False, "path=None", ("tokenizer",)),
                         Val("x" * 300, False, "path='x' * 300", ("tokenizer",)),
                         Val("/nonexistent/tokenizer.json", False, "path=missing", ("tokenizer",))]},
               examples=4, check=lambda r: r.get_vocab_size() == 2048))
    add(Target("interop.to_transformer_lens", lambda model: interop.to_transformer_lens(model),
               {"model": [Val(model(1), True, "model=ours"), Val(None, False, "model=None", ("model",)),
                          Val(Lazy(_tl_model), False, "model=TransformerBridge", ("model",)), Val(4, False, "model=4", ("model",))]},
               examples=4, check=lambda r: r.cfg.n_layers == 1))
    add(Target("interop.from_transformer_lens", lambda tl_model: interop.from_transformer_lens(tl_model),
               {"tl_model": [Val(Lazy(_tl_model), True, "tl_model=TransformerBridge"), Val(None, False, "tl_model=None", ("tl_model",)),
                             Val(model(2), False, "tl_model=ours", ("tl_model",)), Val("gpt2", False, "tl_model='gpt2'", ("tl_model",))]},
               examples=4, check=lambda r: r.cfg.n_layers == 1))
    return T


# pools of the arguments above
def snapshot_steps() -> list[Val]:
    w = ("step", "snapshot")
    return [Val([0, 10, 20], True, "steps=[0, 10, 20]"), Val([0, 5, 20], True, "steps=[0, 5, 20]"),
            Val((np.int64(3),), True, "steps=(np.int64(3),)"), Val([], False, "steps=[]", w), Val(["a"], False, "steps=['a']", w),
            Val([1.5], False, "steps=[1.5]", w), Val([-1], False, "steps=[-1]", w), Val(None, False, "steps=None", w),
            Val("abc", False, "steps='abc'", w)]


def ablate_values() -> list[Val]:
    w = ("ablate",)
    return [Val(0.0, True, "value=0.0"), Val(1, True, "value=1"), Val(np.float32(0.5), True, "value=np.float32(0.5)"),
            Val(torch.zeros(2, 4, 32), True, "value=zeros[2, 4, d_model]"), Val(torch.zeros(32), True, "value=zeros[d_model]"),
            Val(lambda out: 0 * out, True, "value=lambda out: 0 * out"), Val(float("nan"), False, "value=nan", w),
            Val("0", False, "value='0'", w), Val(None, False, "value=None", w), Val(torch.zeros(5), False, "value=zeros[5]", w),
            Val(True, False, "value=True", w), Val(Lazy(lambda: torch.zeros(2, 4, 32, device="meta")), False, "value=meta", w)]


def pattern_values() -> list[Val]:
    w = ("pattern",)
    causal = torch.tril(torch.ones(4, 4))
    return [Val(torch.eye(4), True, "pattern=eye(4)"), Val(torch.eye(N_CTX), True, "pattern=eye(n_ctx)"),
            Val(causal / causal.sum(-1, keepdim=True), True, "pattern=uniform causal[4, 4]"),
            Val(torch.eye(4).expand(2, 4, 4), True, "pattern=eye[2, 4, 4]"),
            Val(-torch.ones(20, 20), False, "pattern=-ones(20, 20)", w), Val(torch.ones(4, 4), False, "pattern=ones(4, 4)", w),
            Val(torch.eye(3), False, "pattern=eye(3)", w), Val(torch.full((4, 4), float("nan")), False, "pattern=nan", w),
            Val("x", False, "pattern='x'", w), Val(None, False, "pattern=None", w),
            Val(torch.eye(4).bool(), False, "pattern=bool eye(4)", w), Val(torch.eye(4).expand(3, 4, 4), False, "pattern=eye[3, 4, 4]", w),
            Val(Lazy(lambda: torch.eye(4, device="meta")), False, "pattern=meta", w)]


def target_positions(n: int) -> list[Val]:
    w = ("target",)
    return [Val(None, True, "targets=None"), Val([0], True, "targets=[0]"), Val((1, n - 1), True, f"targets=(1, {n - 1})"),
            Val(slice(1, None), True, "targets=slice(1, None)"), Val(range(2), True, "targets=range(2)"),
            Val(np.array([2]), True, "targets=np.array([2])"), Val([500], False, "targets=[500]", w),
            Val([-1], False, "targets=[-1]", w), Val([0.5], False, "targets=[0.5]", w), Val([], False, "targets=[]", w),
            Val("0", False, "targets='0'", w), Val(3, False, "targets=3", w), Val(slice(10, 20), False, "targets=slice(10, 20)", w)]


def fractions() -> list[Val]:
    w = ("frac",)
    return [Val(0.5, True, "frac=0.5"), Val(0.25, True, "frac=0.25"), Val(np.float64(0.5), True, "frac=np.float64(0.5)"),
            Val(0, False, "frac=0", w), Val(1.0, False, "frac=1.0", w), Val(float("nan"), False, "frac=nan", w),
            Val("0.5", False, "frac='0.5'", w), Val(None, False, "frac=None", w)]


def std_values() -> list[Val]:
    w = ("init_std_embed",)
    return [Val(1.0, True, "init_std_embed=1.0"), Val(0.02, True, "init_std_embed=0.02"), Val(1, True, "init_std_embed=1"),
            Val(float("nan"), False, "init_std_embed=nan", w), Val(0.0, False, "init_std_embed=0.0", w),
            Val(-1.0, False, "init_std_embed=-1.0", w), Val("1", False, "init_std_embed='1'", w),
            Val(None, False, "init_std_embed=None", w), Val(float("inf"), False, "init_std_embed=inf", w)]


def devices() -> list[Val]:
    w = ("device",)
    return [Val("cpu", True, "device='cpu'"), Val(torch.device("cpu"), True, "device=torch.device('cpu')"),
            Val("bogus", False, "device='bogus'", w), Val("cuda:7", False, "device='cuda:7'", w), Val(5.5, False, "device=5.5", w),
            Val(None, False, "device=None", w)]


@cache
def _history() -> dict:
    """A two-layer history whose best head's score rises in both layers."""
    rise = [0.0, 0.1, 0.2, 0.6, 0.9, 0.95]
    return {"step": [0, 10, 20, 30, 40, 50], "prefix_matching": [[[r, r / 2], [r, 0.1]] for r in rise]}


def corpus_paths() -> list[Val]:
    w = ("corpus",)
    return [Val(_text_file(), True, "paths=Path"), Val(str(_text_file()), True, "paths=str"), Val([_text_file()], True, "paths=[Path]"),
            Val(4, False, "paths=4", w), Val([4], False, "paths=[4]", w), Val(b"a.txt", False, "paths=b'a.txt'", w),
            Val("x" * 300, False, "paths='x' * 300", w), Val("/nonexistent.txt", False, "paths=missing", w),
            Val([], False, "paths=[]", w)]


@cache
def _text_file() -> Path:
    p = Path(tempfile.mkdtemp(prefix="fuzz-text-")) / "a.txt"
    p.write_text("def f(x):\n    return x\n" * 20)
    return p


def _tokenizer_path() -> Path:
    from attncircuits.checkpoints.pretrained import CORPUS_DIR

    return CORPUS_DIR / "tokenizer.json"


@cache
def _tl_model():
    return interop.to_transformer_lens(model(1))


# small helpers used by the targets
def _ablate_dict(heads):
    if isinstance(heads, tuple) and len(heads) == 2 and not isinstance(heads[0], (tuple, list)):
        heads = [heads]
    if isinstance(heads, str):
        return {heads: 0.0}
    return {tuple(h) if isinstance(h, list) else h: 0.0 for h in heads}


def _len(x):
    try:
        return len(x)
    except TypeError:
        return 1


@cache
def _cache2():
    return model(2).run_with_cache(torch.randint(0, D_VOCAB, (2, 6), generator=torch.Generator().manual_seed(2)))[1]


@cache
def _head_scores():
    g = torch.Generator().manual_seed(3)
    return S.HeadScores(previous_token=torch.rand(2, 4, generator=g), prefix_matching=torch.rand(2, 4, generator=g), copying=torch.rand(2, 4, generator=g))


@cache
def _term_importance():
    return two_layer_paths.term_importance(model(2), torch.randint(0, D_VOCAB, (2, 8), generator=torch.Generator().manual_seed(4)))


@cache
def _logp():
    return bigrams.bigram_log_probs(model(0))


def _fresh_smeared():
    torch.manual_seed(0)
    return SmearedKeyTransformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=D_VOCAB, n_ctx=N_CTX))


def _pair_pool(name, layer):
    w = ("head", "layer", name)
    return [Val((layer, 1), True, f"{name}=({layer}, 1)"), Val((layer, np.int64(3)), True, f"{name}=({layer}, np.int64(3))"),
            Val((layer, 0.5), False, f"{name}=({layer}, 0.5)", w), Val((layer, -1), False, f"{name}=({layer}, -1)", w),
            Val((layer, None), False, f"{name}=({layer}, None)", w), Val((1 - layer, 0), False, f"{name}=({1 - layer}, 0)", w),
            Val((layer, 4), False, f"{name}=({layer}, 4)", w), Val(3, False, f"{name}=3", w)]


def _explore(ex) -> int:
    """The number of patterns or panels the explorer's first figure drew."""
    import matplotlib.pyplot as plt

    fig = ex.render()
    n = max((im.get_array().shape[0] for a in fig.axes for im in a.images), default=0)
    plt.close("all")
    return n


# ---- classification ---------------------------------------------------------------------------
def _ours(err: BaseException) -> bool:
    tb = traceback.extract_tb(err.__traceback__)
    return bool(tb) and Path(tb[-1].filename).resolve().is_relative_to(PACKAGE_DIR)


def classify(target: Target, vals: dict[str, Val]) -> tuple[str, str]:
    """Call the target with the values and return ``(outcome, detail)``."""
    valid = all(v.valid for v in vals.values())
    words = tuple(w for v in vals.values() if not v.valid for w in v.words)
    if "n" in vals and "layer" in vals and vals["layer"].valid:  # the layer must exist in the model drawn
        layer = vals["layer"].value
        if layer is not None and int(layer) >= vals["n"].value:
            valid, words = False, words + ("layer",)
    if target.extra is not None:  # also for invalid values: the function may refuse either
        try:
            ok, extra_words = target.extra(**{k: v.value for k, v in vals.items()})
        except Exception:  # noqa: BLE001 (values the extra check cannot read are refused per argument)
            ok, extra_words = True, ()
        valid, words = valid and ok, words + (() if ok else extra_words)
    try:
        result = target.call(**{k: v.value for k, v in vals.items()})
    except Exception as err:  # noqa: BLE001 (classifying every exception is the point)
        msg = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
        if not (isinstance(err, OUR_ERRORS) and _ours(err)):
            return "deep", msg
        if valid:
            return "refused", msg
        if not any(w.lower() in str(err).lower() for w in words):
            return "deep", "message names no bad input: " + msg
        return "clear", msg
    if not valid:
        return "silent", "accepted invalid input"
    if target.finite and not finite(result):
        return "silent", "NaN or inf in the result"
    try:
        ok = target.check(result)
    except Exception as err:  # noqa: BLE001
        ok = False
        return "silent", f"result check failed: {type(err).__name__}: {err}"[:200]
    return ("correct", "") if ok else ("silent", "result of the wrong shape or type")


def run(target: Target, n_examples: int, derandomize: bool = True, seed: int = 0) -> list[tuple[str, str, str]]:
    """Draw ``n_examples`` calls of ``target`` with hypothesis; return ``(outcome, call, detail)`` each."""
    names = list(target.pools)
    strategy = st.fixed_dictionaries({k: st.sampled_from(target.pools[k]) for k in names})
    out = []

    @settings(max_examples=n_examples, deadline=None, derandomize=derandomize, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(vals):
        outcome, detail = classify(target, vals)
        call = f"{target.name}(" + ", ".join(repr(vals[k]) for k in names) + ")"
        out.append((outcome, call, detail))

    if not derandomize:
        one = hseed(seed)(one)
    threads, static = torch.get_num_threads(), os.environ.get("ATTNCIRCUITS_STATIC")
    torch.set_num_threads(1)  # tiny tensors: one thread is ten times faster on a busy machine
    os.environ["ATTNCIRCUITS_STATIC"] = "1"  # explorers draw their static figure only
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # explorers print their figure outside IPython
            one()
    finally:
        torch.set_num_threads(threads)
        if static is None:
            os.environ.pop("ATTNCIRCUITS_STATIC")
        else:
            os.environ["ATTNCIRCUITS_STATIC"] = static
    return out


def totals(results) -> Counter:
    c = Counter({k: 0 for k in OUTCOMES})
    c.update(r[0] for r in results)
    return c
