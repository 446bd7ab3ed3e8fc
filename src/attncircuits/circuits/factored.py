"""Factored matrices and the full OV / QK circuits of a head (chapter 3).

A head's circuits are products of thin matrices: the full OV circuit ``W_E W_V W_O W_U`` is
``[d_vocab, d_head] @ [d_head, d_vocab]``, rank at most ``d_head``. Kept as its two factors it costs
``2 * d_vocab * d_head`` numbers instead of ``d_vocab**2``, and most questions have a cheap answer
through the factors: eigenvalues come from the small ``d_head x d_head`` product ``B @ A``, the
Frobenius norm from two ``d_head x d_head`` Gram matrices, the SVD from two thin QR decompositions.
:class:`FactoredMatrix` keeps the factors and builds the dense product only when asked.

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
from einops import einsum, reduce
from jaxtyping import Complex, Float
from torch import Tensor

from .. import validate
from ..model import AttnOnlyTransformer

__all__ = [
    "DENSE_LIMIT_BYTES",
    "FactoredMatrix",
    "QKParts",
    "full_ov_circuit",
    "full_qk_circuit",
    "mean_attention_by_offset",
    "positional_attention",
    "positional_heads",
    "positional_qk_circuit",
    "qk_circuit_parts",
]

#: ``dense()`` refuses to build a product larger than this without ``allow_large=True``.
#: 32 MiB holds one head's ``d_vocab x d_vocab`` circuit at d_vocab 2048 (16 MiB), but not a whole
#: layer's (4 heads: 64 MiB) nor one head of a GPT-2-sized vocabulary (50257**2 floats = 9.4 GiB),
#: which is where an accidental dense product hurts.
DENSE_LIMIT_BYTES = 32 * 2**20


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


class FactoredMatrix:
    """The matrix ``M = A @ B`` kept as its factors ``A [..., m, k]`` and ``B [..., k, n]``.

    Leading dimensions are batch dimensions (one matrix per head, say) and broadcast as in
    ``torch.matmul``. ``k`` (``mdim``) is the inner, usually small, dimension: the rank is at most ``k``.
    """

    def __init__(self, A: Float[Tensor, "... m k"], B: Float[Tensor, "... k n"]):
        if A.ndim < 2 or B.ndim < 2:
            raise ValueError(f"factors must be at least 2-D, got shapes {tuple(A.shape)} and {tuple(B.shape)}")
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"inner dimensions do not match: A is {tuple(A.shape)}, B is {tuple(B.shape)}; "
                "A's last dimension must equal B's second-to-last"
            )
        self.A, self.B = A, B
        self.batch_shape = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])

    # ---- shape ------------------------------------------------------------------------------
    @property
    def ldim(self) -> int:
        return self.A.shape[-2]

    @property
    def mdim(self) -> int:
        return self.A.shape[-1]

    @property
    def rdim(self) -> int:
        return self.B.shape[-1]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.batch_shape, self.ldim, self.rdim))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner dim {self.mdim})"

    # ---- algebra ----------------------------------------------------------------------------
    @property
    def T(self) -> FactoredMatrix:
        """``(AB)^T = B^T A^T``."""
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    def __matmul__(self, other) -> FactoredMatrix:
        """``(AB) @ X`` stays factored; for a FactoredMatrix ``X = CD`` the product keeps the
        smaller of the two inner dimensions: ``A (B C D)`` or ``(A B C) D``."""
        if isinstance(other, FactoredMatrix):
            mid = self.B @ other.A
            if other.mdim <= self.mdim:
                return FactoredMatrix(self.A @ mid, other.B)
            return FactoredMatrix(self.A, mid @ other.B)
        other = torch.as_tensor(other)
        if other.ndim == 1:
            return self.A @ (self.B @ other)  # a vector: just compute it
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other) -> FactoredMatrix:
        other = torch.as_tensor(other)
        if other.ndim == 1:
            return (other @ self.A) @ self.B
        return FactoredMatrix(other @ self.A, self.B)

    def __mul__(self, scalar: float) -> FactoredMatrix:
        if isinstance(scalar, Tensor) and scalar.numel() != 1:
            raise TypeError("a FactoredMatrix can only be multiplied by a scalar; use @ for matrix products")
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def __getitem__(self, idx) -> FactoredMatrix:
        """Index the batch dimensions, e.g. ``ov[head]``; rows/columns go through :meth:`restrict`."""
        if not self.batch_shape:
            raise IndexError(
                "this FactoredMatrix has no batch dimension to index; use .restrict(rows, cols) or .rows(ids)"
            )
        A = self.A.expand(*self.batch_shape, *self.A.shape[-2:])[idx]
        B = self.B.expand(*self.batch_shape, *self.B.shape[-2:])[idx]
        return FactoredMatrix(A, B)

    def restrict(self, rows=None, cols=None) -> FactoredMatrix:
        """The sub-matrix on the given row and column indices, still factored:
        ``M[rows][:, cols] = A[rows] @ B[:, cols]``."""
        A = self.A if rows is None else self.A[..., torch.as_tensor(rows, device=self.A.device), :]
        B = self.B if cols is None else self.B[..., :, torch.as_tensor(cols, device=self.B.device)]
        return FactoredMatrix(A, B)

    def centered(self, dim: int = -1) -> FactoredMatrix:
        """Subtract each row's mean (``dim=-1``) or each column's mean (``dim=-2``), still factored.

        Softmaxes ignore a constant shift, so the centered circuits are what the model "sees":
        ``M - mean_j M[:, j] = A (B - mean_j B[:, j])`` and ``M - mean_i M[i] = (A - mean_i A[i]) B``.
        """
        if dim in (-1, self.ndim - 1):
            return FactoredMatrix(self.A, self.B - self.B.mean(-1, keepdim=True))
        if dim in (-2, self.ndim - 2):
            return FactoredMatrix(self.A - self.A.mean(-2, keepdim=True), self.B)
        raise ValueError(f"dim must be -1 (rows) or -2 (columns), got {dim}")

    # ---- dense views, when asked ------------------------------------------------------------
    def dense_bytes(self) -> int:
        return math.prod(self.shape) * self.A.element_size()

    def dense(self, allow_large: bool = False, max_bytes: int = DENSE_LIMIT_BYTES) -> Float[Tensor, "... m n"]:
        """The full product ``A @ B``; refuses products larger than ``max_bytes`` unless ``allow_large``."""
        need = self.dense_bytes()
        if need > max_bytes and not allow_large:
            raise MemoryError(
                f"the dense {'x'.join(map(str, self.shape))} product would take {_fmt_bytes(need)} "
                f"(limit {_fmt_bytes(max_bytes)}); pass allow_large=True to build it anyway, or use the "
                "factored methods (rows, restrict, topk, eigenvalues, svd, norm) that never build it"
            )
        return self.A @ self.B

    @property
    def AB(self) -> Float[Tensor, "... m n"]:
        """The dense product, with the same size guard as :meth:`dense`."""
        return self.dense()

    @property
    def BA(self) -> Float[Tensor, "... k k"]:
        """The small ``k x k`` product ``B @ A`` (needs a square matrix: ``m == n``)."""
        if self.ldim != self.rdim:
            raise ValueError(f"B @ A needs a square matrix, this one is {self.ldim} x {self.rdim}")
        return self.B @ self.A

    def rows(self, idx) -> Float[Tensor, "... r n"]:
        """Dense rows ``M[idx] = A[idx] @ B``."""
        return self.restrict(rows=idx).A @ self.B

    def cols(self, idx) -> Float[Tensor, "... m c"]:
        """Dense columns ``M[:, idx] = A @ B[:, idx]``."""
        return self.A @ self.restrict(cols=idx).B

    def diag(self) -> Float[Tensor, "... m"]:
        """``M[i, i] = A[i] . B[:, i]`` without the product."""
        n = min(self.ldim, self.rdim)
        return einsum(self.A[..., :n, :], self.B[..., :, :n], "... i k, ... k i -> ... i")

    # ---- reductions through the factors -------------------------------------------------------
    def norm(self) -> Float[Tensor, "*batch"]:
        """Frobenius norm: ``||AB||_F^2 = tr(B^T A^T A B) = sum((A^T A) * (B B^T))``, two k x k Grams."""
        gram_a = self.A.transpose(-2, -1) @ self.A
        gram_b = self.B @ self.B.transpose(-2, -1)
        return (gram_a * gram_b).sum((-2, -1)).clamp_min(0).sqrt()

    def mean(self) -> Float[Tensor, "*batch"]:
        """Mean entry: ``mean(AB) = mean_i(A[i]) . mean_j(B[:, j])``."""
        return einsum(self.A.mean(-2), self.B.mean(-1), "... k, ... k -> ...")

    def eigenvalues(self) -> Complex[Tensor, "... k"]:
        """The non-zero eigenvalues of ``AB`` (square): those of ``BA``, which is only ``k x k``.

        ``AB v = λ v`` with ``λ ≠ 0`` gives ``BA (Bv) = λ (Bv)`` and ``Bv ≠ 0``, so the two products
        share their non-zero spectrum; ``AB`` only adds ``m - k`` zeros.
        """
        return torch.linalg.eigvals(self.BA.to(torch.float64)).to(torch.complex64)

    def svd(self) -> tuple[Float[Tensor, "... m k"], Float[Tensor, "... k"], Float[Tensor, "... n k"]]:
        """Thin SVD ``AB = U diag(S) V^T`` through the factors.

        ``A = Q_A R_A`` and ``B^T = Q_B R_B`` (thin QR), so ``AB = Q_A (R_A R_B^T) Q_B^T`` and the SVD of
        the small middle ``k x k`` matrix ``U' S V'^T`` gives ``U = Q_A U'``, ``V = Q_B V'``.
        Returns ``U, S, V`` (V, not V^T, as in TransformerLens).
        """
        qa, ra = torch.linalg.qr(self.A)
        qb, rb = torch.linalg.qr(self.B.transpose(-2, -1))
        u, s, vh = torch.linalg.svd(ra @ rb.transpose(-2, -1))
        return qa @ u, s, qb @ vh.transpose(-2, -1)

    # ---- top entries without the whole product ---------------------------------------------------
    def _row_blocks(self, block_rows: int | None):
        per_row = math.prod(self.batch_shape) * self.rdim * self.A.element_size()
        block_rows = block_rows or max(1, (16 * 2**20) // max(per_row, 1))  # ~16 MiB per block
        for start in range(0, self.ldim, block_rows):
            stop = min(start + block_rows, self.ldim)
            yield start, self.A[..., start:stop, :] @ self.B

    def topk_per_row(self, k: int, largest: bool = True, block_rows: int | None = None):
        """The ``k`` largest (or smallest) entries of every row, built a block of rows at a time.

        Returns ``(values, cols)``, each ``[..., m, k]``. Peak memory is one block (~16 MiB), not ``m x n``.
        """
        k = min(k, self.rdim)
        vals, idx = [], []
        for _, block in self._row_blocks(block_rows):
            v, i = block.topk(k, dim=-1, largest=largest)
            vals.append(v)
            idx.append(i)
        return torch.cat(vals, -2), torch.cat(idx, -2)

    def topk_per_col(self, k: int, largest: bool = True, block_rows: int | None = None):
        """The ``k`` largest (or smallest) entries of every column: ``(values, rows)``, each ``[..., k, n]``."""
        v, i = self.T.topk_per_row(k, largest, block_rows)
        return v.transpose(-2, -1), i.transpose(-2, -1)

    def topk(self, k: int, largest: bool = True, block_rows: int | None = None):
        """The ``k`` largest (or smallest) entries of the whole matrix (per batch element).

        Returns ``(values, rows, cols)``, each ``[..., k]``, best first. Blocks of rows are reduced to
        their own top ``k`` as they are built, so the product never exists in full.
        """
        k = min(k, self.ldim * self.rdim)
        best_v, best_i = None, None
        for start, block in self._row_blocks(block_rows):
            flat = block.flatten(-2)
            v, i = flat.topk(min(k, flat.shape[-1]), dim=-1, largest=largest)
            i = i + start * self.rdim
            if best_v is not None:  # merge this block's best with the running best
                v, i = torch.cat([best_v, v], -1), torch.cat([best_i, i], -1)
                v, j = v.topk(min(k, v.shape[-1]), dim=-1, largest=largest)
                i = i.gather(-1, j)
            best_v, best_i = v, i
        return best_v, best_i // self.rdim, best_i % self.rdim


# ------------------------------------------------------------------------------------------------
# The circuits of a head
# ------------------------------------------------------------------------------------------------
def _checked(model: AttnOnlyTransformer, layer: int, head: int | None) -> tuple[int, slice | int]:
    """The layer and head (``None``: every head, a slice) of a public call, checked once."""
    validate.depth(model, "heads")
    layer = validate.layer(model, layer)
    return layer, slice(None) if head is None else validate.head(model, head)


def _ov(model: AttnOnlyTransformer, layer: int, h: slice | int) -> FactoredMatrix:
    """:func:`full_ov_circuit` for a checked layer and head (callers that checked them already)."""
    blk = model.blocks[layer]
    with torch.no_grad():
        return FactoredMatrix(model.W_E @ blk.W_V[h], blk.W_O[h] @ model.W_U)


def full_ov_circuit(model: AttnOnlyTransformer, layer: int, head: int | None = None) -> FactoredMatrix:
    """``W_E W_V^h W_O^h W_U``: row = source token attended to, column = output logit it raises.

    Factored as ``(W_E W_V) [d_vocab, d_head] @ (W_O W_U) [d_head, d_vocab]``. ``head=None`` gives all
    heads of the layer at once, ``[n_heads, d_vocab, d_vocab]``.
    """
    return _ov(model, *_checked(model, layer, head))


def _qk(model, layer: int, h: slice | int, left: Tensor, right: Tensor) -> FactoredMatrix:
    """A QK circuit part for a checked layer and head, ``left`` and ``right`` the query and key inputs."""
    blk = model.blocks[layer]
    scale = 1 / math.sqrt(model.cfg.d_head)
    with torch.no_grad():
        return FactoredMatrix(left @ blk.W_Q[h] * scale, (right @ blk.W_K[h]).transpose(-2, -1))


def full_qk_circuit(model: AttnOnlyTransformer, layer: int, head: int | None = None) -> FactoredMatrix:
    """``W_E W_Q^h (W_E W_K^h)^T / sqrt(d_head)``: the token-token part of the attention score.

    Row = destination (query) token, column = source (key) token; an entry is the score the head
    adds before its softmax when the destination token looks at the source token.
    """
    return _qk(model, *_checked(model, layer, head), model.W_E, model.W_E)


def positional_qk_circuit(model: AttnOnlyTransformer, layer: int, head: int | None = None) -> FactoredMatrix:
    """``W_pos W_Q^h (W_pos W_K^h)^T / sqrt(d_head)``: the position-position part of the score,
    ``[n_ctx (query position), n_ctx (key position)]``; it makes previous- and current-token heads."""
    return _qk(model, *_checked(model, layer, head), model.W_pos, model.W_pos)


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


def qk_circuit_parts(model: AttnOnlyTransformer, layer: int, head: int | None = None) -> QKParts:
    """All four parts of the QK circuit (positions enter only the queries and keys)."""
    layer, h = _checked(model, layer, head)
    E, P = model.W_E, model.W_pos
    return QKParts(
        token_token=_qk(model, layer, h, E, E),
        token_pos=_qk(model, layer, h, E, P),
        pos_token=_qk(model, layer, h, P, E),
        pos_pos=_qk(model, layer, h, P, P),
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


def positional_attention(model: AttnOnlyTransformer, layer: int, n_pos: int | None = None) -> Float[Tensor, "head q k"]:
    """The pattern each head would have from positions alone: the causal softmax of its
    position-position scores (token parts left out), ``[n_heads, n_pos, n_pos]``."""
    layer, h = _checked(model, layer, None)
    n_pos = validate.count(model.cfg.n_ctx if n_pos is None else n_pos, "n_pos", 1, model.cfg.n_ctx, why="the model's n_ctx")
    scores = _qk(model, layer, h, model.W_pos, model.W_pos).restrict(range(n_pos), range(n_pos)).dense()
    mask = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def positional_heads(
    model: AttnOnlyTransformer, layer: int, threshold: float = 0.5, window: int = 3, n_pos: int | None = None
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
