"""The full OV / QK circuits of a head, kept factored, and the positional heads they make (chapter 3).

A head's circuits are products of thin matrices (``[d_vocab, d_head] @ [d_head, d_vocab]``), so
they are returned as a :class:`~.factored_matrix.FactoredMatrix` and made dense only when asked.

Row-vector convention (as everywhere in this package): the OV circuit's row is the *source* token
(the one attended to), its column the *output* logit; the QK circuit's row is the *destination*
(query) token, its column the *source* (key) token, and its entries are attention scores, scale
``1/sqrt(d_head)`` included, exactly as the model adds them before the softmax.

For a layer above the first, these are the circuits of the *direct* path from the embedding; the
paths through earlier heads (composition) are chapter 5's subject.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import reduce
from jaxtyping import Float
from torch import Tensor

from attncircuits.analysis import definitions as D
from attncircuits.analysis.circuits.factored_matrix import FactoredMatrix
from attncircuits.core import validate
from attncircuits.models.interface import require
from attncircuits.models.transformer import Transformer

QK_POSITIONS = ("sinusoidal-qk",)  # the position parts below read W_pos in the queries and keys

__all__ = [
    "QKParts",
    "full_ov_circuit",
    "full_qk_circuit",
    "mean_attention_by_offset",
    "positional_attention",
    "positional_heads",
    "positional_qk_circuit",
    "ov_factors",
    "qk_circuit_parts",
    "qk_factors",
]

# ------------------------------------------------------------------------------------------------
# The circuits of a head
# ------------------------------------------------------------------------------------------------
def _checked(model: Transformer, layer: int, head: int | None) -> tuple[int, slice | int]:
    """The layer and head (``None``: every head, a slice) of a public call, checked once."""
    validate.depth(model, "heads")
    require(model, "a circuit read from the weights", attn_only=True, no_layernorm=True)
    layer = validate.layer(model, layer)
    return layer, slice(None) if head is None else validate.head(model, head)


def ov_factors(model: Transformer, layer: int, h: slice | int) -> FactoredMatrix:
    """:func:`full_ov_circuit` for a checked layer and head (callers that checked them already)."""
    blk = model.blocks[layer]
    with torch.no_grad():
        return FactoredMatrix(model.W_E @ blk.W_V[h], blk.W_O[h] @ model.W_U)


def full_ov_circuit(model: Transformer, layer: int, head: int | None = None) -> FactoredMatrix:
    """``W_E W_V^h W_O^h W_U``: row = source token attended to, column = output logit it raises.

    Factored as ``(W_E W_V) [d_vocab, d_head] @ (W_O W_U) [d_head, d_vocab]``. ``head=None`` gives all
    heads of the layer at once, ``[n_heads, d_vocab, d_vocab]``.
    """
    return ov_factors(model, *_checked(model, layer, head))


def qk_factors(model, layer: int, h: slice | int, left: Tensor, right: Tensor) -> FactoredMatrix:
    """A QK circuit part for a checked layer and head, ``left`` and ``right`` the query and key inputs."""
    blk = model.blocks[layer]
    scale = 1 / math.sqrt(model.cfg.d_head)
    with torch.no_grad():
        return FactoredMatrix(left @ blk.W_Q[h] * scale, (right @ blk.W_K[h]).transpose(-2, -1))


def full_qk_circuit(model: Transformer, layer: int, head: int | None = None) -> FactoredMatrix:
    """``W_E W_Q^h (W_E W_K^h)^T / sqrt(d_head)``: the token-token part of the attention score.

    Row = destination (query) token, column = source (key) token; an entry is the score the head
    adds before its softmax when the destination token looks at the source token.
    """
    return qk_factors(model, *_checked(model, layer, head), model.W_E, model.W_E)


def positional_qk_circuit(model: Transformer, layer: int, head: int | None = None) -> FactoredMatrix:
    """``W_pos W_Q^h (W_pos W_K^h)^T / sqrt(d_head)``: the position-position part of the score,
    ``[n_ctx (query position), n_ctx (key position)]``; it makes previous- and current-token heads."""
    require(model, "the position-position QK circuit", positions=QK_POSITIONS)
    return qk_factors(model, *_checked(model, layer, head), model.W_pos, model.W_pos)


@dataclass
class QKParts:
    """The four parts of a score: the query input is ``W_E[t_q] + W_pos[i]``, the key input
    ``W_E[t_k] + W_pos[j]``, and the bilinear score expands into token-token, token-position,
    position-token and position-position terms that add up exactly (:meth:`score`)."""

    token_token: FactoredMatrix  # [.., d_vocab (query token), d_vocab (key token)]
    token_pos: FactoredMatrix  # [.., d_vocab (query token), n_ctx (key position)]
    pos_token: FactoredMatrix  # [.., n_ctx (query position), d_vocab (key token)]
    pos_pos: FactoredMatrix  # [.., n_ctx (query position), n_ctx (key position)]

    def score(self, q_token: int, q_pos: int, k_token: int, k_pos: int) -> Float[Tensor, "*batch"]:
        """The pre-softmax score of one (query, key) pair, summed from the four parts."""
        q_token = validate.token_id(q_token, self.token_token.ldim, "q_token")
        k_token = validate.token_id(k_token, self.token_token.rdim, "k_token")
        q_pos = validate.in_range(q_pos, self.pos_pos.ldim, "q_pos", "positions")
        k_pos = validate.in_range(k_pos, self.pos_pos.rdim, "k_pos", "positions")
        parts = [
            self.token_token.restrict([q_token], [k_token]),
            self.token_pos.restrict([q_token], [k_pos]),
            self.pos_token.restrict([q_pos], [k_token]),
            self.pos_pos.restrict([q_pos], [k_pos]),
        ]
        return sum(p.dense()[..., 0, 0] for p in parts)


def qk_circuit_parts(model: Transformer, layer: int, head: int | None = None) -> QKParts:
    """All four parts of the QK circuit (positions enter only the queries and keys)."""
    layer, h = _checked(model, layer, head)
    require(model, "the QK circuit's position parts", positions=QK_POSITIONS)
    E, P = model.W_E, model.W_pos
    return QKParts(
        token_token=qk_factors(model, layer, h, E, E),
        token_pos=qk_factors(model, layer, h, E, P),
        pos_token=qk_factors(model, layer, h, P, E),
        pos_pos=qk_factors(model, layer, h, P, P),
    )


# ------------------------------------------------------------------------------------------------
# Positional heads
# ------------------------------------------------------------------------------------------------
def mean_attention_by_offset(
    pattern: Float[Tensor, "batch head q k"], max_offset: int = 8
) -> Float[Tensor, "head offset"]:
    """Average attention from a query to the key ``offset`` positions back (0 = itself, 1 = previous).

    Averaged over the batch and over the queries that have such a key (query position >= offset).
    """
    n = pattern.shape[-1]
    out = []
    for off in range(min(max_offset, n - 1) + 1):
        diag = pattern.diagonal(offset=-off, dim1=-2, dim2=-1)  # [batch, head, n - off]
        out.append(reduce(diag, "batch head q -> head", "mean"))
    return torch.stack(out, -1)


def positional_attention(model: Transformer, layer: int, n_pos: int | None = None) -> Float[Tensor, "head q k"]:
    """The pattern each head would have from positions alone: the causal softmax of its
    position-position scores (token parts left out), ``[n_heads, n_pos, n_pos]``."""
    layer, h = _checked(model, layer, None)
    require(model, "attention from positions alone", positions=QK_POSITIONS)
    n_pos = validate.count(model.cfg.n_ctx if n_pos is None else n_pos, "n_pos", 1, model.cfg.n_ctx, why="the model's n_ctx")
    scores = qk_factors(model, layer, h, model.W_pos, model.W_pos).restrict(range(n_pos), range(n_pos)).dense()
    mask = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def positional_heads(
    model: Transformer, layer: int, threshold: float = D.POSITIONAL_HEAD.value, window: int = 3,
    n_pos: int | None = None,
) -> dict[int, tuple[str, float]]:
    """Heads that attend by position, found from ``W_pos`` alone (the causal softmax of the
    position-position scores, averaged over query positions).

    A head is a ``"current"`` or ``"previous"`` token head when more than ``threshold`` of that
    attention sits at offset 0 or 1 alone, and a ``"recent"`` head when more than ``threshold`` sits on
    the last ``window`` tokens together (offsets ``0..window-1``). Returns ``{head: (kind, attention
    there)}``; heads that attend by token content are not listed.
    """
    window = validate.count(window, "window", why="tokens of the recent window")
    prof = mean_attention_by_offset(positional_attention(model, layer, n_pos)[None], max_offset=window - 1)
    found = {}
    for h in range(model.cfg.n_heads):
        if prof[h, 0] > threshold:
            found[h] = ("current", float(prof[h, 0]))
        elif prof.shape[1] > 1 and prof[h, 1] > threshold:
            found[h] = ("previous", float(prof[h, 1]))
        elif prof[h].sum() > threshold:
            found[h] = ("recent", float(prof[h].sum()))
    return found
