"""The factored matrix: a product ``A @ B`` of thin matrices kept as its two factors.

A head's circuits are products of thin matrices: the full OV circuit ``W_E W_V W_O W_U`` is
``[d_vocab, d_head] @ [d_head, d_vocab]``, rank at most ``d_head``. Kept as its two factors it costs
``2 * d_vocab * d_head`` numbers instead of ``d_vocab**2``, and most questions have a cheap answer
through the factors: eigenvalues come from the small ``d_head x d_head`` product ``B @ A``, the
Frobenius norm from two ``d_head x d_head`` Gram matrices, the SVD from two thin QR decompositions.
:class:`FactoredMatrix` keeps the factors and builds the dense product only when asked. It knows
nothing of models (TransformerLens, too, keeps its own in a module of its own); the circuits that
build one from a model's weights are in :mod:`.factored`.
"""

from __future__ import annotations

import math

import torch
from einops import einsum
from jaxtyping import Complex, Float
from torch import Tensor

__all__ = ["DENSE_LIMIT_BYTES", "FactoredMatrix"]

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
