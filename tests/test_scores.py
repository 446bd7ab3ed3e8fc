"""scores.py and losses.py: behavioural scores, losses on repeated tokens and ablations.

The centre is a two-layer model whose weights are written by hand: a previous-token head that
finds the previous position through the sinusoidal positions in its QK circuit, and an induction
head whose keys read what the previous-token head wrote (K-composition). The scores must find it,
it must predict the second copy of a random sequence perfectly, ablating the previous-token head
must break it, and no one-layer model can do the same.
"""

import math

import numpy as np
import pytest
import torch

from attncircuits import ModelConfig, Transformer, loss_fn
from attncircuits.analysis.losses import (
    ablated_loss,
    ablation_effects,
    icl_positions,
    in_context_learning_score,
    pattern_preserving_ablation,
    per_position_loss,
    repeated_loss_curve,
    repeated_token_loss,
    repeated_tokens,
    zero_ablation,
)
from attncircuits.analysis.scores import (
    HeadScores,
    copying_scores,
    head_scores,
    prefix_match_targets,
    prefix_matching_mask,
    prefix_matching_scores,
    previous_token_scores,
    value_weighted_pattern,
)
from attncircuits.core import validate
from attncircuits.core.validate import max_repeat_len

# ----------------------------------------------------------------------------------------------
# The hand-built induction circuit
# ----------------------------------------------------------------------------------------------
V = 32  # vocabulary: one-hot token embeddings
P = 16  # sinusoid (sin, cos) pairs the previous-token head reads its positions from
TOK, PREV, OUT = (torch.arange(2 * P + i * V, 2 * P + (i + 1) * V) for i in range(3))  # residual blocks
EMBED = 10.0  # embedding scale: large next to the sinusoids (|pos| <= 1) that queries and keys also see


def hand_built_cfg(n_layers: int = 2) -> ModelConfig:
    return ModelConfig(n_layers=n_layers, d_model=2 * P + 3 * V, n_heads=2, d_head=V, d_vocab=V, n_ctx=64)


@torch.no_grad()
def hand_built_induction_model() -> Transformer:
    """Residual stream = [positions' dims | token | previous token | output], all one-hot blocks.

    L0H0 (previous-token head): its query is the position ``p_i`` and its key the position rotated
    one step forward, ``R p_j = p_{j+1}`` (each sin/cos pair rotates by its own frequency), so the
    score ``p_i · p_{j+1}`` peaks at ``j = i - 1``. Its OV copies the token block into the
    previous-token block. L1H0 (induction head): query = current token, key = previous-token block
    (K-composition with L0H0), OV copies the attended token into the output block, which is all
    the unembedding reads. The second head of each layer is all zeros (a head that does nothing).
    """
    cfg = hand_built_cfg()
    m = Transformer(cfg)
    for p in m.parameters():
        p.zero_()
    eye = torch.arange(V)
    m.W_E[eye, TOK] = EMBED
    b0, b1 = m.blocks
    freqs = torch.exp(-math.log(1e4) * torch.arange(0, cfg.d_model, 2).float() / cfg.d_model)[:P]
    for k, w in enumerate(freqs.tolist()):
        s, c = 2 * k, 2 * k + 1  # W_pos columns: sin in even, cos in odd dims
        b0.W_Q[0, s, s] = b0.W_Q[0, c, c] = 20.0
        # row vector [sin wj, cos wj] @ W_K = [sin w(j+1), cos w(j+1)]
        b0.W_K[0, s, s], b0.W_K[0, c, s] = math.cos(w), math.sin(w)
        b0.W_K[0, s, c], b0.W_K[0, c, c] = -math.sin(w), math.cos(w)
    b0.W_V[0, TOK, eye] = 1.0
    b0.W_O[0, eye, PREV] = 1.0
    b1.W_Q[0, TOK, eye] = 1.0
    b1.W_K[0, PREV, eye] = 1.0
    b1.W_V[0, TOK, eye] = 1.0
    b1.W_O[0, eye, OUT] = 1.0
    m.W_U[OUT, eye] = 3.0
    return m.eval()


def one_layer_from(model: Transformer) -> Transformer:
    """The same model without its previous-token layer: the induction head's weights, one layer."""
    one = Transformer(hand_built_cfg(1))
    sd = {k.replace("blocks.1.", "blocks.0."): v for k, v in model.state_dict().items() if not k.startswith("blocks.0.")}
    one.load_state_dict(sd)
    return one.eval()


def permuted_repeats(batch: int = 8, seq_len: int = 31, n_repeats: int = 2, seed: int = 0) -> torch.Tensor:
    """``[EOT]`` + copies of a sequence of *distinct* random tokens (so exactly one earlier match)."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.stack([torch.randperm(V - 1, generator=g)[:seq_len] + 1 for _ in range(batch)])
    return torch.cat([torch.zeros(batch, 1, dtype=torch.long), seq.repeat(1, n_repeats)], dim=1)


@pytest.fixture(scope="module")
def induction_model():
    return hand_built_induction_model()


def test_hand_built_previous_token_head_uses_positions(induction_model):
    toks = permuted_repeats()
    prev = previous_token_scores(induction_model, toks)
    assert prev[0, 0] > 0.99  # L0H0 attends to the previous position...
    assert prev[0, 1] < 0.1 and prev[1].max() < 0.1  # ...and no other head does
    # the same on text with a completely different token order: it reads positions, not tokens
    other = torch.randint(1, V, (4, 64), generator=torch.Generator().manual_seed(1))
    assert previous_token_scores(induction_model, other)[0, 0] > 0.99


def test_hand_built_induction_head_scores_one_on_prefix_matching(induction_model):
    pm = prefix_matching_scores(induction_model, seq_len=31, n_repeats=2, tokens=permuted_repeats())
    assert pm[1, 0] > 0.98
    assert pm[0].max() < 0.1 and pm[1, 1] < 0.1
    # Olsson's setting (random tokens, 4 copies): tokens repeat inside a copy with V=32, and the
    # token-based definition still counts every earlier occurrence, so the score stays ~1
    pm4 = prefix_matching_scores(induction_model, seq_len=15, n_repeats=4, batch_size=8)
    assert pm4[1, 0] > 0.95 and pm4[0, 0] < 0.1


def test_hand_built_model_predicts_the_second_copy(induction_model):
    toks = permuted_repeats()
    loss = per_position_loss(induction_model, toks)
    L = 31
    assert loss[L + 1 :].max() < 1e-3  # ~0 loss on every predictable token of the second copy
    assert loss[1:L].mean() > math.log(V) - 0.5  # the first copy is unpredictable
    # agrees with the plain loss of the model
    ref = loss_fn(induction_model(toks), toks, per_token=True).mean(0)
    torch.testing.assert_close(loss, ref)


def test_copying_scores_of_hand_built_heads(induction_model):
    cs = copying_scores(induction_model, seq_len=20, batch_size=4)
    assert cs[1, 0] > 0.99  # the induction head's OV maps each token to its own logit
    assert cs[0, 0].abs() < 1e-6  # the previous-token head writes nothing the unembedding reads
    # a head that suppresses the attended token scores -1
    neg = hand_built_induction_model()
    with torch.no_grad():
        neg.blocks[1].W_O.mul_(-1)
    assert copying_scores(neg, seq_len=20, batch_size=4)[1, 0] < -0.99


def test_zero_ablating_the_previous_token_head_breaks_induction(induction_model):
    toks = permuted_repeats()
    L = 31
    clean = ablated_loss(induction_model, toks, per_token=True)[:, L + 1 :].mean()
    no_prev = ablated_loss(induction_model, toks, (0, 0), per_token=True)[:, L + 1 :].mean()
    no_other = ablated_loss(induction_model, toks, (0, 1), per_token=True)[:, L + 1 :].mean()
    assert clean < 1e-3 and no_prev > math.log(V) - 0.5  # the induction behaviour collapses...
    assert no_other < 1e-3  # ...but not when another layer-0 head is ablated
    pm = prefix_matching_scores(induction_model, seq_len=L, n_repeats=2, tokens=toks)
    assert pm[1, 0] > 0.98
    # the prefix-matching attention is gone too: zero-ablated L0H0 leaves the keys blind
    logits, cache = induction_model.run_with_cache(toks, **zero_ablation(induction_model, (0, 0)))
    target = prefix_match_targets(toks)[:, L + 1 :]
    assert (cache.pattern[1][:, 0, L + 1 :] * target).sum(-1).mean() < 0.1


def test_pattern_preserving_ablation_separates_k_composition_from_copying(induction_model):
    """L0H0 acts only through the induction head's keys: with patterns frozen its ablation costs
    nothing. L1H0 writes the prediction: its pattern-preserving ablation costs everything."""
    toks = permuted_repeats()
    L = 31
    sec = slice(L + 1, None)
    eff_zero = ablation_effects(induction_model, toks, "zero", targets=sec)
    eff_pat = ablation_effects(induction_model, toks, "pattern", targets=sec)
    assert eff_zero[0, 0] > 3 and eff_pat[0, 0].abs() < 1e-3
    assert eff_zero[1, 0] > 3 and eff_pat[1, 0] > 3
    assert eff_zero[:, 1].abs().max() < 1e-3 and eff_pat[:, 1].abs().max() < 1e-3
    kw = pattern_preserving_ablation(induction_model, toks, [(1, 0)])
    assert set(kw) == {"ablate", "patterns"} and len(kw["patterns"]) == 4


def test_one_layer_model_cannot_prefix_match(induction_model):
    """In one layer, the score from query i to key j sees only (token_i, pos_i, token_j, pos_j):
    changing the token *before* key j changes nothing, so no one-layer head can look for "the token
    after an earlier copy of mine" except by fixed position."""
    torch.manual_seed(0)
    random_1l = Transformer(ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16))
    toks = torch.randint(1, 50, (1, 12))
    edited = toks.clone()
    edited[0, 5] = (toks[0, 5] + 1) % 49 + 1  # the token before key 6
    s1 = random_1l.run_with_cache(toks)[1].attn_scores[0][0, :, 9, 6]
    s2 = random_1l.run_with_cache(edited)[1].attn_scores[0][0, :, 9, 6]
    torch.testing.assert_close(s1, s2)
    # and in two layers it does change: that is what K-composition buys
    two = Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16))
    assert not torch.allclose(two.run_with_cache(toks)[1].attn_scores[1][0, :, 9, 6], two.run_with_cache(edited)[1].attn_scores[1][0, :, 9, 6])
    # the induction head's weights alone, without the previous-token layer, are no induction head
    one = one_layer_from(induction_model)
    rep = permuted_repeats()
    pm = prefix_matching_scores(one, seq_len=31, n_repeats=2, tokens=rep)
    assert pm.max() < 0.1
    loss = per_position_loss(one, rep)
    assert loss[32:].mean() > math.log(V) - 0.5


def test_value_weighted_pattern(induction_model):
    toks = permuted_repeats(batch=2)
    _, cache = induction_model.run_with_cache(toks)
    vw = value_weighted_pattern(induction_model, cache, 1, 0)
    torch.testing.assert_close(vw.sum(-1), torch.ones(vw.shape[:2]))
    # the induction head's value of every token has the same norm, so weighting changes nothing
    torch.testing.assert_close(vw, cache.pattern[1][:, 0], atol=1e-5, rtol=1e-5)
    # the all-zero head writes nothing, so it moves nothing (rows fall to zero instead of NaN)
    assert torch.isfinite(value_weighted_pattern(induction_model, cache, 1, 1)).all()
    with pytest.raises(IndexError, match="valid heads"):
        value_weighted_pattern(induction_model, cache, 1, 2)


# ----------------------------------------------------------------------------------------------
# Losses, ICL score and the scores' plumbing on a tiny random model
# ----------------------------------------------------------------------------------------------
def test_repeated_loss_curve_and_copy_means(tiny_model):
    curve = repeated_loss_curve(tiny_model, n_repeats=3, batch_size=4)
    assert curve.seq_len == max_repeat_len(16, 3) == 5
    assert curve.loss.shape == (15,) and curve.positions.tolist() == list(range(1, 16))
    means = curve.copy_means()
    assert len(means) == 3
    assert means[1] == pytest.approx(curve.loss[6:10].mean().item())
    rl = repeated_token_loss(tiny_model, batch_size=4)
    assert rl.ratio == pytest.approx(rl.second / rl.first)


def test_induction_model_icl_score_is_negative(induction_model):
    toks = permuted_repeats()
    late, early = 40, 5
    assert in_context_learning_score(induction_model, toks, late=late, early=early) < -2
    assert icl_positions(128) == (125, 12)  # Olsson's 500 vs 50 of 512, scaled to n_ctx=128
    assert icl_positions(512) == (500, 50)


def test_head_scores_table(tiny_model):
    text = torch.randint(0, 50, (2, 16))
    hs = head_scores(tiny_model, text, seq_len=3)
    assert isinstance(hs, HeadScores)
    assert hs.previous_token.shape == hs.prefix_matching.shape == hs.copying.shape == (2, 4)
    assert ((hs.copying >= -1) & (hs.copying <= 1)).all()
    rows = hs.rows()
    assert len(rows) == 8 and rows[5]["head"] == "1.1"
    assert hs.table().count("\n") == 8
    hs.prefix_matching[1, 2] = 5.0
    assert hs.best("prefix_matching") == (1, 2)
    hs.previous_token[0, 3] = 5.0
    assert hs.best("previous_token", layer=0) == (0, 3)


def test_prefix_targets_agree_with_positional_mask_when_tokens_are_distinct():
    toks = permuted_repeats(batch=1, seq_len=5, n_repeats=3)
    torch.testing.assert_close(prefix_match_targets(toks)[0, 6:], prefix_matching_mask(5, 3)[6:])


# ----------------------------------------------------------------------------------------------
# Bad input: messages that name the fix
# ----------------------------------------------------------------------------------------------
def test_repeated_lengths_that_do_not_fit_name_the_maximum(tiny_model):
    with pytest.raises(ValueError, match="maximum seq_len for 2 copies is 7"):
        repeated_tokens(tiny_model, seq_len=8)
    with pytest.raises(ValueError, match="maximum seq_len for 4 copies is 3"):
        prefix_matching_scores(tiny_model)  # Olsson's 25 x 4 does not fit n_ctx=16
    with pytest.raises(ValueError, match="maximum seq_len for 3 copies is 5"):
        repeated_loss_curve(tiny_model, seq_len=6, n_repeats=3)
    with pytest.raises(ValueError, match="seq_len must be at least 1, got 0"):
        repeated_tokens(tiny_model, seq_len=0)


def test_nonexistent_heads(tiny_model):
    toks = torch.randint(0, 50, (1, 8))
    with pytest.raises(IndexError, match="layer 2 does not exist; valid layers: 0..1"):
        ablated_loss(tiny_model, toks, (2, 0))
    with pytest.raises(IndexError, match="head 4 does not exist; valid heads: 0..3"):
        zero_ablation(tiny_model, [(0, 1), (1, 4)])
    with pytest.raises(IndexError, match="valid heads"):
        pattern_preserving_ablation(tiny_model, toks, (0, -1))
    with pytest.raises(TypeError, match=r"\(layer, head\) pair"):
        validate.heads(tiny_model, [3])
    with pytest.raises(ValueError, match="'zero' or 'pattern'"):
        ablated_loss(tiny_model, toks, (0, 0), mode="mean")
    zero = Transformer(ModelConfig(n_layers=0, d_model=8, n_heads=1, d_head=8, d_vocab=50, n_ctx=16))
    with pytest.raises(ValueError, match="no attention heads"):
        copying_scores(zero, seq_len=4)


def test_icl_positions_past_the_context(tiny_model):
    toks = torch.randint(0, 50, (2, 16))
    with pytest.raises(ValueError, match="past the context length n_ctx=16"):
        in_context_learning_score(tiny_model, toks, late=20, early=2)
    with pytest.raises(ValueError, match="outside the sequence"):
        in_context_learning_score(tiny_model, toks[:, :8], late=12, early=2)
    with pytest.raises(ValueError, match="reference context"):
        icl_positions(128, late=600)
    # scaled positions stay inside the context: 500/512 of 16 rounds to 16, which is clipped to 15
    assert icl_positions(16) == (15, 2)
    in_context_learning_score(tiny_model, toks)  # so the defaults always fit a full-length window


# ----------------------------------------------------------------------------------------------
# The weight-based view (circuits.induction): K-composition term and eigenvalue positivity
# ----------------------------------------------------------------------------------------------
def test_hand_built_induction_head_sits_in_the_corner(induction_model):
    from attncircuits.analysis.circuits.induction import induction_eigen_positivity, k_composition_circuit

    eig = induction_eigen_positivity(induction_model)
    assert eig.qk[0] > 0.99 and eig.ov[0] > 0.99  # identity-like K-composition term and OV circuit
    assert eig.corner() == [0]
    # the term is diagonal: query token a matches "previous token" b exactly when a == b
    k = k_composition_circuit(induction_model, 1, 0).dense()
    torch.testing.assert_close(k, torch.eye(V) * EMBED**2 / math.sqrt(V))
    # without the previous-token head as writer, nothing is left to compose with
    assert k_composition_circuit(induction_model, 1, 0, writers=[1]).dense().abs().max() == 0


def test_k_composition_term_matches_the_dense_product(tiny_model):
    from attncircuits.analysis.circuits.induction import k_composition_circuit, writer_ov

    m = tiny_model
    b0, b1 = m.blocks
    ov0 = sum(b0.W_V[p] @ b0.W_O[p] for p in range(4))
    dense = (m.W_E @ b1.W_Q[2]) @ (m.W_E @ ov0 @ b1.W_K[2]).T / math.sqrt(8)
    fm = k_composition_circuit(m, 1, 2)
    torch.testing.assert_close(fm.dense(), dense.detach(), atol=1e-4, rtol=1e-4)
    # eigenvalues through the d_head x d_head product equal the dense ones (plus zeros)
    dense_eig = torch.linalg.eigvals(dense.detach().double())
    small = fm.eigenvalues().to(torch.complex128)
    assert torch.allclose(dense_eig.abs().sort().values[-8:], small.abs().sort().values, atol=1e-3)
    torch.testing.assert_close(writer_ov(m, [1]), (b0.W_V[1] @ b0.W_O[1]).detach())


def test_k_composition_bad_input(tiny_model):
    from attncircuits.analysis.circuits.induction import induction_eigen_positivity, k_composition_circuit

    one = Transformer(ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16))
    with pytest.raises(ValueError, match="load a two-layer model"):
        induction_eigen_positivity(one)
    with pytest.raises(IndexError, match="valid heads"):
        k_composition_circuit(tiny_model, 1, 0, writers=[7])
    with pytest.raises(IndexError, match="no earlier layer"):
        k_composition_circuit(tiny_model, 0)


def test_ablation_effects_of_chosen_heads_only(induction_model):
    toks = permuted_repeats(batch=2)
    eff = ablation_effects(induction_model, toks, "zero", targets=slice(32, None), heads=[(0, 0), (0, 1)])
    assert eff[0, 0] > 3 and eff[0, 1].abs() < 1e-3 and torch.isnan(eff[1]).all()
    with pytest.raises(IndexError, match="valid layers"):
        ablation_effects(induction_model, toks, heads=[(5, 0)])


def test_per_position_loss_in_chunks_and_icl_from_it(tiny_model):
    toks = torch.randint(0, 50, (10, 16), generator=torch.Generator().manual_seed(3))
    ref = loss_fn(tiny_model(toks), toks, per_token=True).mean(0).detach()
    loss = per_position_loss(tiny_model, toks, chunk=3)
    torch.testing.assert_close(loss, ref)
    from attncircuits.analysis.losses import icl_score_from_loss

    late, early = icl_positions(16)
    assert icl_score_from_loss(loss, 16) == pytest.approx((ref[late - 1] - ref[early - 1]).item(), abs=1e-5)
    assert in_context_learning_score(tiny_model, toks) == pytest.approx(icl_score_from_loss(loss, 16), abs=1e-5)
    with pytest.raises(ValueError, match="past the context length"):
        icl_score_from_loss(loss, 16, late=16)


def test_phase_change_step_and_repeated_spans():
    from attncircuits.analysis.scores import phase_change_step, repeated_spans

    hist = {"step": [0, 10, 20, 30, 40], "prefix_matching": [[[0.0], [0.02]], [[0.0], [0.05]], [[0.0], [0.3]], [[0.0], [0.5]], [[0.0], [0.52]]]}
    assert phase_change_step(hist) == 20  # 0.3 is the first past 0.02 + (0.52 - 0.02) / 2
    assert phase_change_step(hist, frac=0.9) == 30
    with pytest.raises(ValueError, match="never rises"):
        phase_change_step(hist, layer=0)
    with pytest.raises(KeyError, match="available"):
        phase_change_step(hist, key="copying")
    t = torch.tensor([5, 1, 2, 3, 4, 9, 9, 1, 2, 3, 4, 7])
    assert repeated_spans(t, min_len=3) == [(1, 7, 4)]  # maximal only: (2, 8, 3) is inside it
    assert repeated_spans(t, min_len=3, min_gap=7) == []


def test_loss_at_positions_matches_the_full_loss(tiny_model):
    from attncircuits.analysis.losses import loss_at_positions

    toks = torch.randint(0, 50, (7, 16), generator=torch.Generator().manual_seed(4))
    full = loss_fn(tiny_model(toks), toks, per_token=True).mean(0).detach()
    torch.testing.assert_close(loss_at_positions(tiny_model, toks, [15, 2, 1], chunk=3), full[[14, 1, 0]])
    with pytest.raises(ValueError, match="positions must lie in 1..15"):
        loss_at_positions(tiny_model, toks, [0])
    with pytest.raises(ValueError, match="positions must lie in 1..15"):
        loss_at_positions(tiny_model, toks, [16])


def test_losses_at_a_few_positions_equal_the_full_passes_entries(tiny_model):
    """Unembedding only the positions read (the same for every row, or each row's own, in chunks
    that split the rows, with a head ablated) gives the full pass's entries to float precision."""
    from attncircuits.analysis import losses

    toks = torch.randint(0, 50, (7, 16), generator=torch.Generator().manual_seed(5))
    full = losses.per_token_loss(tiny_model, toks)
    per_row = torch.tensor([[3, 15], [1, 2], [9, 4], [15, 15], [2, 7], [8, 1], [5, 6]])
    torch.testing.assert_close(losses.loss_rows_at(tiny_model, toks, torch.tensor([15, 2]), chunk=3), full[:, [14, 1]])
    torch.testing.assert_close(losses.loss_rows_at(tiny_model, toks, per_row, chunk=3), full.gather(1, per_row - 1))
    ablated = losses.per_token_loss(tiny_model, toks, ablate={(0, 0): 0.0})
    torch.testing.assert_close(losses.loss_rows_at(tiny_model, toks, per_row, chunk=2, ablate={(0, 0): 0.0}),
                               ablated.gather(1, per_row - 1))
    assert not torch.allclose(ablated, full)  # the ablation reaches the positions read
    torch.testing.assert_close(losses.icl_rows(tiny_model, toks), losses.icl_scores_per_row(full, 16))


def test_per_token_loss_and_icl_per_row(tiny_model):
    from attncircuits.analysis.losses import icl_score_from_loss, icl_scores_per_row, per_token_loss

    toks = torch.randint(0, 50, (9, 16), generator=torch.Generator().manual_seed(5))
    nll = per_token_loss(tiny_model, toks, chunk=4)
    torch.testing.assert_close(nll, loss_fn(tiny_model(toks), toks, per_token=True).detach())
    rows = icl_scores_per_row(nll, 16)
    assert rows.shape == (9,)
    assert rows.mean().item() == pytest.approx(icl_score_from_loss(nll.mean(0), 16), abs=1e-5)
    with pytest.raises(ValueError, match="outside the sequence"):
        icl_scores_per_row(nll[:, :5], 16)


# ----------------------------------------------------------------------------------------------
# Inputs that once gave NaN or acted as other inputs: now refused, each with a message naming it
# ----------------------------------------------------------------------------------------------
def test_one_token_rows_are_refused_not_nan(tiny_model):
    one = torch.tensor([[5], [7]])
    with pytest.raises(ValueError, match="tokens has 1 token.*previous-token score.*needs at least 2"):
        previous_token_scores(tiny_model, one)  # once all NaN
    with pytest.raises(ValueError, match="tokens has 1 token.*next-token loss.*needs at least 2"):
        ablated_loss(tiny_model, one, (0, 1))  # once nan
    with pytest.raises(ValueError, match="tokens has 1 token"):
        per_position_loss(tiny_model, one)
    with pytest.raises(ValueError, match=r"seq_len must be at least 2 \(the loss of a copy"):
        repeated_token_loss(tiny_model, seq_len=1)  # once NaN
    with pytest.raises(ValueError, match=r"n_repeats must be at least 2 \(prefix matching is measured on the later copies"):
        prefix_matching_scores(tiny_model, seq_len=3, n_repeats=1)  # once NaN
    # the smallest valid inputs give finite numbers
    assert torch.isfinite(previous_token_scores(tiny_model, torch.tensor([[5, 7]]))).all()
    assert math.isfinite(repeated_token_loss(tiny_model, seq_len=2, batch_size=2).second)
    assert torch.isfinite(prefix_matching_scores(tiny_model, seq_len=2, n_repeats=2, batch_size=2)).all()


def test_heads_are_int_pairs_that_exist(tiny_model):
    toks = torch.randint(0, 50, (2, 8))
    with pytest.raises(TypeError, match="layer must be an int, got 0.5"):
        zero_ablation(tiny_model, (0.5, 1.9))  # once head (0, 1)
    with pytest.raises(TypeError, match="head must be an int, got None"):
        ablated_loss(tiny_model, toks, (0, None))  # once a deep TypeError
    with pytest.raises(TypeError, match=r"a head must be a \(layer, head\) pair of ints, got '0'"):
        zero_ablation(tiny_model, ["0"])
    with pytest.raises(TypeError, match=r"heads must be a \(layer, head\) pair or a list of them, got '0'"):
        zero_ablation(tiny_model, "0")
    # numpy indices and lists as pairs are heads too
    assert validate.heads(tiny_model, [(np.int64(1), 2), [0, 3]]) == [(1, 2), (0, 3)]
    assert zero_ablation(tiny_model, (np.int64(1), 2)) == {"ablate": {(1, 2): 0.0}}


def test_uint16_and_list_tokens_give_the_same_scores(tiny_model):
    toks = torch.randint(1, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    want = previous_token_scores(tiny_model, toks)
    torch.testing.assert_close(previous_token_scores(tiny_model, toks.numpy().astype(np.uint16)), want)
    torch.testing.assert_close(previous_token_scores(tiny_model, toks.tolist()), want)
    assert ablated_loss(tiny_model, toks.numpy().astype(np.uint16)) == pytest.approx(ablated_loss(tiny_model, toks))
