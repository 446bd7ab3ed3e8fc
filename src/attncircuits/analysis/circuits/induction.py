"""Induction heads read from the weights: the K-composition term of a layer-1 head's QK circuit and
the eigenvalue positivity of its QK and OV circuits (chapter 6).

A previous-token head in layer 0 writes, at key position ``j``, a map of the token before it:
``W_E[t_{j-1}] W_OV^0``. A layer-1 head whose key reads that output scores a query token ``a``
against a key whose *previous* token is ``b`` by the K-composition term

    K[a, b] = W_E[a] W_Q^1 (W_E[b] W_OV^0 W_K^1)^T / sqrt(d_head)      [d_vocab, d_vocab]

For an induction head it is large on the diagonal (``a == b``: "the token before you is my
token"), so its eigenvalues are mostly positive. Its OV circuit ``W_E W_OV^1 W_U`` copies, so those
eigenvalues are positive too: induction heads sit in the top-right corner of the paper's
QK-vs-OV scatter. Both matrices are factored (``[d_vocab, d_head] @ [d_head, d_vocab]``), so their
eigenvalues come from the ``d_head x d_head`` product (:meth:`FactoredMatrix.eigenvalues`).

Positions do not enter ``W_OV`` (the residual stream carries tokens only); *which* key carries the
previous token is the layer-0 head's positional QK circuit (:func:`positional_qk_circuit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from attncircuits.analysis import definitions as D
from attncircuits.analysis.circuits.copying import eigen_copying_score
from attncircuits.analysis.circuits.factored import ov_factors
from attncircuits.analysis.circuits.factored_matrix import FactoredMatrix
from attncircuits.core import validate
from attncircuits.models.transformer import Transformer

__all__ = [
    "InductionEigen",
    "induction_eigen_positivity",
    "k_composition_circuit",
    "writer_ov",
]


def _reader(model: Transformer, layer, writers) -> tuple[int, list[int]]:
    """The checked reader layer (one with an earlier layer) and writer heads (None: all) of a public call."""
    validate.depth(model, "K-composition", at_least=2)
    layer = validate.layer(model, layer, "reader layer", first=1)
    return layer, list(range(model.cfg.n_heads)) if writers is None else validate.head_list(model, writers, "writers")


def writer_ov(model: Transformer, writers: Sequence[int] | None = None, layer: int = 0) -> Float[Tensor, "d_model d_model"]:
    """``Σ_p W_V^p W_O^p`` over the chosen heads ``writers`` of ``layer`` (default: all of them):
    what those heads together write into the residual stream for a unit of attention."""
    validate.depth(model, "heads")
    layer = validate.layer(model, layer)
    heads = list(range(model.cfg.n_heads)) if writers is None else validate.head_list(model, writers, "writers")
    return _writer_ov(model, heads, layer)


def _writer_ov(model: Transformer, heads: list[int], layer: int) -> Tensor:
    blk = model.blocks[layer]
    idx = torch.as_tensor(heads)
    with torch.no_grad():
        return (blk.W_V[idx] @ blk.W_O[idx]).sum(0)


def k_composition_circuit(
    model: Transformer, layer: int, head: int | None = None, writers: Sequence[int] | None = None
) -> FactoredMatrix:
    """The K-composition term ``W_E W_Q^h (W_E W_OV^writers W_K^h)^T / sqrt(d_head)`` of head
    ``head`` in ``layer`` (layer first, like :func:`full_ov_circuit`): row = query token, column =
    the token *before* the key (as the previous layer wrote it).

    ``head=None`` gives every head of the layer, ``[n_heads, d_vocab, d_vocab]``; ``writers`` are the
    previous layer's heads whose output the keys read (default: all, i.e. the whole K-composition term).
    """
    layer, writers = _reader(model, layer, writers)
    h = slice(None) if head is None else validate.head(model, head)
    return _k_composition(model, h, writers, layer)


def _k_composition(model: Transformer, h: slice | int, writers: list[int], layer: int) -> FactoredMatrix:
    blk = model.blocks[layer]
    ov0 = _writer_ov(model, writers, layer - 1)
    with torch.no_grad():
        left = model.W_E @ blk.W_Q[h] / math.sqrt(model.cfg.d_head)
        right = (model.W_E @ ov0 @ blk.W_K[h]).transpose(-2, -1)
        return FactoredMatrix(left, right)


@dataclass
class InductionEigen:
    """Eigenvalue positivity ``Σλ / Σ|λ|`` of every head of one layer: ``qk`` for the K-composition
    term of its QK circuit, ``ov`` for its full OV circuit. Both near +1: an induction head."""

    layer: int
    qk: Float[Tensor, " head"]
    ov: Float[Tensor, " head"]

    def corner(self, threshold: float = D.COPYING_EIGEN.value) -> list[int]:
        """Heads with both scores above ``threshold`` (the top-right corner of the scatter; by default
        the course's level for a positive-eigenvalue share, :data:`definitions.COPYING_EIGEN`)."""
        return [int(h) for h in torch.nonzero((self.qk > threshold) & (self.ov > threshold)).flatten()]


def induction_eigen_positivity(
    model: Transformer, layer: int = 1, writers: Sequence[int] | None = None
) -> InductionEigen:
    """The paper's QK-vs-OV scatter data for every head of ``layer`` (eigenvalues via ``BA``)."""
    layer, writers = _reader(model, layer, writers)
    qk = eigen_copying_score(_k_composition(model, slice(None), writers, layer).eigenvalues())
    ov = eigen_copying_score(ov_factors(model, layer, slice(None)).eigenvalues())
    return InductionEigen(layer, qk.float(), ov.float())
