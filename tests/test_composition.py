"""Composition scores, the 2-layer path expansion, virtual heads and term importance (chapter 5)."""

import math

import pytest
import torch

from attncircuits import ModelConfig, Transformer, loss_fn
from attncircuits.analysis.circuits import (
    composition_score,
    composition_scores,
    random_composition_baseline,
    term_importance,
    two_layer_path_expansion,
    virtual_head_pattern,
    virtual_ov_circuit,
)


def zero_model(n_layers=2, d_model=16, n_heads=2, d_head=4):
    cfg = ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_head, d_vocab=20, n_ctx=8)
    model = Transformer(cfg)
    with torch.no_grad():
        for b in model.blocks:
            for w in (b.W_Q, b.W_K, b.W_V, b.W_O):
                w.zero_()
    return model


def e(i, n=16):
    return torch.eye(n)[i]


def hand_built(reader_side: str):
    """Layer-0 head 0 reads direction 3 and writes direction 5. Layer-1 head 0 reads direction 5
    through one side only (``'q'``, ``'k'`` or ``'v'``); its other inputs read directions 7 and 9.
    Every head is rank one, so the perfect pair scores exactly 1."""
    model = zero_model()
    with torch.no_grad():
        b0, b1 = model.blocks
        b0.W_V[0, :, 0] = e(3)
        b0.W_O[0, 0] = e(5)
        b1.W_Q[0, :, 0] = e(5) if reader_side == "q" else e(7)
        b1.W_K[0, :, 0] = e(5) if reader_side == "k" else e(9)
        b1.W_V[0, :, 0] = e(5) if reader_side == "v" else e(7)
        b1.W_O[0, 0] = e(11)
    return model


@pytest.mark.parametrize("side", ["q", "k", "v"])
def test_hand_built_pair_composes_through_one_side_only(side):
    """A pair that composes perfectly through one input scores 1 there and 0 on the other two:
    this pins the product order (the paper's first version had Q and K permuted)."""
    model = hand_built(side)
    for kind in "qkv":
        s = composition_score(model, kind, writer=(0, 0), reader=(1, 0))
        assert s == pytest.approx(1.0 if kind == side else 0.0, abs=1e-6), (kind, s)
    scores = composition_scores(model)
    for kind in "qkv":
        assert scores[kind][0, 0] == pytest.approx(1.0 if kind == side else 0.0, abs=1e-6)


def test_orthogonal_subspaces_score_zero():
    """Layer-0 head 0 writes dims 0..7 (random), layer-1 heads read dims 8..15 only (random): ~0."""
    model = zero_model(n_heads=1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        b0, b1 = model.blocks
        b0.W_V[0] = torch.randn(16, 4, generator=g)
        b0.W_O[0, :, :8] = torch.randn(4, 8, generator=g)
        for w in (b1.W_Q, b1.W_K, b1.W_V):
            w[0, 8:] = torch.randn(8, 4, generator=g)
        b1.W_O[0] = torch.randn(4, 16, generator=g)
    scores = composition_scores(model)
    for kind in "qkv":
        assert scores[kind].abs().max() < 1e-6


def dense_score(a, b):
    return float((a @ b).norm() / (a.norm() * b.norm()))


def test_scores_match_dense_products(tiny_model):
    """Factored scores equal the dense d_model x d_model formula, for every pair and kind."""
    s = composition_scores(tiny_model)
    b0, b1 = tiny_model.blocks
    for w in range(tiny_model.cfg.n_heads):
        ov0 = (b0.W_V[w] @ b0.W_O[w]).detach().double()
        for r in range(tiny_model.cfg.n_heads):
            qk1 = (b1.W_Q[r] @ b1.W_K[r].T).detach().double()
            ov1 = (b1.W_V[r] @ b1.W_O[r]).detach().double()
            assert s.q[w, r] == pytest.approx(dense_score(ov0, qk1), rel=1e-5)
            assert s.k[w, r] == pytest.approx(dense_score(ov0, qk1.T), rel=1e-5)
            assert s.v[w, r] == pytest.approx(dense_score(ov0, ov1), rel=1e-5)
            assert composition_score(tiny_model, "k", (0, w), (1, r)) == pytest.approx(float(s.k[w, r]), rel=1e-6)


def test_random_baseline_is_measured_and_near_one_over_sqrt_d_model():
    base = random_composition_baseline(d_model=64, d_head=8, n_samples=200, seed=0)
    for kind in "qkv":
        assert base.samples[kind].shape == (200,)
        assert 0.7 / math.sqrt(64) < base.mean(kind) < 1.3 / math.sqrt(64)
        assert 0 < base.std(kind) < 0.5 * base.mean(kind)
    # scale-free: the same draws at another scale give the same scores
    scaled = random_composition_baseline(64, 8, 200, seed=0, scales={"W_V": 7.0, "W_K": 0.01})
    torch.testing.assert_close(scaled.samples["k"], base.samples["k"], rtol=1e-4, atol=1e-6)


def test_random_model_scores_sit_at_the_baseline():
    """An untrained model's heads compose only by chance: its scores look like the baseline's."""
    torch.manual_seed(3)
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=8, d_head=8, d_vocab=50, n_ctx=16)
    s = composition_scores(Transformer(cfg), n_baseline=400)
    for kind in "qkv":
        assert abs(float(s[kind].mean()) - s.baseline.mean(kind)) < 3 * s.baseline.std(kind)
        assert s.excess(kind).shape == (8, 8)
        assert s.z(kind).abs().max() < 6
    top = s.top("k", 3)
    assert len(top) == 3 and top[0][0][0] == 0 and top[0][1][0] == 1 and top[0][2] >= top[1][2] >= top[2][2]


def test_path_expansion_equals_forward(tiny_model):
    tokens = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(0))
    logits, cache = tiny_model.run_with_cache(tokens)
    paths = two_layer_path_expansion(tiny_model, tokens)
    torch.testing.assert_close(paths.logits(), logits, atol=1e-4, rtol=1e-4)
    # each part against the model's own cache
    torch.testing.assert_close(paths.layer0, cache.head_out[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(paths.layer1 + paths.virtual.sum(2), cache.head_out[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(paths.direct, cache.resid[0])
    assert paths.virtual.shape == (3, 16, 4, 4, 32)
    sizes = paths.logit_sizes()
    assert sizes["virtual"].shape == (4, 4) and sizes["layer1"].shape == (4,) and sizes["direct"].ndim == 0


def test_virtual_head_is_a_head_with_the_product_pattern_and_ov(tiny_model):
    """Virtual head b∘a: pattern A^{1,b} A^{0,a}, OV circuit W_OV^{0,a} W_OV^{1,b}."""
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    _, cache = tiny_model.run_with_cache(tokens)
    paths = two_layer_path_expansion(tiny_model, tokens, cache=cache)
    b0, b1 = tiny_model.blocks
    a, b = 2, 1
    with torch.no_grad():
        ov = b0.W_V[a] @ b0.W_O[a] @ b1.W_V[b] @ b1.W_O[b]
        expect = virtual_head_pattern(cache, a, b) @ (tiny_model.W_E[tokens] @ ov)
        torch.testing.assert_close(paths.virtual[:, :, a, b], expect, atol=1e-5, rtol=1e-5)
        full = virtual_ov_circuit(tiny_model, a, b)
        torch.testing.assert_close(full.dense(), tiny_model.W_E @ ov @ tiny_model.W_U, atol=1e-4, rtol=1e-4)
    pat = virtual_head_pattern(cache, a, b)
    torch.testing.assert_close(pat.sum(-1), torch.ones(2, 12))  # a product of causal patterns is one
    assert torch.all(pat.triu(1) == 0)


def test_term_importance_against_frozen_pattern_forward_passes(tiny_model):
    """Each loss equals a forward pass of the model with frozen patterns and ablated heads."""
    tokens = torch.randint(0, 50, (5, 16), generator=torch.Generator().manual_seed(2))
    ti = term_importance(tiny_model, tokens, batch_size=2)  # batches of 2, 2, 1 rows
    n_heads = tiny_model.cfg.n_heads
    with torch.no_grad():
        logits, cache = tiny_model.run_with_cache(tokens)
        frozen = {(l, h): cache.pattern[l][:, h] for l in range(2) for h in range(n_heads)}
        no_layer0 = {(0, h): 0.0 for h in range(n_heads)}
        no_layer1 = {(1, h): 0.0 for h in range(n_heads)}
        # layer-0 heads ablated, patterns frozen: layer-1 values read the embedding only
        layer1_only = tiny_model(tokens, patterns=frozen, ablate=no_layer0)
        layer0_out = cache.head_out[0].sum(2) @ tiny_model.W_U
        expect = {
            "direct": loss_fn(tiny_model.W_E[tokens] @ tiny_model.W_U, tokens),
            "direct_layer0": loss_fn(tiny_model(tokens, ablate=no_layer1), tokens),
            "direct_layer1": loss_fn(layer1_only, tokens),
            "first_order": loss_fn(layer1_only + layer0_out, tokens),
            "full": loss_fn(logits, tokens),
        }
    for key, val in expect.items():
        assert getattr(ti, key) == pytest.approx(float(val), abs=1e-4), key
    assert ti.n_tokens == 5 * 15
    assert ti.uniform == pytest.approx(math.log(50))
    assert ti.gain_direct + ti.gain_single + ti.gain_virtual == pytest.approx(ti.uniform - ti.full)
    assert ti.gain_layer(0) == pytest.approx(ti.direct - ti.direct_layer0)
    assert ti.gain_layer(1, last=True) == pytest.approx(ti.direct_layer0 - ti.first_order)
    assert [r[0] for r in ti.rows()][:3] == ["direct path (vs uniform)", "+ single-head terms", "+ virtual-head terms"]


# ---- bad input ---------------------------------------------------------------------------------
def test_writer_must_come_before_reader(tiny_model):
    with pytest.raises(ValueError, match="earlier layer.*writer=\\(0, h1\\)"):
        composition_score(tiny_model, "k", writer=(1, 0), reader=(1, 2))
    with pytest.raises(ValueError, match="earlier layer"):
        composition_score(tiny_model, "q", writer=(1, 0), reader=(0, 2))
    with pytest.raises(ValueError, match="writer_layer=1 must come before reader_layer=1"):
        composition_scores(tiny_model, writer_layer=1, reader_layer=1)
    with pytest.raises(IndexError, match="valid heads: 0..3"):
        composition_score(tiny_model, "v", writer=(0, 9), reader=(1, 0))
    with pytest.raises(IndexError, match="reader_layer 2 does not exist"):
        composition_scores(tiny_model, reader_layer=2)
    with pytest.raises(ValueError, match="use 'q', 'k' or 'v'"):
        composition_score(tiny_model, "o", writer=(0, 0), reader=(1, 0))
    with pytest.raises(IndexError):
        virtual_ov_circuit(tiny_model, writer=0, reader=4)


@pytest.mark.parametrize("n_layers", [0, 1])
def test_fewer_than_two_layers_is_a_clear_error(n_layers):
    model = zero_model(n_layers=n_layers)
    tokens = torch.zeros(1, 4, dtype=torch.long)
    for call in (
        lambda: composition_scores(model),
        lambda: composition_score(model, "k", (0, 0), (1, 0)),
        lambda: two_layer_path_expansion(model, tokens),
        lambda: term_importance(model, tokens),
        lambda: virtual_ov_circuit(model, 0, 0),
    ):
        with pytest.raises(ValueError, match="needs two layers.*attn-only-2l"):
            call()


def test_expansion_refuses_three_layers_and_short_input():
    model = zero_model(n_layers=3)
    assert composition_scores(model, writer_layer=0, reader_layer=2).k.shape == (2, 2)  # any earlier/later pair
    with pytest.raises(ValueError, match="exactly two layers"):
        two_layer_path_expansion(model, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="term importance .*needs at least 2"):
        term_importance(zero_model(), torch.zeros(1, 1, dtype=torch.long))


def test_virtual_head_indices_never_wrap(tiny_model):
    _, cache = tiny_model.run_with_cache(torch.randint(0, 50, (1, 6)))
    with pytest.raises(IndexError, match="writer -1 does not exist; valid heads: 0..3"):
        virtual_head_pattern(cache, writer=-1, reader=0)  # once head 3
    with pytest.raises(TypeError, match="reader must be an int, got 1.9"):
        virtual_head_pattern(cache, writer=0, reader=1.9)  # once head 1
    with pytest.raises(TypeError, match="writer must be an int, got 0.5"):
        virtual_ov_circuit(tiny_model, 0.5, 1)
    with pytest.raises(TypeError, match=r"writer must be a \(layer, head\) pair of ints, got 0"):
        composition_score(tiny_model, "q", 0, (1, 0))
    with pytest.raises(TypeError, match="reader must be an int, got None"):
        composition_score(tiny_model, "q", (0, 1), (1, None))
