"""FactoredMatrix and the full circuits, each checked against the dense computation on a small vocabulary."""

import math

import pytest
import torch

from attncircuits import ModelConfig, Transformer
from attncircuits.analysis.circuits.factored import (
    full_ov_circuit,
    full_qk_circuit,
    mean_attention_by_offset,
    positional_attention,
    positional_heads,
    positional_qk_circuit,
    qk_circuit_parts,
)
from attncircuits.analysis.circuits.factored_matrix import FactoredMatrix


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16))


@pytest.fixture
def fm():
    g = torch.Generator().manual_seed(1)
    return FactoredMatrix(torch.randn(3, 40, 6, generator=g), torch.randn(3, 6, 40, generator=g))


def test_shape_and_dense(fm):
    assert fm.shape == (3, 40, 40) and fm.mdim == 6
    torch.testing.assert_close(fm.dense(), fm.A @ fm.B)
    torch.testing.assert_close(fm.T.dense(), (fm.A @ fm.B).transpose(-2, -1))
    torch.testing.assert_close(fm[1].dense(), fm.A[1] @ fm.B[1])


def test_rows_cols_diag_restrict(fm):
    M = fm.dense()
    torch.testing.assert_close(fm.rows([3, 7]), M[:, [3, 7]])
    torch.testing.assert_close(fm.cols([0, 39]), M[:, :, [0, 39]])
    torch.testing.assert_close(fm.diag(), M.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(fm.restrict([1, 2], [5, 6, 7]).dense(), M[:, [1, 2]][:, :, [5, 6, 7]])


def test_centered(fm):
    M = fm.dense()
    torch.testing.assert_close(fm.centered(-1).dense(), M - M.mean(-1, keepdim=True), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fm.centered(-2).dense(), M - M.mean(-2, keepdim=True), atol=1e-5, rtol=1e-5)


def test_norm_and_mean(fm):
    M = fm.dense()
    torch.testing.assert_close(fm.norm(), torch.linalg.matrix_norm(M), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(fm.mean(), M.mean((-2, -1)), rtol=1e-4, atol=1e-5)


def test_eigenvalues_match_dense(fm):
    dense = torch.linalg.eigvals(fm.dense().double())
    for b in range(3):
        ours = fm.eigenvalues()[b]
        big = dense[b][dense[b].abs().argsort(descending=True)][: fm.mdim]  # the rest are ~0
        # same multiset: match each of ours to its nearest dense eigenvalue
        dist = (ours[:, None].to(torch.complex128) - big[None]).abs().min(-1).values
        assert dist.max() < 1e-3 * big.abs().max()
        assert dense[b].abs().sort(descending=True).values[fm.mdim :].max() < 1e-3


def test_svd_matches_dense(fm):
    U, S, V = fm.svd()
    torch.testing.assert_close(S, torch.linalg.svdvals(fm.dense())[:, : fm.mdim], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(U @ torch.diag_embed(S) @ V.transpose(-2, -1), fm.dense(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(U.transpose(-2, -1) @ U, torch.eye(fm.mdim).expand(3, -1, -1), atol=1e-4, rtol=0)


def test_matmul_keeps_factors(fm):
    g = torch.Generator().manual_seed(2)
    other = FactoredMatrix(torch.randn(40, 3, generator=g), torch.randn(3, 20, generator=g))
    prod = fm @ other
    assert isinstance(prod, FactoredMatrix) and prod.mdim == 3
    torch.testing.assert_close(prod.dense(), fm.dense() @ other.dense(), rtol=1e-4, atol=1e-3)
    X = torch.randn(40, 5, generator=g)
    torch.testing.assert_close((fm @ X).dense(), fm.dense() @ X, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close((X.T @ fm).dense(), X.T @ fm.dense(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close((2.0 * fm).dense(), 2 * fm.dense())


@pytest.mark.parametrize("block_rows", [1, 7, None])
def test_topk_matches_dense(fm, block_rows):
    M = fm.dense()
    v, r, c = fm.topk(10, block_rows=block_rows)
    ref = M.flatten(-2).topk(10, dim=-1).values
    torch.testing.assert_close(v, ref)
    torch.testing.assert_close(M[torch.arange(3)[:, None], r, c], v)
    v, r, c = fm.topk(5, largest=False, block_rows=block_rows)
    torch.testing.assert_close(v, M.flatten(-2).topk(5, dim=-1, largest=False).values)
    pv, _pi = fm.topk_per_row(4, block_rows=block_rows)
    torch.testing.assert_close(pv, M.topk(4, dim=-1).values)
    cv, ci = fm.topk_per_col(4, block_rows=block_rows)
    torch.testing.assert_close(cv, M.topk(4, dim=-2).values)
    torch.testing.assert_close(M.gather(-2, ci), cv)


def test_dense_size_guard_names_memory():
    big = FactoredMatrix(torch.zeros(50257, 2), torch.zeros(2, 50257))
    with pytest.raises(MemoryError, match=r"9\.4 GiB.*allow_large=True"):
        big.dense()
    with pytest.raises(MemoryError, match="allow_large"):
        _ = big.AB
    small = FactoredMatrix(torch.ones(4, 2), torch.ones(2, 4))
    with pytest.raises(MemoryError, match="64 B"):
        small.dense(max_bytes=32)
    assert small.dense(max_bytes=32, allow_large=True).shape == (4, 4)


def test_bad_factors():
    with pytest.raises(ValueError, match="inner dimensions"):
        FactoredMatrix(torch.zeros(3, 4), torch.zeros(5, 3))
    with pytest.raises(ValueError, match="square"):
        _ = FactoredMatrix(torch.zeros(3, 2), torch.zeros(2, 4)).BA
    with pytest.raises(IndexError, match="no batch dimension"):
        FactoredMatrix(torch.zeros(3, 2), torch.zeros(2, 4))[0]


def test_full_ov_circuit_matches_dense(model):
    for layer in range(2):
        ov = full_ov_circuit(model, layer)
        assert ov.shape == (4, 50, 50)
        blk = model.blocks[layer]
        for h in range(4):
            dense = model.W_E @ blk.W_V[h] @ blk.W_O[h] @ model.W_U
            torch.testing.assert_close(ov[h].dense(), dense.detach(), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(full_ov_circuit(model, layer, h).dense(), dense.detach(), rtol=1e-4, atol=1e-4)


def test_full_qk_circuit_is_the_attention_score(model):
    """Entry [d, s] of the token-token circuit plus the three positional parts is the model's score."""
    tokens = torch.tensor([[3, 17, 42, 8, 3, 11]])
    _, cache = model.run_with_cache(tokens)
    for layer in (0,):  # layer 0 reads the embedding only, so the score is exactly the four parts
        parts = qk_circuit_parts(model, layer)
        torch.testing.assert_close(parts.token_token.dense(), full_qk_circuit(model, layer).dense())
        torch.testing.assert_close(parts.pos_pos.dense(), positional_qk_circuit(model, layer).dense())
        scores = cache.attn_scores[layer][0]  # [head, q, k]
        for q, k in [(5, 0), (3, 2), (4, 4), (2, 1)]:
            s = parts.score(int(tokens[0, q]), q, int(tokens[0, k]), k)
            torch.testing.assert_close(s, scores[:, q, k], rtol=1e-4, atol=1e-4)
    blk = model.blocks[1]
    dense = (model.W_E @ blk.W_Q[2] @ (model.W_E @ blk.W_K[2]).T / math.sqrt(8)).detach()
    torch.testing.assert_close(full_qk_circuit(model, 1, 2).dense(), dense, rtol=1e-4, atol=1e-4)


def test_bad_head_and_layer(model):
    with pytest.raises(IndexError, match=r"valid layers: 0\.\.1"):
        full_ov_circuit(model, 2)
    with pytest.raises(IndexError, match=r"valid heads: 0\.\.3"):
        full_qk_circuit(model, 0, 4)
    with pytest.raises(IndexError, match="valid heads"):
        positional_qk_circuit(model, 0, -1)
    zero = Transformer(ModelConfig(n_layers=0, d_model=8, n_heads=2, d_head=4, d_vocab=10, n_ctx=4))
    with pytest.raises(ValueError, match="no attention layers"):
        full_ov_circuit(zero, 0)
    with pytest.raises(ValueError, match=r"n_pos must be in 1\.\.16"):
        positional_attention(model, 0, n_pos=17)


def test_mean_attention_by_offset():
    n = 5
    prev = torch.zeros(1, 2, n, n)
    prev[0, 0] = torch.eye(n)  # head 0: current token
    prev[0, 1, 0, 0] = 1
    prev[0, 1, torch.arange(1, n), torch.arange(n - 1)] = 1  # head 1: previous token
    prof = mean_attention_by_offset(prev, max_offset=2)
    torch.testing.assert_close(prof, torch.tensor([[1.0, 0.0, 0.0], [0.2, 1.0, 0.0]]))


def test_positional_heads_found_from_weights():
    """Plant a previous-token head and a current-token head in W_Q/W_K via W_pos; find both."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=32, d_vocab=20, n_ctx=32)
    m = Transformer(cfg)
    P = m.W_pos
    # P[i] @ shift ≈ P[i-1]. P has rank 12 here: the default QR driver's answer then depends on the
    # memory's alignment (residual 9e-6 or 1.16 for the same input); the SVD driver's does not.
    shift = torch.linalg.lstsq(P[1:], P[:-1], rcond=1e-5, driver="gelsd").solution
    with torch.no_grad():
        m.W_E.zero_()
        m.blocks[0].W_Q[0] = 40 * torch.eye(32)
        m.blocks[0].W_K[0] = torch.eye(32)  # current token: q_i . k_j largest at j = i
        m.blocks[0].W_Q[1] = 40 * shift
        m.blocks[0].W_K[1] = torch.eye(32)  # previous token: q_i ≈ P[i-1]
        m.blocks[0].W_Q[2] = 0.0  # uniform head
        m.blocks[0].W_Q[3] = 2.5 * (torch.eye(32) + shift)  # blurred: the current and the previous token
        m.blocks[0].W_K[3] = torch.eye(32)
    found = positional_heads(m, 0)
    assert found[0][0] == "current" and found[0][1] > 0.9
    assert found[1][0] == "previous" and found[1][1] > 0.9
    assert found[3][0] == "recent" and found[3][1] > 0.5
    assert 2 not in found
    with pytest.raises(ValueError, match="window must be at least 1"):
        positional_heads(m, 0, window=0)
    # and the pattern of the real forward pass agrees (W_E is zero, so positions are all there is)
    _, cache = m.run_with_cache(torch.arange(32)[None] % 20)
    torch.testing.assert_close(cache.pattern[0][0], positional_attention(m, 0), rtol=1e-4, atol=1e-5)
