"""Loss-based measures: what the model's loss says about its heads (chapters 6 and 7).

Where :mod:`attncircuits.analysis.scores` scores each head by where it attends, this module measures loss:

- per position on random tokens repeated (:func:`repeated_tokens`), first copy vs later copies;
- the in-context-learning score (late-token loss minus early-token loss, Olsson et al. 2022);
- ablations: zero, mean and Olsson's pattern-preserving ablation of chosen heads.

Random repeated tokens are the clean test of in-context learning: nothing but an earlier copy can
predict a token of a later copy, so any loss that falls on the second copy was learned in context.
The chapters import these from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.core import validate
from attncircuits.core.heads import Head
from attncircuits.data import repeated_rows
from attncircuits.models.parts import ActivationCache, loss_fn
from attncircuits.models.transformer import Transformer

__all__ = [
    "AblationMode",
    "RepeatedLoss",
    "RepeatedLossCurve",
    "ablated_loss",
    "ablation_effects",
    "icl_positions",
    "icl_score_from_loss",
    "icl_scores_per_row",
    "in_context_learning_score",
    "loss_at_positions",
    "mean_ablation",
    "pattern_preserving_ablation",
    "per_position_loss",
    "per_token_loss",
    "repeated_loss_curve",
    "repeated_token_loss",
    "repeated_tokens",
    "zero_ablation",
]

LOSS = "a next-token loss (one token to predict from the one before)"
COPY_LOSS = "the loss of a copy (each copy's first token has nothing before it to predict it)"


def repeated_tokens(
    model: Transformer, seq_len: int | None = None, n_repeats: int = 2, batch_size: int = 16, seed: int = 0
) -> Int[Tensor, "batch pos"]:
    """``[EOT] r1..rL r1..rL ...`` for this model's vocabulary; by default the longest L that fits."""
    seq_len, n_repeats, batch_size = validate.repeat_args(model, seq_len, n_repeats, batch_size)
    return repeated_rows(batch_size, seq_len, n_repeats, model.cfg.d_vocab, seed)


# ----------------------------------------------------------------------------------------------
# Losses on repeated tokens and the in-context-learning score
# ----------------------------------------------------------------------------------------------


@dataclass
class RepeatedLoss:
    first: float  # mean loss on the first copy (nothing to copy from)
    second: float  # mean loss on the second copy (an induction head can copy)

    @property
    def ratio(self) -> float:
        return self.second / self.first


@torch.no_grad()
def repeated_token_loss(
    model: Transformer, seq_len: int | None = None, batch_size: int = 16, seed: int = 0
) -> RepeatedLoss:
    """Loss on ``[EOT] r1..rL r1..rL``: first copy (targets r2..rL) vs second copy (targets r2..rL
    again). The first target of each copy is left out: no earlier context predicts it."""
    curve = repeated_loss_curve(model, seq_len, 2, batch_size, seed)
    first, second = curve.copy_means()
    return RepeatedLoss(first, second)


@dataclass
class RepeatedLossCurve:
    """Per-position loss on ``[EOT]`` + ``n_repeats`` copies of ``seq_len`` random tokens."""

    loss: Float[Tensor, "target"]  # loss[t] is the mean loss of predicting token t + 1
    seq_len: int
    n_repeats: int

    @property
    def positions(self) -> Tensor:
        """The position of each target token (1 .. n-1)."""
        return torch.arange(1, len(self.loss) + 1)

    def copy_means(self) -> list[float]:
        """Mean loss per copy, leaving out each copy's first target (nothing predicts it)."""
        L = self.seq_len
        return [self.loss[c * L + 1 : (c + 1) * L].mean().item() for c in range(self.n_repeats)]


@torch.no_grad()
def per_token_loss(
    model: Transformer, tokens: Int[Tensor, "batch pos"], chunk: int = 32, **forward_kwargs
) -> Float[Tensor, "batch target"]:
    """Next-token loss of every row and position; entry ``[b, t]`` predicts token ``t + 1`` of row ``b``.
    Rows run ``chunk`` at a time (the logits of 32 x 128 tokens are 32 MB); ``forward_kwargs``
    (``ablate=``, ``patterns=``) go to the model and must not depend on the batch."""
    tokens = validate.tokens(model, tokens, 2, LOSS)
    return _per_token_loss(model, tokens, validate.count(chunk, "chunk"), **forward_kwargs)


def _per_token_loss(model, tokens: Tensor, chunk: int = 32, **forward_kwargs) -> Tensor:
    return torch.cat([loss_fn(model.forward_checked(rows, **forward_kwargs), rows, per_token=True).cpu() for rows in tokens.split(chunk)])


def per_position_loss(
    model: Transformer, tokens: Int[Tensor, "batch pos"], chunk: int = 32, **forward_kwargs
) -> Float[Tensor, "target"]:
    """Mean next-token loss at each position over the batch; entry ``t`` predicts token ``t + 1``."""
    return per_token_loss(model, tokens, chunk, **forward_kwargs).mean(0)


@torch.no_grad()
def repeated_loss_curve(
    model: Transformer,
    seq_len: int | None = None,
    n_repeats: int = 2,
    batch_size: int = 16,
    seed: int = 0,
    **forward_kwargs,
) -> RepeatedLossCurve:
    """Per-position loss on random tokens repeated ``n_repeats`` times (default: the longest
    ``seq_len`` that fits). An induction head shows as loss falling to near 0 on later copies."""
    seq_len, n_repeats, batch_size = validate.repeat_args(model, seq_len, n_repeats, batch_size, min_len=2, why=COPY_LOSS)
    toks = repeated_rows(batch_size, seq_len, n_repeats, model.cfg.d_vocab, seed).to(next(model.parameters()).device)
    return RepeatedLossCurve(_per_token_loss(model, toks, **forward_kwargs).mean(0), seq_len, n_repeats)


def icl_positions(n_ctx: int, late: int = 500, early: int = 50, ref_ctx: int = 512) -> tuple[int, int]:
    """Olsson et al.'s token 500 vs token 50 of a 512-token context, scaled to ``n_ctx``
    (125 and 12 for our n_ctx=128)."""
    n_ctx = validate.count(n_ctx, "n_ctx", 2, why="an in-context-learning score compares two positions")
    ref_ctx = validate.count(ref_ctx, "ref_ctx", 2)
    late, early = validate.index(late, "late"), validate.index(early, "early")
    for name, p in (("late", late), ("early", early)):
        if not 1 <= p < ref_ctx:
            raise ValueError(f"{name}={p} is outside the reference context of {ref_ctx} tokens: use 1 <= {name} < {ref_ctx}")
    scale = lambda p: min(n_ctx - 1, max(1, round(p * n_ctx / ref_ctx)))  # noqa: E731 (a target in 1..n_ctx-1)
    return scale(late), scale(early)


@torch.no_grad()
def in_context_learning_score(
    model: Transformer,
    tokens: Int[Tensor, "batch pos"],
    late: int | None = None,
    early: int | None = None,
) -> float:
    """Loss at a late position minus loss at an early one (nats; negative = the model uses context).

    Olsson et al. use token 500 minus token 50 in 512-token contexts; by default the positions are
    scaled to this model's context (``icl_positions``: 125 and 12 for n_ctx=128). Losses are means
    over ``tokens``' rows at those target positions.
    """
    tokens = validate.tokens(model, tokens, 2, LOSS)
    late, early = _icl_check(model.cfg.n_ctx, tokens.shape[-1], late, early)
    loss_late, loss_early = _loss_at_positions(model, tokens, torch.tensor([late, early]))
    return (loss_late - loss_early).item()


@torch.no_grad()
def loss_at_positions(
    model: Transformer, tokens: Int[Tensor, "batch pos"], positions: Sequence[int], chunk: int = 64
) -> Float[Tensor, " k"]:
    """Mean loss of predicting the token at each of ``positions`` (1..n-1), over the batch.

    Only those positions are unembedded (``resid[-1] @ W_U``), which is most of a forward pass's
    cost in these models (``d_vocab`` = 16 x ``d_model``): the in-context-learning score over
    thousands of windows then takes seconds."""
    tokens = validate.tokens(model, tokens, 2, LOSS)
    n = tokens.shape[1]
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Iterable):
        raise TypeError(f"positions must be a list of ints in 1..{n - 1}, got {positions!r}")
    pos = [validate.index(p, "position") for p in positions]
    if not pos or min(pos) < 1 or max(pos) >= n:
        raise ValueError(f"positions must lie in 1..{n - 1} (a target needs a token before it), got {pos}")
    return _loss_at_positions(model, tokens, torch.tensor(pos), validate.count(chunk, "chunk"))


def _loss_at_positions(model, tokens: Tensor, pos: Tensor, chunk: int = 64) -> Tensor:
    return loss_rows_at(model, tokens, pos, chunk).sum(0) / tokens.shape[0]


@torch.no_grad()
def loss_rows_at(model, tokens: Tensor, pos: Tensor, chunk: int = 64, **forward_kwargs) -> Tensor:
    """``[batch, k]``: each row's loss of predicting its token at each of ``pos`` (``[k]``, the same
    for every row, or ``[batch, k]``; each in 1..n-1, checked by the caller), entry ``[b, j]`` as
    :func:`per_token_loss`'s ``[b, pos[j] - 1]``. Only those positions are unembedded."""
    pos = torch.as_tensor(pos, dtype=torch.long)
    out = []
    for i, rows in zip(range(0, len(tokens), chunk), tokens.split(chunk)):
        p = pos if pos.ndim == 1 else pos[i:i + len(rows)]
        logp = model.forward_checked(rows, at=p - 1, **forward_kwargs).log_softmax(-1)  # [batch, k, d_vocab]
        targets = rows[:, p] if p.ndim == 1 else rows.gather(1, p)
        out.append(-logp.gather(-1, targets[..., None])[..., 0].cpu())
    return torch.cat(out)


def _icl_check(n_ctx: int, n: int, late: int | None, early: int | None) -> tuple[int, int]:
    d_late, d_early = icl_positions(n_ctx)
    late = validate.index(late, "late") if late is not None else d_late
    early = validate.index(early, "early") if early is not None else d_early
    for name, p in (("late", late), ("early", early)):
        if p >= n_ctx:
            raise ValueError(f"ICL position {name}={p} is past the context length n_ctx={n_ctx}; use 1 <= {name} < {n_ctx}")
        if not 1 <= p < n:
            raise ValueError(f"ICL position {name}={p} is outside the sequence: use 1 <= position < {n} (n_ctx={n_ctx})")
    return late, early


def icl_scores_per_row(
    nll: Float[Tensor, "batch target"], n_ctx: int, late: int | None = None, early: int | None = None
) -> Float[Tensor, " batch"]:
    """Each row's ``loss[late - 1] - loss[early - 1]`` (from :func:`per_token_loss`). Their mean is the
    in-context-learning score and their spread its error: one position of one window is a noisy
    measurement (a standard deviation of about 3 nats here), so the standard error is
    ``std / sqrt(rows)``, about 0.1 nats over 1024 windows."""
    late, early = _icl_check(n_ctx, nll.shape[-1] + 1, late, early)
    return nll[:, late - 1] - nll[:, early - 1]


def icl_rows(model, tokens: Tensor, chunk: int = 64, **forward_kwargs) -> Tensor:
    """Each row's in-context-learning score (:func:`icl_scores_per_row`) from a forward pass that
    unembeds only the two positions it reads (``tokens`` checked by the caller)."""
    late, early = _icl_check(model.cfg.n_ctx, tokens.shape[-1], None, None)
    nll = loss_rows_at(model, tokens, torch.tensor([late, early]), chunk, **forward_kwargs)
    return nll[:, 0] - nll[:, 1]


def icl_score_from_loss(
    loss: Float[Tensor, "target"], n_ctx: int, late: int | None = None, early: int | None = None
) -> float:
    """The in-context-learning score from a per-position loss (:func:`per_position_loss`, entry
    ``t`` = loss of the token at position ``t + 1``): ``loss[late - 1] - loss[early - 1]``."""
    late, early = _icl_check(n_ctx, len(loss) + 1, late, early)
    return (loss[late - 1] - loss[early - 1]).item()


# ----------------------------------------------------------------------------------------------
# Ablations
# ----------------------------------------------------------------------------------------------

AblationMode = Literal["zero", "pattern"]


def _check_mode(mode) -> str:
    if mode not in ("zero", "pattern"):
        raise ValueError(f"unknown ablation mode {mode!r}; use 'zero' or 'pattern'")
    return mode


def zero_ablation(model: Transformer, heads: Head | Iterable[Head]) -> dict:
    """Forward keyword arguments that zero the output of ``heads``: ``model(tokens, **zero_ablation(...))``.

    Downstream heads then see a residual stream without these heads, so their attention patterns can
    change too (a previous-token head's removal changes what an induction head's keys say)."""
    return {"ablate": {h: 0.0 for h in validate.heads(model, heads)}}


@torch.no_grad()
def mean_ablation(model: Transformer, tokens: Int[Tensor, "batch pos"], heads: Head | Iterable[Head]) -> dict:
    """Forward keyword arguments that replace each head's output by its mean over the batch and
    the positions of ``tokens`` (a ``[d_model]`` vector): what the head writes on average stays,
    what it writes *about this input* goes."""
    heads = validate.heads(model, heads)
    _, cache = model.forward_checked(validate.tokens(model, tokens), return_cache=True)
    return {"ablate": {(l, h): cache.head_out[l][:, :, h].mean((0, 1)) for l, h in heads}}


@torch.no_grad()
def pattern_preserving_ablation(
    model: Transformer,
    tokens: Int[Tensor, "batch pos"],
    heads: Head | Iterable[Head],
    cache: ActivationCache | None = None,
) -> dict:
    """Forward keyword arguments for Olsson et al.'s pattern-preserving ablation of ``heads``.

    The heads' outputs are zeroed, but every head's attention pattern is frozen to its value on the
    clean run of ``tokens``. What is removed is then only what the heads *write* (their OV side,
    directly to the logits and into later heads' values), not their effect on later heads' queries
    and keys. Ablating an induction head this way measures its own contribution to the loss.
    ``cache`` is the clean run of ``tokens`` if you already have it."""
    return _pattern_kwargs(model, validate.tokens(model, tokens), validate.heads(model, heads), cache)


def _pattern_kwargs(model, tokens: Tensor, heads: list[Head], cache: ActivationCache | None) -> dict:
    if cache is None:
        _, cache = model.forward_checked(tokens, return_cache=True)
    frozen = {(l, h): cache.pattern[l][:, h] for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)}
    return {"ablate": {h: 0.0 for h in heads}, "patterns": frozen}


@torch.no_grad()
def ablated_loss(
    model: Transformer,
    tokens: Int[Tensor, "batch pos"],
    heads: Head | Iterable[Head] = (),
    mode: AblationMode = "zero",
    per_token: bool = False,
    cache: ActivationCache | None = None,
):
    """The model's loss on ``tokens`` with ``heads`` ablated (``mode``: ``"zero"`` or ``"pattern"``;
    ``cache``, the clean run of ``tokens``, saves a forward pass in pattern mode)."""
    mode = _check_mode(mode)
    tokens = validate.tokens(model, tokens, 2, LOSS)
    nll = _ablated_nll(model, tokens, validate.heads(model, heads), mode, cache)
    return nll.cpu() if per_token else nll.mean().item()


def _ablated_nll(model, tokens: Tensor, heads: list[Head], mode: str, cache) -> Tensor:
    if mode == "zero":
        kwargs = {"ablate": {h: 0.0 for h in heads}}
    else:
        kwargs = _pattern_kwargs(model, tokens, heads, cache)
    return loss_fn(model.forward_checked(tokens, **kwargs), tokens, per_token=True)


@torch.no_grad()
def ablation_effects(
    model: Transformer,
    tokens: Int[Tensor, "batch pos"],
    mode: AblationMode = "zero",
    targets: slice | Sequence[int] | None = None,
    heads: Head | Iterable[Head] | None = None,
) -> Float[Tensor, "layer head"]:
    """Loss increase (nats) when each head alone is ablated; ``targets`` picks the target positions
    averaged (index into the per-token loss, e.g. the second copy of a repeated sequence).
    ``heads`` limits the work to some heads (the others are NaN); default: every head."""
    mode = _check_mode(mode)
    tokens = validate.tokens(model, tokens, 2, LOSS)
    n = tokens.shape[1] - 1  # per-token losses: one per position that has a next token
    targets = slice(None) if targets is None else targets
    if isinstance(targets, slice):
        if not len(range(n)[targets]):
            raise ValueError(f"targets={targets} picks none of the {n} target positions; pass positions in 0..{n - 1}")
    elif isinstance(targets, (str, bytes)) or not isinstance(targets, Iterable):
        raise TypeError(f"targets must be a slice or a list of target positions, got {targets!r}")
    else:
        targets = [validate.in_range(t, n, "target", "target positions (one per next-token loss)") for t in targets]
        if not targets:
            raise ValueError("targets is empty; pass at least one target position, or None for all")
    if heads is None:
        heads = [(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    else:
        heads = validate.heads(model, heads)
    logits, cache = model.forward_checked(tokens, return_cache=True)
    base = loss_fn(logits, tokens, per_token=True)[:, targets].mean()
    out = torch.full((model.cfg.n_layers, model.cfg.n_heads), float("nan"))
    for l, h in heads:
        nll = _ablated_nll(model, tokens, [(l, h)], mode, cache)
        out[l, h] = nll[:, targets].mean().cpu() - base.cpu()
    return out
