"""Which term, which source: the logit and the attention scores split into their parts (chapters 6-8).

- :func:`logit_attribution`: each head's (and the direct path's) share of the next token's logit,
  with :func:`attribution_labels` naming the terms;
- :func:`qk_score_terms`: a layer-1 head's attention scores split by where its query and key
  inputs come from (:func:`qk_source_names`);
- :func:`two_back_accuracy`: how often the top prediction is the token ``back`` positions earlier.

These read the path expansion of the attention-only members (no LayerNorm, no MLPs, positions in
the queries and keys), and refuse another member in one line.
"""

from __future__ import annotations

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.analysis.circuits.paths import next_token_contributions
from attncircuits.core import validate
from attncircuits.core.heads import head_name
from attncircuits.models.interface import PATH_EXPANSION, require
from attncircuits.models.transformer import Transformer




def qk_source_names(model: Transformer) -> list[str]:
    """The sources of a layer-1 query or key input: the embedding, the positions, each layer-0 head."""
    return ["embed", "pos"] + [head_name(0, h) for h in range(model.cfg.n_heads)]


@torch.no_grad()
def qk_score_terms(
    model: Transformer, tokens: Int[Tensor, "batch pos"], head: int
) -> Float[Tensor, "q_source k_source batch q k"]:
    """The attention scores of layer-1 head ``head`` split by where the query and the key input
    come from (:func:`qk_source_names`): the query input is ``W_E[t] + W_pos + Σ_a out^{0,a}`` and
    so is the key's, so the score is a sum of ``(2 + n_heads)²`` terms
    ``(src_q W_Q)(src_k W_K)ᵀ / sqrt(d_head)``. Unmasked: the causal mask is not applied."""
    validate.depth(model, "splitting a layer-1 head's scores by source", at_least=2)
    require(model, "splitting a layer-1 head's scores by source", **PATH_EXPANSION)
    tokens = validate.tokens(model, tokens)
    head = validate.head(model, head)
    _, cache = model.forward_checked(tokens, return_cache=True)
    n = tokens.shape[1]
    parts = [model.W_E[tokens], model.W_pos[:n].expand(tokens.shape[0], -1, -1)]
    parts += [cache.head_out[0][:, :, a] for a in range(model.cfg.n_heads)]
    src = torch.stack(parts)  # [source, batch, pos, d_model]
    blk = model.blocks[1]
    q = src @ blk.W_Q[head]
    k = src @ blk.W_K[head]
    return einsum(q, k, "s b q d, t b k d -> s t b q k") / model.cfg.d_head**0.5


def attribution_labels(model: Transformer) -> list[str]:
    """The names of the terms of :func:`logit_attribution`: ``direct``, then ``0.0``, ``0.1``, ...
    (:func:`~attncircuits.core.heads.head_name`)."""
    return ["direct"] + [head_name(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]


@torch.no_grad()
def logit_attribution(
    model: Transformer, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch target term"]:
    """Each term's share of the logit of the *next* token, at every position but the last: the
    direct path ``W_E[t] W_U`` and every head's output times ``W_U`` (:func:`attribution_labels`).
    With no LayerNorm or biases the terms sum exactly to the model's logit of that token."""
    require(model, "the logit attribution (an exact sum of paths)", **PATH_EXPANSION)
    tokens = validate.tokens(model, tokens, 2, "a next token to attribute")
    _, cache = model.forward_checked(tokens, return_cache=True)
    parts = [(model.W_E[tokens] @ model.W_U)[:, :, None]] + [out @ model.W_U for out in cache.head_out]
    return next_token_contributions(parts, tokens, centered=False)


@torch.no_grad()
def two_back_accuracy(model: Transformer, tokens: Int[Tensor, "batch pos"], back: int = 2) -> float:
    """How often the model's top prediction at position ``i`` is the token at ``i - back``."""
    back = validate.count(back, "back")
    tokens = validate.tokens(model, tokens, back + 1, f"a token {back} back")
    logits = model.forward_checked(tokens)
    return float((logits[:, back:].argmax(-1) == tokens[:, :-back]).float().mean())
