"""Two layers, on text: the 2-layer path expansion, virtual heads' patterns and term importance (ch. 5).

The final residual stream of a 2-layer attention-only model is exactly a sum of paths: the direct
path, one term per head, and one term per *virtual head* (a layer-1 head reading what a layer-0
head wrote). With every attention pattern frozen at its value in a forward pass, each path is
linear in the embedding, so the paper can ask how much of the loss each order of terms explains
(term importance). The weights-only side of two layers (composition scores, virtual heads' OV
circuits) is in :mod:`.composition`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.core import validate
from attncircuits.models.transformer import Transformer

__all__ = [
    "PAPER_TERM_IMPORTANCE",
    "TermImportance",
    "TwoLayerPaths",
    "term_importance",
    "two_layer_path_expansion",
    "virtual_head_pattern",
]


# ---- the 2-layer path expansion ----------------------------------------------
@dataclass
class TwoLayerPaths:
    """The residual stream that feeds the unembedding, split into its paths (``[batch, pos, ..., d_model]``).

    With ``A^{l,h}`` the attention pattern of head ``h`` of layer ``l`` (from the forward pass) and
    ``x = W_E[tokens]``, the final residual stream of a 2-layer attention-only model is exactly

        x                                                      direct path
        + Σ_a    A^{0,a} x W_OV^{0,a}                          layer-0 heads
        + Σ_b    A^{1,b} x W_OV^{1,b}                          layer-1 heads (reading the embedding)
        + Σ_a,b  A^{1,b} A^{0,a} x W_OV^{0,a} W_OV^{1,b}       virtual heads b∘a (V-composition)

    because a layer-1 head's values read the embedding plus every layer-0 head's output, and
    attention is linear once its pattern is fixed. Q- and K-composition hide inside ``A^{1,b}``.
    Virtual heads are indexed ``[writer a (layer 0), reader b (layer 1)]``.
    """

    direct: Float[Tensor, "batch pos d_model"]
    layer0: Float[Tensor, "batch pos head d_model"]
    layer1: Float[Tensor, "batch pos head d_model"]
    virtual: Float[Tensor, "batch pos writer reader d_model"]
    W_U: Float[Tensor, "d_model d_vocab"]

    def resid(
        self, direct: bool = True, layer0: bool = True, layer1: bool = True, virtual: bool = True
    ) -> Float[Tensor, "batch pos d_model"]:
        """The sum of the chosen paths (all four: the model's final residual stream)."""
        out = torch.zeros_like(self.direct)
        if direct:
            out = out + self.direct
        if layer0:
            out = out + self.layer0.sum(2)
        if layer1:
            out = out + self.layer1.sum(2)
        if virtual:
            out = out + self.virtual.sum((2, 3))
        return out

    def logits(self, **which: bool) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits of the chosen paths (keywords as in :meth:`resid`); all of them: the model's logits."""
        return self.resid(**which) @ self.W_U

    def logit_sizes(self) -> dict[str, Tensor]:
        """How much each term moves the logits: the mean, over positions, of the norm of its logit
        vector with the mean over the vocabulary removed (a softmax ignores that constant).

        ``‖x W_U - mean‖² = x (W_U C)(W_U C)ᵀ xᵀ`` with ``C`` the centering matrix, so the
        ``d_vocab``-wide logits of the 64 virtual heads are never built.
        """
        Uc = self.W_U - self.W_U.mean(-1, keepdim=True)
        G = Uc @ Uc.T  # [d_model, d_model]

        def size(x):
            return einsum(x @ G, x, "... m, ... m -> ...").clamp_min(0).sqrt().flatten(0, 1).mean(0)

        return {
            "direct": size(self.direct),
            "layer0": size(self.layer0),
            "layer1": size(self.layer1),
            "virtual": size(self.virtual),
        }


@torch.no_grad()
def two_layer_path_expansion(model: Transformer, tokens: Int[Tensor, "batch pos"], cache=None) -> TwoLayerPaths:
    """Split a 2-layer model's final residual stream on ``tokens`` into direct, single-head and
    virtual-head paths (see :class:`TwoLayerPaths`), each computed from the weights and the
    attention patterns of a forward pass (``cache``, run here if not given)."""
    validate.depth(model, "the 2-layer path expansion", at_least=2, exactly=2)
    tokens = validate.tokens(model, tokens)
    if cache is None:
        _, cache = model.forward_checked(tokens, return_cache=True)
    A0, A1 = cache.pattern  # [batch, head, q, k]
    b0, b1 = model.blocks
    x = model.W_E[tokens]
    # one layer-0 head: A (x W_V) W_O
    v0 = einsum(x, b0.W_V, "b k m, h m d -> b k h d")
    layer0 = einsum(einsum(A0, v0, "b h q k, b k h d -> b q h d"), b0.W_O, "b q h d, h d m -> b q h m")
    v1 = einsum(x, b1.W_V, "b k m, h m d -> b k h d")
    layer1 = einsum(einsum(A1, v1, "b h q k, b k h d -> b q h d"), b1.W_O, "b q h d, h d m -> b q h m")
    # virtual head (a, b): layer-1 head b applied to what layer-0 head a wrote
    vv = einsum(layer0, b1.W_V, "b k a m, r m d -> b k a r d")
    zv = einsum(A1, vv, "b r q k, b k a r d -> b q a r d")
    virtual = einsum(zv, b1.W_O, "b q a r d, r d m -> b q a r m")
    return TwoLayerPaths(x, layer0, layer1, virtual, model.W_U.detach())


def virtual_head_pattern(cache, writer: int, reader: int) -> Float[Tensor, "batch q k"]:
    """The attention pattern of virtual head ``reader ∘ writer``: ``A^{1,reader} @ A^{0,writer}``
    (query q reads position j through the layer-1 head, which read position k through the layer-0 head)."""
    if len(cache.pattern) != 2:
        raise ValueError(f"a virtual head needs the cache of a 2-layer model, this one has {len(cache.pattern)} layer(s)")
    n_heads = cache.pattern[0].shape[1]
    writer, reader = validate.in_range(writer, n_heads, "writer", "heads"), validate.in_range(reader, n_heads, "reader", "heads")
    return cache.pattern[1][:, reader] @ cache.pattern[0][:, writer]


# ---- term importance ---------------------------------------------------------------------------
PAPER_TERM_IMPORTANCE = {"direct": 1.8, "single": 5.2, "virtual": 0.3, "layer0": 1.3, "layer1": 5.2}


@dataclass
class TermImportance:
    """Loss (nats per token) with patterns frozen, as path terms are added; and the marginal gains.

    ``direct``: logits from the direct path alone; ``direct_layer0`` / ``direct_layer1``: plus the
    single-head terms of one layer; ``first_order``: plus all single-head terms; ``full``: plus the
    virtual heads, which is the model's own loss.
    """

    n_tokens: int
    uniform: float
    direct: float
    direct_layer0: float
    direct_layer1: float
    first_order: float
    full: float

    @property
    def gain_direct(self) -> float:
        """Direct path vs a uniform guess."""
        return self.uniform - self.direct

    @property
    def gain_single(self) -> float:
        """What all single-head terms add to the direct path."""
        return self.direct - self.first_order

    @property
    def gain_virtual(self) -> float:
        """What the virtual heads add to direct + single-head terms."""
        return self.first_order - self.full

    def gain_layer(self, layer: int, last: bool = False) -> float:
        """Single-head terms of one layer, added to the direct path alone (``last=False``) or added
        last, after the other layer's (``last=True``). Losses are not additive, so the two differ."""
        layer = validate.layer(2, layer)  # a 2-layer model's
        if last:
            return (self.direct_layer1 if layer == 0 else self.direct_layer0) - self.first_order
        return self.direct - (self.direct_layer0 if layer == 0 else self.direct_layer1)

    def rows(self) -> list[tuple[str, float, float]]:
        """``(term, ours in nats, paper in nats)`` for the book's table."""
        p = PAPER_TERM_IMPORTANCE
        return [
            ("direct path (vs uniform)", self.gain_direct, p["direct"]),
            ("+ single-head terms", self.gain_single, p["single"]),
            ("+ virtual-head terms", self.gain_virtual, p["virtual"]),
            ("layer-0 heads (added to direct)", self.gain_layer(0), p["layer0"]),
            ("layer-1 heads (added to direct)", self.gain_layer(1), p["layer1"]),
        ]


def _nll_sum(logits: Tensor, targets: Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum"))


@torch.no_grad()
def term_importance(
    model: Transformer, tokens: Int[Tensor, "batch pos"], batch_size: int = 64
) -> TermImportance:
    """The paper's term importance: freeze every attention pattern at its value in a forward pass on
    ``tokens``, then measure the next-token loss when the logits contain only the direct path, then
    also the single-head terms, then also the virtual-head terms (which restores the model's loss).

    Sums over heads are taken before the unembedding: the single-head terms of layer 1 are
    ``Σ_b A^{1,b} x W_OV^{1,b}`` (its heads with values read from the embedding only, patterns
    frozen), the layer-0 terms are the layer-0 outputs, and the virtual terms are the rest of the
    layer-1 output. The direct path depends on the current token alone, so its loss comes from the
    ``d_vocab x d_vocab`` table ``W_E W_U``; the full loss comes from the forward pass's own logits.
    Memory is one batch of ``batch_size`` rows of logits at a time.
    """
    validate.depth(model, "term importance", at_least=2, exactly=2)
    tokens = validate.tokens(model, tokens, 2, "term importance (one prediction)")
    batch_size = validate.count(batch_size, "batch_size")
    b1 = model.blocks[1]
    W_U = model.W_U
    bigram = model.W_E @ W_U  # the direct path's logits for every current token
    bigram_nll = bigram.logsumexp(-1, keepdim=True) - bigram  # [current token, next token]
    totals = dict.fromkeys(("direct", "direct_layer0", "direct_layer1", "first_order", "full"), 0.0)
    n = 0
    for start in range(0, tokens.shape[0], batch_size):
        tok = tokens[start : start + batch_size]
        logits, cache = model.forward_checked(tok, return_cache=True)
        x = cache.resid[0][:, :-1]
        l0 = cache.head_out[0].sum(2)[:, :-1]
        v1 = einsum(cache.resid[0], b1.W_V, "b k m, h m d -> b k h d")
        z1 = einsum(cache.pattern[1][:, :, :-1], v1, "b h q k, b k h d -> b q h d")
        l1 = einsum(z1, b1.W_O, "b q h d, h d m -> b q m")
        targets = tok[:, 1:]
        totals["direct"] += float(bigram_nll[tok[:, :-1], targets].sum())
        totals["direct_layer0"] += _nll_sum((x + l0) @ W_U, targets)
        totals["direct_layer1"] += _nll_sum((x + l1) @ W_U, targets)
        totals["first_order"] += _nll_sum((x + l0 + l1) @ W_U, targets)
        totals["full"] += _nll_sum(logits[:, :-1], targets)
        n += targets.numel()
    return TermImportance(n_tokens=n, uniform=math.log(model.cfg.d_vocab), **{k: v / n for k, v in totals.items()})
