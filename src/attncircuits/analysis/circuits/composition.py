"""Two layers, from the weights: Q/K/V composition scores, their random baseline and virtual heads' OV circuits (ch. 5).

The 2-layer path expansion and term importance, which also take the attention patterns of a forward
pass, are in :mod:`.two_layer_paths`.

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

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from attncircuits.analysis.circuits.factored_matrix import FactoredMatrix
from attncircuits.core import validate
from attncircuits.core.heads import Head
from attncircuits.models.transformer import Transformer

__all__ = [
    "CompositionBaseline",
    "CompositionScores",
    "composition_score",
    "composition_scores",
    "random_composition_baseline",
    "random_composition_scores",
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


def _check_pair(model: Transformer, writer: Head, reader: Head) -> tuple[Head, Head]:
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
def _circuits(model: Transformer, layer: int) -> dict[str, FactoredMatrix]:
    """What a head of ``layer`` writes (``ov = W_V W_O``) and the matrix each of its three inputs
    reads through: the query side ``q = W_QK = W_Q W_Kᵀ``, the key side ``k = W_QKᵀ``, the value
    side ``v = W_OV``. All heads at once, ``[n_heads, d_model, d_model]``, factored, float64."""
    W_Q, W_K, W_V, W_O = (getattr(model, name)[layer].detach().double() for name in ("W_Q", "W_K", "W_V", "W_O"))
    ov, qk = FactoredMatrix(W_V, W_O), FactoredMatrix(W_Q, W_K.mT)
    return {"ov": ov, "q": qk, "k": qk.T, "v": ov}


def _scores_from_factors(writer_ov: FactoredMatrix, reader: FactoredMatrix) -> Float[Tensor, "writer reader"]:
    """``‖W_OV^w @ R^r‖_F / (‖W_OV^w‖_F ‖R^r‖_F)`` for every writer w and reader r, without ever
    forming a d_model x d_model matrix: the product of two rank-d_head factored matrices is
    factored again, and its Frobenius norm comes from d_head x d_head pieces."""
    w = FactoredMatrix(writer_ov.A[:, None], writer_ov.B[:, None])  # [writer, 1, ...]
    r = FactoredMatrix(reader.A[None], reader.B[None])  # [1, reader, ...]
    return (w @ r).norm() / (w.norm() * r.norm())


def composition_score(model: Transformer, kind: str, writer: Head, reader: Head) -> float:
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
    model: Transformer,
    writer_layer: int = 0,
    reader_layer: int = 1,
    n_baseline: int = 500,
    seed: int = 0,
) -> CompositionScores:
    """All ``3 x n_heads²`` composition scores between ``writer_layer`` and ``reader_layer``, with a
    random baseline of ``n_baseline`` samples per kind drawn with the model's shapes and scales.
    A model with LayerNorm is read through its folded weights (``model.folded()``), where the
    products mean what they mean without it."""
    validate.depth(model, "composition", at_least=2)
    model = model.folded()
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


# ---- virtual heads ----------------------------------------------------------------------------
def virtual_ov_circuit(model: Transformer, writer: int, reader: int) -> FactoredMatrix:
    """Full OV circuit of virtual head ``(1, reader) ∘ (0, writer)``: ``W_E W_OV^{0,w} W_OV^{1,r} W_U``,
    ``[d_vocab (source token), d_vocab (output logit)]`` like a single head's, rank <= d_head."""
    validate.depth(model, "a virtual head", at_least=2, exactly=2)
    writer, reader = validate.head(model, writer, "writer"), validate.head(model, reader, "reader")
    b0, b1 = model.blocks
    with torch.no_grad():
        first = FactoredMatrix(model.W_E @ b0.W_V[writer], b0.W_O[writer])
        second = FactoredMatrix(b1.W_V[reader], b1.W_O[reader] @ model.W_U)
        return first @ second
