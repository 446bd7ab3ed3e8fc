"""Behaviour-based analysis: run the model and measure what its heads do.

Where ``circuits.py`` reads weights, this module runs forward passes: previous-token and
prefix-matching scores of every head, and the loss on repeated random tokens (chapters 6 and 7).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .data import repeated_random_tokens
from .model import AttnOnlyTransformer, loss_fn


def _patterns(model: AttnOnlyTransformer, tokens) -> Float[Tensor, "layer batch head q k"]:
    if model.cfg.n_layers == 0:
        raise ValueError("a model with no layers has no attention heads to score")
    _, cache = model.run_with_cache(tokens)
    return torch.stack(cache.pattern)


@torch.no_grad()
def previous_token_scores(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer head"]:
    """Mean attention from each position to the one before it (positions 1..n-1)."""
    pat = _patterns(model, tokens)
    return pat.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, 3))


def prefix_matching_mask(seq_len: int, n_repeats: int, prepend_eot: bool = True) -> Tensor:
    """``[q, k]`` True where key k holds the token that followed an earlier copy of query q's token."""
    off = int(prepend_eot)
    n = seq_len * n_repeats + off
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(seq_len, seq_len * n_repeats):  # queries in copies 2, 3, ...
        for j in range(i - seq_len, -1, -seq_len):  # earlier occurrences of the same token
            mask[i + off, j + 1 + off] = True
    return mask


@torch.no_grad()
def prefix_matching_scores(
    model: AttnOnlyTransformer, seq_len: int = 25, n_repeats: int = 4, batch_size: int = 16, seed: int = 0
) -> Float[Tensor, "layer head"]:
    """Olsson et al.'s prefix-matching score: on random tokens repeated ``n_repeats`` times, the
    attention a query in a later copy pays to the tokens right after earlier copies of itself."""
    toks = repeated_random_tokens(batch_size, seq_len, n_repeats, model.cfg.d_vocab, seed, n_ctx=model.cfg.n_ctx)
    pat = _patterns(model, toks)  # [layer, batch, head, q, k]
    mask = prefix_matching_mask(seq_len, n_repeats).to(pat.device)
    queries = mask.any(dim=-1)
    return (pat * mask).sum(-1)[..., queries].mean(dim=(1, 3))


@dataclass
class RepeatedLoss:
    first: float  # mean loss on the first copy (nothing to copy from)
    second: float  # mean loss on the second copy (an induction head can copy)

    @property
    def ratio(self) -> float:
        return self.second / self.first


@torch.no_grad()
def repeated_token_loss(
    model: AttnOnlyTransformer, seq_len: int | None = None, batch_size: int = 16, seed: int = 0
) -> RepeatedLoss:
    """Loss on ``[EOT] r1..rL r1..rL``: first copy (targets r2..rL) vs second copy (targets r2..rL
    again). The first target of each copy is left out: no earlier context predicts it."""
    L = seq_len or (model.cfg.n_ctx - 1) // 2
    toks = repeated_random_tokens(batch_size, L, 2, model.cfg.d_vocab, seed, n_ctx=model.cfg.n_ctx)
    nll = loss_fn(model(toks), toks, per_token=True)  # nll[:, t] predicts token t+1
    first = nll[:, 1:L].mean().item()  # targets at positions 2..L
    second = nll[:, L + 1 : 2 * L].mean().item()  # targets at positions L+2..2L
    return RepeatedLoss(first, second)


def icl_positions(n_ctx: int, late: int = 500, early: int = 50, ref_ctx: int = 512) -> tuple[int, int]:
    """Olsson et al.'s token 500 vs token 50 of a 512-token context, scaled to ``n_ctx``."""
    return round(late * n_ctx / ref_ctx), round(early * n_ctx / ref_ctx)


@torch.no_grad()
def in_context_learning_score(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    late: int | None = None,
    early: int | None = None,
) -> float:
    """Loss at a late position minus loss at an early one (nats; negative = the model uses context).

    Olsson et al. use token 500 minus token 50 in 512-token contexts; by default the positions are
    scaled to this model's context (``icl_positions``: 125 and 12 for n_ctx=128). Losses are means
    over ``tokens``' rows at those target positions.
    """
    n = tokens.shape[-1]
    d_late, d_early = icl_positions(model.cfg.n_ctx)
    late, early = late if late is not None else d_late, early if early is not None else d_early
    for name, p in (("late", late), ("early", early)):
        if not 1 <= p < n:
            raise ValueError(f"ICL position {name}={p} is outside the sequence: use 1 <= position < {n} (n_ctx={model.cfg.n_ctx})")
    nll = loss_fn(model(tokens), tokens, per_token=True)  # nll[:, t] is the loss of target t+1
    return (nll[:, late - 1].mean() - nll[:, early - 1].mean()).item()
