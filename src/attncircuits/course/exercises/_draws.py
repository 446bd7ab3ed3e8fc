"""Generated inputs the checks of several chapters share: small random models, token batches and
causal attention patterns, drawn from a :class:`~._contract.Draw` with the edges the exercises'
texts allow first (one head of width 1, one position, the whole context, one token repeated).

Part of the check machinery (see :mod:`._core`). Models are cached by their sizes and seed, so a
check builds each one once per session (the learner's function gets a copy of it).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from attncircuits.course.exercises._contract import Draw
from attncircuits.course.exercises._inputs import random_model
from attncircuits.models.attn_only import AttnOnlyTransformer

__all__ = ["causal_pattern", "head", "model", "model_tokens", "tokens"]

# (d_model, n_heads, d_head, d_vocab, n_ctx): one head of width 1 over 3 tokens; 3 heads of 2; two
# heads of 8 over 7 tokens and 9 positions; d_model 2 (one sinusoid pair)
_EDGE_SIZES = ((4, 1, 1, 3, 4), (8, 3, 2, 5, 6), (16, 2, 8, 7, 9), (2, 2, 3, 4, 5))


@functools.lru_cache(maxsize=256)
def _cached(n_layers: int, d_model: int, n_heads: int, d_head: int, d_vocab: int, n_ctx: int, seed: int):
    return random_model(n_layers=n_layers, seed=seed, d_model=d_model, n_heads=n_heads, d_head=d_head,
                        d_vocab=d_vocab, n_ctx=n_ctx)


def model(draw: Draw, n_layers: int | tuple[int, int] = 1, min_ctx: int = 1, min_vocab: int = 2,
          edge: int | None = None) -> AttnOnlyTransformer:
    """A small seeded random model; ``edge`` (an index into the edge sizes) or random sizes:
    d_model 2-16 (even: the sinusoids come in pairs), 1-3 heads of 1-8, 2-12 tokens, n_ctx 1-10.
    ``n_layers`` is a number or an inclusive range."""
    layers = n_layers if isinstance(n_layers, int) else draw.int(*n_layers)
    if edge is not None:
        d_model, n_heads, d_head, d_vocab, n_ctx = _EDGE_SIZES[edge % len(_EDGE_SIZES)]
    else:
        d_model, n_heads, d_head = 2 * draw.int(1, 8), draw.int(1, 3), draw.int(1, 8)
        d_vocab, n_ctx = draw.int(2, 12), draw.int(1, 10)
    return _cached(layers, d_model, n_heads, d_head, max(d_vocab, min_vocab), max(n_ctx, min_ctx),
                   draw.rng.randrange(1000))


def tokens(draw: Draw, d_vocab: int, n_ctx: int, edge: int | None = None, min_pos: int = 1) -> Tensor:
    """``[batch, pos]`` token ids, batch 1-2, pos ``min_pos`` .. ``n_ctx``; edges: one position, the
    whole context with the last id at the last position, one token repeated, two rows."""
    if edge == 0:
        return torch.full((1, max(1, min_pos)), d_vocab - 1)
    if edge == 1:
        out = torch.randint(0, d_vocab, (1, n_ctx), generator=draw.gen)
        out[0, -1] = d_vocab - 1
        return out
    if edge == 2:
        return torch.zeros(2, n_ctx, dtype=torch.long)
    return torch.randint(0, d_vocab, (draw.int(1, 2), draw.int(min(min_pos, n_ctx), n_ctx)), generator=draw.gen)


def causal_pattern(draw: Draw, batch: int, heads: int, n: int, edge: int | None = None, scale: float = 2.0) -> Tensor:
    """A ``[batch, heads, n, n]`` attention pattern: rows sum to 1 over the keys at or before the
    query. Edges: every query on its own token, every query on the first token (an [EOT] sink),
    every query on the previous token (the first on itself), uniform rows."""
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if edge in (0, 1, 2):
        keys = torch.arange(n) if edge == 0 else torch.zeros(n, dtype=torch.long) if edge == 1 else (
            torch.arange(n) - 1).clamp(min=0)
        one = torch.nn.functional.one_hot(keys, n).float()
        return one.expand(batch, heads, n, n).clone()
    if edge == 3:
        return (causal.float() / causal.sum(-1, keepdim=True)).expand(batch, heads, n, n).clone()
    scores = draw.randn(batch, heads, n, n, scale=scale).masked_fill(~causal, float("-inf"))
    return scores.softmax(-1)


def model_tokens(draw: Draw, n_layers: int | tuple[int, int] = 1, n_edges: int = 4, min_pos: int = 1,
                 min_ctx: int = 1, min_vocab: int = 2) -> tuple[AttnOnlyTransformer, Tensor]:
    """A model and tokens for it: the first ``n_edges`` cases walk through the edge sizes and the
    edge token batches together (with ``n_layers`` a range, through its numbers of layers too)."""
    edge = draw.edge(n_edges)
    if edge is not None and not isinstance(n_layers, int):
        lo, hi = n_layers
        n_layers = lo + edge % (hi - lo + 1)
    m = model(draw, n_layers, min_ctx=max(min_ctx, min_pos), min_vocab=min_vocab, edge=edge)
    return m, tokens(draw, m.cfg.d_vocab, m.cfg.n_ctx, edge=edge, min_pos=min_pos)


def head(draw: Draw, n_heads: int, edge: int | None = None) -> int:
    """A head index: the first and the last head at the edges, else any."""
    if edge is not None:
        return 0 if edge % 2 == 0 else n_heads - 1
    return draw.rng.randrange(n_heads)
