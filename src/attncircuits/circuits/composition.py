"""Two layers: Q/K/V composition scores, virtual heads, the 2-layer path expansion and term importance (ch. 5).

A layer-1 head reads the residual stream, and the residual stream holds what layer-0 heads wrote.
It can read that output through its query (Q-composition), its key (K-composition) or its value
(V-composition). In the row-vector convention of this package (``x @ W``) a head's circuits are

    W_OV = W_V @ W_O    [d_model, d_model]   (what it writes: x_src @ W_OV)
    W_QK = W_Q @ W_K.T  [d_model, d_model]   (where it looks: x_dst @ W_QK @ x_src.T)

If a layer-0 head writes ``y @ W_OV^{h1}`` and a layer-1 head reads it, the product that matters is

    Q-composition:  W_OV^{h1} @ W_QK^{h2}      (the query side reads what h1 wrote)
    K-composition:  W_OV^{h1} @ W_QK^{h2}.T    (the key side reads what h1 wrote)
    V-composition:  W_OV^{h1} @ W_OV^{h2}      (the value side reads what h1 wrote)

and the composition score is ``‖product‖_F / (‖first‖_F ‖second‖_F)``. The paper writes column
vectors, where ``W_OV`` is our transpose and the scores read ``‖W_QKᵀ W_OV‖``, ``‖W_QK W_OV‖`` and
``‖W_OV² W_OV¹‖``; the Frobenius norm is the same in both conventions. The first published version
of the paper had the Q and K products permuted; ``tests/test_composition.py`` builds a head pair
that composes through the key only and checks that only the K score sees it.

Positions: the sinusoids ``W_pos`` enter the query and key inputs of every layer (not the residual
stream), so they do not appear in ``W_OV`` or in these scores; they do shape the attention
patterns, which the path expansion and term importance take from the model as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from .. import validate
from ..heads import Head
from ..model import AttnOnlyTransformer
from .factored import FactoredMatrix

__all__ = [
    "PAPER_TERM_IMPORTANCE",
    "CompositionBaseline",
    "CompositionScores",
    "TermImportance",
    "TwoLayerPaths",
    "composition_score",
    "composition_scores",
    "random_composition_baseline",
    "random_composition_scores",
    "term_importance",
    "two_layer_path_expansion",
    "virtual_head_pattern",
    "virtual_ov_circuit",
]

KINDS = ("q", "k", "v")
KIND_NAMES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}


# ---- checks ------------------------------------------------------------------------------------
def _check_kind(kind: str) -> str:
    k = str(kind).lower()
    if k not in KINDS:
        raise ValueError(f"unknown composition kind {kind!r}; use 'q', 'k' or 'v'")
    return k


def _check_pair(model: AttnOnlyTransformer, writer: Head, reader: Head) -> tuple[Head, Head]:
    validate.depth(model, "composition", at_least=2)
    writer, reader = validate.head_pair(model, writer, "writer"), validate.head_pair(model, reader, "reader")
    if writer[0] >= reader[0]:
        raise ValueError(
            f"writer head {tuple(writer)} must be in an earlier layer than reader head {tuple(reader)}: "
            "a head composes with what an earlier layer wrote. Pass a layer-0 head as the writer and "
            "a layer-1 head as the reader, e.g. writer=(0, h1), reader=(1, h2)"
        )
    return writer, reader


# ---- composition scores, on the factors --------------------------------------------------------
def _circuits(model: AttnOnlyTransformer, layer: int) -> dict[str, FactoredMatrix]:
    """What a head of ``layer`` writes (``ov = W_V W_O``) and the matrix each of its three inputs
    reads through: the query side ``q = W_QK = W_Q W_Kᵀ``, the key side ``k = W_QKᵀ``, the value
    side ``v = W_OV``. All heads at once, ``[n_heads, d_model, d_model]``, factored, float64."""
    b = model.blocks[layer]
    W_Q, W_K, W_V, W_O = (w.detach().double() for w in (b.W_Q, b.W_K, b.W_V, b.W_O))
    ov, qk = FactoredMatrix(W_V, W_O), FactoredMatrix(W_Q, W_K.mT)
    return {"ov": ov, "q": qk, "k": qk.T, "v": ov}


def _scores_from_factors(writer_ov: FactoredMatrix, reader: FactoredMatrix) -> Float[Tensor, "writer reader"]:
    """``‖W_OV^w @ R^r‖_F / (‖W_OV^w‖_F ‖R^r‖_F)`` for every writer w and reader r, without ever
    forming a d_model x d_model matrix: the product of two rank-d_head factored matrices is
    factored again, and its Frobenius norm comes from d_head x d_head pieces."""
    w = FactoredMatrix(writer_ov.A[:, None], writer_ov.B[:, None])  # [writer, 1, ...]
    r = FactoredMatrix(reader.A[None], reader.B[None])  # [1, reader, ...]
    return (w @ r).norm() / (w.norm() * r.norm())


def composition_score(model: AttnOnlyTransformer, kind: str, writer: Head, reader: Head) -> float:
    """Composition score of one (writer, reader) pair: how much of what ``writer`` writes the
    ``reader`` reads through its query (``kind='q'``), key (``'k'``) or value (``'v'``).

    ``‖W_OV^w @ M^r‖_F / (‖W_OV^w‖_F ‖M^r‖_F)`` with ``M = W_QK`` (q), ``W_QKᵀ`` (k) or ``W_OV`` (v);
    1 when the reader reads exactly the subspace the writer writes, 0 when they are orthogonal.
    """
    kind = _check_kind(kind)
    writer, reader = _check_pair(model, writer, reader)
    w = _circuits(model, writer[0])["ov"][writer[1]]
    r = _circuits(model, reader[0])[kind][reader[1]]
    return float((w @ r).norm() / (w.norm() * r.norm()))


@dataclass
class CompositionBaseline:
    """Composition scores of random matrices with the model's shapes and scales, per kind."""

    samples: dict[str, Float[Tensor, " n"]]

    def mean(self, kind: str) -> float:
        return float(self.samples[_check_kind(kind)].mean())

    def std(self, kind: str) -> float:
        return float(self.samples[_check_kind(kind)].std())


def random_composition_baseline(
    d_model: int,
    d_head: int,
    n_samples: int = 500,
    seed: int = 0,
    scales: dict[str, float] | None = None,
) -> CompositionBaseline:
    """Measure the composition score of random heads: factors ``W_Q, W_K, W_V [d_model, d_head]`` and
    ``W_O [d_head, d_model]`` with i.i.d. Gaussian entries (std from ``scales``, by default 1).

    Two random rank-d_head maps share some directions by chance: the score is about ``1/√d_model``
    (0.088 at d_model=128), not 0. The score is scale-free, so ``scales`` changes nothing but is
    accepted to sample "the same scale" as a model literally. One random writer head (``W_V, W_O``)
    and one random reader head (``W_Q, W_K, W_V, W_O``) per sample; each kind reads its own input.
    """
    d_model, d_head = validate.count(d_model, "d_model"), validate.count(d_head, "d_head")
    n_samples = validate.count(n_samples, "n_samples", 2, why="to measure a spread")
    return _random_baseline(d_model, d_head, n_samples, seed, scales)


def random_composition_scores(d_model: int, d_head: int, n_samples: int, seed: int = 0) -> Float[Tensor, " n_samples"]:
    """K-composition scores of ``n_samples`` pairs of random rank-``d_head`` maps (Gaussian factors
    ``[d_model, d_head] @ [d_head, d_model]``): the baseline a model's scores are read against."""
    return random_composition_baseline(d_model, d_head, n_samples, seed).samples["k"].float()


def _random_baseline(d_model: int, d_head: int, n_samples: int, seed: int, scales: dict[str, float] | None) -> CompositionBaseline:
    g = torch.Generator().manual_seed(seed)
    s = {"W_Q": 1.0, "W_K": 1.0, "W_V": 1.0, "W_O": 1.0, **(scales or {})}

    def draw(name, *shape):
        return torch.randn(*shape, generator=g).mul_(s[name])

    n, dm, dh = n_samples, d_model, d_head
    writer = FactoredMatrix(draw("W_V", n, dm, dh), draw("W_O", n, dh, dm))
    W_Q, W_K = draw("W_Q", n, dm, dh), draw("W_K", n, dm, dh)
    qk = FactoredMatrix(W_Q, W_K.mT)
    readers = {"q": qk, "k": qk.T, "v": FactoredMatrix(draw("W_V", n, dm, dh), draw("W_O", n, dh, dm))}
    writer_norm = writer.norm()
    out = {kind: (writer @ r).norm() / (writer_norm * r.norm()) for kind, r in readers.items()}
    return CompositionBaseline(out)


@dataclass
class CompositionScores:
    """Q/K/V composition scores ``[writer head, reader head]`` between two layers, and the random
    baseline they are read against."""

    q: Float[Tensor, "writer reader"]
    k: Float[Tensor, "writer reader"]
    v: Float[Tensor, "writer reader"]
    baseline: CompositionBaseline
    writer_layer: int = 0
    reader_layer: int = 1

    def __getitem__(self, kind: str) -> Float[Tensor, "writer reader"]:
        return getattr(self, _check_kind(kind))

    def excess(self, kind: str) -> Float[Tensor, "writer reader"]:
        """Score minus the random baseline's mean: what the model composes beyond chance."""
        return self[kind] - self.baseline.mean(kind)

    def z(self, kind: str) -> Float[Tensor, "writer reader"]:
        """Excess in units of the baseline's standard deviation."""
        return self.excess(kind) / self.baseline.std(kind)

    def top(self, kind: str, n: int = 5) -> list[tuple[Head, Head, float]]:
        """The ``n`` strongest pairs as ``((writer layer, head), (reader layer, head), score)``."""
        s = self[kind]
        idx = s.flatten().argsort(descending=True)[:n].tolist()
        H = s.shape[1]
        return [((self.writer_layer, i // H), (self.reader_layer, i % H), float(s.flatten()[i])) for i in idx]


@torch.no_grad()
def composition_scores(
    model: AttnOnlyTransformer,
    writer_layer: int = 0,
    reader_layer: int = 1,
    n_baseline: int = 500,
    seed: int = 0,
) -> CompositionScores:
    """All ``3 x n_heads²`` composition scores between ``writer_layer`` and ``reader_layer``, with a
    random baseline of ``n_baseline`` samples per kind drawn with the model's shapes and scales."""
    validate.depth(model, "composition", at_least=2)
    writer_layer = validate.layer(model, writer_layer, "writer_layer")
    reader_layer = validate.layer(model, reader_layer, "reader_layer")
    n_baseline = validate.count(n_baseline, "n_baseline", 2, why="to measure a spread")
    if writer_layer >= reader_layer:
        raise ValueError(
            f"writer_layer={writer_layer} must come before reader_layer={reader_layer}: a head composes with "
            "what an earlier layer wrote; use writer_layer=0, reader_layer=1"
        )
    w, r = _circuits(model, writer_layer), _circuits(model, reader_layer)
    scores = {kind: _scores_from_factors(w["ov"], r[kind]).float() for kind in KINDS}
    scales = {n: float(getattr(model, n).std()) for n in ("W_Q", "W_K", "W_V", "W_O")}
    base = _random_baseline(model.cfg.d_model, model.cfg.d_head, n_baseline, seed, scales)
    return CompositionScores(**scores, baseline=base, writer_layer=writer_layer, reader_layer=reader_layer)


# ---- the 2-layer path expansion and virtual heads ----------------------------------------------
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
def two_layer_path_expansion(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], cache=None) -> TwoLayerPaths:
    """Split a 2-layer model's final residual stream on ``tokens`` into direct, single-head and
    virtual-head paths (see :class:`TwoLayerPaths`), each computed from the weights and the
    attention patterns of a forward pass (``cache``, run here if not given)."""
    validate.depth(model, "the 2-layer path expansion", at_least=2, exactly=2)
    tokens = validate.tokens(model, tokens)
    if cache is None:
        _, cache = model.run_with_cache(tokens)
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


def virtual_ov_circuit(model: AttnOnlyTransformer, writer: int, reader: int) -> FactoredMatrix:
    """Full OV circuit of virtual head ``(1, reader) ∘ (0, writer)``: ``W_E W_OV^{0,w} W_OV^{1,r} W_U``,
    ``[d_vocab (source token), d_vocab (output logit)]`` like a single head's, rank <= d_head."""
    validate.depth(model, "a virtual head", at_least=2, exactly=2)
    writer, reader = validate.head(model, writer, "writer"), validate.head(model, reader, "reader")
    b0, b1 = model.blocks
    with torch.no_grad():
        first = FactoredMatrix(model.W_E @ b0.W_V[writer], b0.W_O[writer])
        second = FactoredMatrix(b1.W_V[reader], b1.W_O[reader] @ model.W_U)
        return first @ second


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
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], batch_size: int = 64
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
        logits, cache = model.run_with_cache(tok)
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
