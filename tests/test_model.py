"""The attention-only model: shapes, causality, a hand-written reference, interventions, bad input."""

import math

import numpy as np
import pytest
import torch

from attncircuits import ModelConfig, Transformer, loss_fn
from attncircuits.models.parts import sinusoidal_positions


def reference_forward(model, tokens):
    """Loop-by-loop forward pass written independently of model.py's einsums."""
    cfg = model.cfg
    n = tokens.shape[0]
    x = model.W_E[tokens]  # [pos, d_model]
    for block in model.blocks:
        qk_in = x + model.W_pos[:n]
        out = torch.zeros_like(x)
        for h in range(cfg.n_heads):
            q = qk_in @ block.W_Q[h]
            k = qk_in @ block.W_K[h]
            v = x @ block.W_V[h]
            for i in range(n):
                s = torch.stack([q[i] @ k[j] / math.sqrt(cfg.d_head) for j in range(i + 1)])
                a = torch.softmax(s, 0)
                z = sum(a[j] * v[j] for j in range(i + 1))
                out[i] += z @ block.W_O[h]
        x = x + out
    return x @ model.W_U


@pytest.mark.parametrize("n_layers", [0, 1, 2])
def test_shapes_and_cache(n_layers):
    cfg = ModelConfig(n_layers=n_layers, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16)
    model = Transformer(cfg)
    tokens = torch.randint(0, 50, (3, 10))
    logits, cache = model.run_with_cache(tokens)
    assert logits.shape == (3, 10, 50)
    assert len(cache.resid) == n_layers + 1 and cache.resid[0].shape == (3, 10, 32)
    assert len(cache.pattern) == n_layers
    for pat, out in zip(cache.pattern, cache.head_out):
        assert pat.shape == (3, 4, 10, 10)
        assert out.shape == (3, 10, 4, 32)
        torch.testing.assert_close(pat.sum(-1), torch.ones(3, 4, 10))
    torch.testing.assert_close(cache.resid[-1] @ model.W_U, logits)
    if n_layers:
        assert model.W_Q.shape == (n_layers, 4, 32, 8) and model.W_O.shape == (n_layers, 4, 8, 32)
    else:
        with pytest.raises(ValueError, match="no attention layers"):
            model.W_Q


def test_matches_reference(tiny_model):
    tokens = torch.randint(0, 50, (12,))
    with torch.no_grad():
        torch.testing.assert_close(tiny_model(tokens)[0], reference_forward(tiny_model, tokens), atol=1e-4, rtol=1e-4)


def test_causal_mask(tiny_model):
    tokens = torch.randint(0, 50, (1, 16))
    changed = tokens.clone()
    changed[0, 9:] = (changed[0, 9:] + 7) % 50
    with torch.no_grad():
        a, b = tiny_model(tokens), tiny_model(changed)
    torch.testing.assert_close(a[0, :9], b[0, :9])
    assert not torch.allclose(a[0, 9:], b[0, 9:])


def test_positions_enter_only_queries_and_keys(tiny_model):
    # the residual stream before layer 0 is the token embedding alone
    tokens = torch.tensor([[3, 3, 3, 3]])
    _, cache = tiny_model.run_with_cache(tokens)
    torch.testing.assert_close(cache.resid[0][0], tiny_model.W_E[3].expand(4, -1))
    # the values of identical tokens are identical at every position (no positions in V)...
    torch.testing.assert_close(cache.v[0][0, 0], cache.v[0][0, 3])
    # ...while the attention scores of the repeated token still differ by position (through Q/K)
    assert not torch.allclose(cache.attn_scores[0][0, :, 3, 0], cache.attn_scores[0][0, :, 3, 1])


def test_sinusoidal_positions():
    p = sinusoidal_positions(8, 6)
    assert p.shape == (8, 6)
    torch.testing.assert_close(p[0], torch.tensor([0.0, 1, 0, 1, 0, 1]))


def test_zero_ablation_removes_head_output(tiny_model):
    tokens = torch.randint(0, 50, (2, 10))
    logits, cache = tiny_model.run_with_cache(tokens)
    ablated = tiny_model(tokens, ablate={(1, 2): 0.0})
    expected = logits - cache.head_out[1][:, :, 2] @ tiny_model.W_U  # layer 1 is the last layer
    torch.testing.assert_close(ablated, expected, atol=1e-4, rtol=1e-4)


def test_pattern_replacement_with_own_pattern_is_identity(tiny_model):
    tokens = torch.randint(0, 50, (2, 10))
    logits, cache = tiny_model.run_with_cache(tokens)
    frozen = {(l, h): cache.pattern[l][:, h] for l in range(2) for h in range(4)}
    torch.testing.assert_close(tiny_model(tokens, patterns=frozen), logits)
    uniform = torch.tril(torch.ones(10, 10)) / torch.arange(1, 11)[:, None]
    _, c2 = tiny_model.run_with_cache(tokens, patterns={(0, 1): uniform.expand(2, 10, 10)})
    torch.testing.assert_close(c2.pattern[0][:, 1], uniform.expand(2, 10, 10))


def test_loss_fn_per_token():
    logits = torch.zeros(1, 4, 10)
    tokens = torch.tensor([[1, 2, 3, 4]])
    assert loss_fn(logits, tokens, per_token=True).shape == (1, 3)
    assert abs(loss_fn(logits, tokens).item() - math.log(10)) < 1e-6


@pytest.mark.parametrize(
    "tokens, err, match",
    [
        (torch.zeros(1, 17, dtype=torch.long), ValueError, "n_ctx=16"),
        (torch.tensor([[1, 50]]), ValueError, "outside the vocabulary"),
        (torch.tensor([[-1, 2]]), ValueError, "outside the vocabulary"),
        (torch.zeros(1, 0, dtype=torch.long), ValueError, "empty input"),
        (torch.zeros(1, 3), TypeError, "integer token ids"),
    ],
)
def test_bad_tokens(tiny_model, tokens, err, match):
    with pytest.raises(err, match=match):
        tiny_model(tokens)


def test_bad_head(tiny_model):
    with pytest.raises(IndexError, match="valid layers: 0..1"):
        tiny_model(torch.tensor([[1, 2]]), ablate={(2, 0): 0.0})
    with pytest.raises(IndexError, match="valid heads: 0..3"):
        tiny_model(torch.tensor([[1, 2]]), patterns={(0, 4): torch.ones(1, 2, 2)})


def test_bad_config():
    with pytest.raises(ValueError, match="d_model"):
        ModelConfig(d_model=0)
    with pytest.raises(ValueError, match="unknown config fields"):
        ModelConfig.from_dict({"n_layers": 1, "d_ff": 4})


def test_head_indices_are_ints_that_exist_and_never_wrap(tiny_model):
    tokens = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError, match="layer must be an int, got 0.5"):
        tiny_model(tokens, ablate={(0.5, 1.9): 0.0})  # once head (0, 1) after a deep error
    with pytest.raises(IndexError, match="head -1 does not exist; valid heads: 0..3"):
        tiny_model(tokens, ablate={(0, -1): 0.0})  # once head 3
    with pytest.raises(TypeError, match="head must be an int, got None"):
        tiny_model.check_head(0, None)
    with pytest.raises(TypeError, match="head must be an int, got '0'"):
        tiny_model.check_head(0, "0")
    tiny_model.check_head(np.int64(1), torch.tensor(3))  # numpy and 0-d tensor indices are fine


def test_loss_fn_refuses_one_token_rows_instead_of_nan():
    with pytest.raises(ValueError, match="a next-token loss needs at least 2"):
        loss_fn(torch.zeros(2, 1, 10), torch.zeros(2, 1, dtype=torch.long))


def test_large_logits_come_from_huge_pages_and_equal_the_plain_matmul():
    """`unembed` writes large logits into their own madvise'd memory: the same bits as ``@``, a
    fresh tensor at every call (no buffer shared between calls), plain ``@`` under autograd."""
    from attncircuits.models.parts import HUGE_PAGE_MIN_BYTES, unembed

    resid, W_U = torch.randn(8, 128, 64), torch.randn(64, 2048)
    assert resid.shape[0] * resid.shape[1] * W_U.shape[1] * 4 >= HUGE_PAGE_MIN_BYTES
    with torch.no_grad():
        a, b = unembed(resid, W_U), unembed(resid, W_U)
    assert torch.equal(a, resid @ W_U) and torch.equal(a, b)
    assert a.data_ptr() != b.data_ptr()
    a.zero_()  # the caller owns it: writing to one leaves the other as it was
    assert torch.equal(b, resid @ W_U)
    W = W_U.clone().requires_grad_()
    out = unembed(resid, W)
    out.sum().backward()  # autograd takes the plain path
    torch.testing.assert_close(W.grad, resid.sum((0, 1))[:, None].expand(-1, 2048), atol=1e-3, rtol=1e-4)
    small = unembed(resid[:1, :2], W_U)
    assert torch.equal(small, resid[:1, :2] @ W_U)


def test_head_outputs_are_computed_from_z_with_the_weights_of_the_pass(tiny_model):
    tokens = torch.randint(0, 50, (2, 12))
    logits, cache = tiny_model.run_with_cache(tokens)
    for layer, block in enumerate(tiny_model.blocks):
        expected = torch.einsum("bqhd,hdm->bqhm", cache.z[layer], block.W_O)
        torch.testing.assert_close(cache.head_out[layer], expected)
        torch.testing.assert_close(cache.head_out[layer].sum(2), cache.resid[layer + 1] - cache.resid[layer])
    _, cache = tiny_model.run_with_cache(tokens)
    with torch.no_grad():
        tiny_model.blocks[0].W_O.mul_(2)  # a later change of the weights ...
    try:
        expected = torch.einsum("bqhd,hdm->bqhm", cache.z[0], tiny_model.blocks[0].W_O / 2)
        torch.testing.assert_close(cache.head_out[0], expected)  # ... is not in this pass's cache
    finally:
        with torch.no_grad():
            tiny_model.blocks[0].W_O.div_(2)
    assert cache.head_out[0] is cache.head_out[0]  # computed once
