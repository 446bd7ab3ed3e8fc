"""Copying heads, read from the OV circuit: its eigenvalues and its top-1 "copies itself" (ch. 4, 6).

A head copies when attending to a token raises that same token's logit: its OV circuit has mostly
positive eigenvalues. The paper summarises this as ``Σλ / Σ|λ|`` ∈ [−1, 1], computed from the
``d_head x d_head`` product (see :meth:`FactoredMatrix.eigenvalues`); :func:`copying_summary` adds
a shuffled baseline and the two alternatives the paper mentions, and :func:`ov_copying_accuracy`
asks how often a token's largest output is the token itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Complex, Float, Int
from torch import Tensor

from attncircuits.analysis import definitions as D
from attncircuits.analysis.circuits.factored import ov_factors
from attncircuits.analysis.circuits.factored_matrix import FactoredMatrix
from attncircuits.core import validate
from attncircuits.models.transformer import Transformer

__all__ = ["CopyingSummary", "copying_summary", "eigen_copying_score", "ov_copying_accuracy"]


def eigen_copying_score(eigenvalues: Complex[Tensor, "... k"]) -> Float[Tensor, "*batch"]:
    """The paper's summary ``Σλ / Σ|λ|`` ∈ [−1, 1]: +1 when all eigenvalues are positive reals (copying),
    −1 when all are negative (anti-copying), near 0 when they spread around the circle."""
    return eigenvalues.sum(-1).real / eigenvalues.abs().sum(-1)


@dataclass
class CopyingSummary:
    """Per head of one layer: the eigenvalue summary and the two alternatives the paper mentions."""

    layer: int
    eigenvalues: Complex[Tensor, "head d_head"]  # of the OV circuit with W_U centred over the vocabulary
    eigen_score: Float[Tensor, " head"]  # Σλ / Σ|λ| of those
    eigen_score_raw: Float[Tensor, " head"]  # Σλ / Σ|λ| without centring (the shared logit shift included)
    shuffled_max: Float[Tensor, " head"]  # max |Σλ/Σ|λ|| with the output tokens shuffled (no copying possible)
    diagonal_z: Float[Tensor, " head"]  # mean over tokens of (OV[t, t] − row mean) / row std
    self_topk: Float[Tensor, " head"]  # fraction of tokens whose own logit is in their row's top k
    k: int

    @property
    def copying(self) -> Int[Tensor, " head"]:
        """Heads that copy (:data:`attncircuits.analysis.definitions.COPYING_EIGEN`, the course's one
        definition): a summary at the level of a copying head and beyond every shuffled one."""
        return (D.COPYING_EIGEN.holds(self.eigen_score) & (self.eigen_score > self.shuffled_max)).long()

    @property
    def n_copying(self) -> int:
        return int(self.copying.sum())


@torch.no_grad()
def copying_summary(
    model: Transformer,
    layer: int,
    k: int = 10,
    tokens: Int[Tensor, " n"] | None = None,
    n_shuffles: int = 50,
    seed: int = 0,
) -> CopyingSummary:
    """Eigenvalue copying scores of every head of ``layer``, with a shuffled baseline and the two
    alternatives: the diagonal of the OV circuit and top-``k`` self-prediction.

    Centring: a softmax ignores a shift shared by all logits, so each OV row is centred over the
    outputs (``W_U`` minus its mean column, as TransformerLens does by default) before the
    eigenvalues are taken. Without it, the direction shared by all embeddings maps onto the one
    shared by all unembeddings and adds a large eigenvalue that moves every logit alike
    (``eigen_score_raw`` keeps that version for comparison). Significance: shuffling the output tokens
    keeps every norm but makes "output the same token" meaningless, so a head copies if its summary
    beats the largest ``|Σλ/Σ|λ||`` over ``n_shuffles`` shuffles. Everything goes through the factors:
    eigenvalues from the ``d_head x d_head`` product, the diagonal and row statistics from ``A``, ``B`` and
    ``B Bᵀ``, the top-``k`` a block of rows at a time.
    """
    validate.depth(model, "OV circuits")
    layer, k = validate.layer(model, layer), validate.count(k, "k")
    n_shuffles, tokens = validate.count(n_shuffles, "n_shuffles", 0), (None if tokens is None else validate.token_ids(tokens, model.cfg.d_vocab, "tokens", ndim=1, allow_empty=False))
    raw = ov_factors(model, layer, slice(None))
    ov = raw.centered(-1)
    if tokens is not None:
        raw, ov = raw.restrict(tokens, tokens), ov.restrict(tokens, tokens)
    eig = ov.eigenvalues()
    score = eigen_copying_score(eig)
    score_raw = eigen_copying_score(raw.eigenvalues())
    g = torch.Generator().manual_seed(seed)
    shuffled = []
    for _ in range(n_shuffles):
        perm = torch.randperm(ov.rdim, generator=g)
        shuffled.append(eigen_copying_score(FactoredMatrix(ov.A, ov.B[..., perm]).eigenvalues()).abs())
    shuffled_max = torch.stack(shuffled).max(0).values if shuffled else torch.zeros_like(score)
    # diagonal z-score: row mean and mean square through the factors
    n = ov.rdim
    row_mean = ov.A @ ov.B.mean(-1, keepdim=True)  # [H, V, 1]
    row_sq = ((ov.A @ (ov.B @ ov.B.transpose(-2, -1))) * ov.A).sum(-1, keepdim=True) / n
    row_std = (row_sq - row_mean**2).clamp_min(1e-12).sqrt()
    diag_z = ((ov.diag()[..., None] - row_mean) / row_std)[..., 0].mean(-1)
    _, top = ov.topk_per_row(k)
    self_topk = (top == torch.arange(ov.ldim)[:, None]).any(-1).float().mean(-1)
    return CopyingSummary(layer, eig, score, score_raw, shuffled_max, diag_z, self_topk, k)


@torch.no_grad()
def ov_copying_accuracy(model: Transformer, heads) -> float:
    """Fraction of tokens whose largest output logit, in the summed full OV circuit
    ``W_E (Σ_h W_V^h W_O^h) W_U`` of ``heads`` (a ``(layer, head)`` pair or a list of them), is the
    token itself: top-1 "copies itself"."""
    heads = validate.heads(model, heads)
    if not heads:
        raise ValueError("heads is empty; pass at least one (layer, head) pair")
    ov = sum(model.blocks[l].W_V[h] @ model.blocks[l].W_O[h] for l, h in heads)
    top = torch.cat([(model.W_E[i : i + 512] @ ov @ model.W_U).argmax(-1) for i in range(0, model.cfg.d_vocab, 512)])
    return float((top == torch.arange(model.cfg.d_vocab, device=top.device)).float().mean())
