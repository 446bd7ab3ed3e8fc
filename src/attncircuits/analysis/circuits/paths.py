"""The exact path expansion of a one-layer model's logits (chapter 3).

With no MLP, no LayerNorm and no biases, a one-layer attention-only model's logits are a sum of
``1 + n_heads`` terms, each readable from the weights:

    logits[q] = W_E[t_q] W_U                                     (direct path: a bigram table)
              + Σ_h Σ_k A^h[q, k] · W_E[t_k] W_V^h W_O^h W_U       (head h: pattern ⊗ OV circuit)

where ``A^h`` is the head's attention pattern, the causal softmax of the scores
``(W_E[t_q] + W_pos[q]) W_Q^h ((W_E[t_k] + W_pos[k]) W_K^h)^T / sqrt(d_head)``. In the paper's tensor
notation this is ``T = Id ⊗ W_U W_E + Σ_h A^h ⊗ W_U W_OV^h W_E``. Nothing is approximated: the sum
equals the forward pass to float precision, which :func:`path_expansion_error` measures.

For a deeper model the same terms exist for the first layer (layer 0 reads the embedding only, so
its patterns and OV terms come from the weights just the same); everything that passes through a
later layer is gathered into one ``rest`` term, taken from the forward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.core import validate
from attncircuits.core.heads import head_name
from attncircuits.models.interface import PATH_EXPANSION, require
from attncircuits.models.transformer import Transformer

NO_LAYERS = "attention patterns: its logits are the direct path alone"

__all__ = [
    "PathExpansion",
    "attention_patterns_from_weights",
    "next_token_contributions",
    "path_expansion",
    "path_expansion_error",
]


@dataclass
class PathExpansion:
    """The logits of a batch of texts as a sum of terms: ``direct + Σ_h heads[..., h, :] (+ rest)``."""

    tokens: Int[Tensor, "batch pos"]
    direct: Float[Tensor, "batch pos d_vocab"]
    heads: Float[Tensor, "batch pos head d_vocab"]  # one term per layer-0 head
    patterns: Float[Tensor, "batch head q k"]  # the layer-0 patterns the head terms used
    rest: Float[Tensor, "batch pos d_vocab"] | None = None  # paths through later layers (deeper models)

    @property
    def labels(self) -> list[str]:
        out = ["direct"] + [f"head {head_name(0, h)}" for h in range(self.heads.shape[2])]
        return out + (["later layers"] if self.rest is not None else [])

    @property
    def terms(self) -> Float[Tensor, "batch pos term d_vocab"]:
        parts = [self.direct[:, :, None], self.heads] + ([self.rest[:, :, None]] if self.rest is not None else [])
        return torch.cat(parts, dim=2)

    @property
    def total(self) -> Float[Tensor, "batch pos d_vocab"]:
        out = self.direct + self.heads.sum(dim=2)
        return out if self.rest is None else out + self.rest

    def next_token_contributions(self, centered: bool = True) -> Float[Tensor, "batch pos_minus_1 term"]:
        """Each term's contribution to the logit of the true next token, at every position but the last.

        With ``centered`` (the default) each term's mean over the vocabulary is subtracted first:
        the softmax ignores a shift shared by all logits, so only the part that singles out the
        next token counts.
        """
        parts = [self.direct[:, :, None], self.heads] + ([self.rest[:, :, None]] if self.rest is not None else [])
        return next_token_contributions(parts, self.tokens, centered)


def next_token_contributions(
    parts: list[Float[Tensor, "batch pos term d_vocab"]], tokens: Int[Tensor, "batch pos"], centered: bool = True
) -> Float[Tensor, "batch pos_minus_1 term"]:
    """Each term's logit of the true next token ``tokens[:, 1:]``, at every position but the last,
    the terms of all ``parts`` side by side (``centered``: each term's mean over the vocabulary
    subtracted first). Term by term: never a copy of all terms at once."""
    nxt = tokens[:, 1:, None, None]
    out = []
    for p in parts:
        p = p[:, :-1]
        c = p.gather(-1, nxt.expand(-1, -1, p.shape[2], 1))[..., 0]
        out.append(c - p.mean(-1) if centered else c)
    return torch.cat(out, dim=2)


def attention_patterns_from_weights(
    model: Transformer, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch head q k"]:
    """Layer-0 attention patterns computed from the weights: the causal softmax of
    ``(W_E[t_q] + W_pos[q]) W_Q ((W_E[t_k] + W_pos[k]) W_K)^T / sqrt(d_head)``, i.e. of the sum of
    the four QK parts (token-token, token-position, position-token, position-position)."""
    validate.depth(model, NO_LAYERS)
    require(model, "patterns computed from the weights", **PATH_EXPANSION)
    return _patterns_from_weights(model, validate.tokens(model, tokens))


def _patterns_from_weights(model: Transformer, tokens: Tensor) -> Tensor:
    blk, n = model.blocks[0], tokens.shape[1]
    x = model.W_E[tokens] + model.W_pos[:n]
    q = einsum(x, blk.W_Q, "b p dm, h dm dh -> b h p dh")
    k = einsum(x, blk.W_K, "b p dm, h dm dh -> b h p dh")
    scores = einsum(q, k, "b h q dh, b h k dh -> b h q k") / math.sqrt(model.cfg.d_head)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=scores.device))
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


@torch.no_grad()
def path_expansion(
    model: Transformer,
    tokens: Int[Tensor, "batch pos"],
    patterns: Float[Tensor, "batch head q k"] | None = None,
) -> PathExpansion:
    """The logits as ``direct + Σ_h pattern^h ⊗ OV^h`` (+ ``rest`` for deeper models), term by term.

    ``patterns`` defaults to :func:`attention_patterns_from_weights`; pass other (e.g. frozen or edited)
    layer-0 patterns to see what the terms would be under them. Each head term is
    ``A^h @ (W_E[t] W_V^h) @ (W_O^h W_U)``: the full OV circuit's rows for the tokens in the text,
    weighted by the pattern (computed in that order so the d_vocab-wide product is made once per position).
    """
    validate.depth(model, NO_LAYERS)
    return _expansion(model, validate.tokens(model, tokens), patterns)


def _expansion(model: Transformer, tokens: Tensor, patterns: Tensor | None = None) -> PathExpansion:
    if patterns is None:
        patterns = _patterns_from_weights(model, tokens)
    else:
        want = (tokens.shape[0], model.cfg.n_heads, tokens.shape[1], tokens.shape[1])
        if tuple(patterns.shape) != want:
            raise ValueError(
                f"patterns must be [batch, head, q, k] = {list(want)} for these tokens, got {list(patterns.shape)}"
            )
    emb = model.W_E[tokens]
    direct = emb @ model.W_U
    blk = model.blocks[0]
    v = einsum(emb, blk.W_V, "b k dm, h dm dh -> b h k dh")
    z = einsum(patterns.to(v), v, "b h q k, b h k dh -> b q h dh")
    heads = einsum(z, blk.W_O @ model.W_U, "b q h dh, h dh V -> b q h V")
    rest = None
    if model.cfg.n_layers > 1:
        rest = model.forward_checked(tokens) - direct - heads.sum(2)
    return PathExpansion(tokens, direct, heads, patterns, rest)


@torch.no_grad()
def path_expansion_error(model: Transformer, tokens: Int[Tensor, "batch pos"]) -> float:
    """Max absolute difference between the path expansion and the model's own forward pass.

    One layer: ``|direct + Σ_h heads − logits|``. Deeper models: each first-layer head term against
    the forward pass's own head output, ``|heads[h] − head_out[0][h] W_U|``, and the patterns (the
    ``rest`` term is defined as the remainder, so comparing totals would prove nothing, and the
    direct path ``W_E[t] W_U`` is the same product on both sides).
    """
    validate.depth(model, NO_LAYERS)
    tokens = validate.tokens(model, tokens)
    exp = _expansion(model, tokens)
    logits, cache = model.forward_checked(tokens, return_cache=True)
    if model.cfg.n_layers == 1:
        return float((exp.total - logits).abs().max())
    head_logits = einsum(cache.head_out[0], model.W_U, "b p h dm, dm V -> b p h V")
    return max(
        float((exp.heads - head_logits).abs().max()),
        float((exp.patterns - cache.pattern[0]).abs().max()),
    )
