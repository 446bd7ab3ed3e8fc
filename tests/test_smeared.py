"""smeared.py: Olsson's smeared-key one-layer model, checked against keys smeared by hand."""

import math

import pytest
import torch

from attncircuits import ModelConfig, Transformer, loss_fn
from attncircuits.analysis.scores import prefix_match_targets
from attncircuits.models.smeared import SmearedKeyTransformer, smear_scores, train_on_repeated_tokens, varied_repeats

CFG = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=40, n_ctx=24)


def hand_smeared_patterns(m: SmearedKeyTransformer, tokens):
    """Smear the keys themselves: k'_j = w k_j + (1 - w) k_{j-1}, k'_0 = k_0."""
    blk = m.model.blocks[0]
    n = tokens.shape[1]
    x = m.model.W_E[tokens] + m.model.W_pos[:n]
    q = torch.einsum("bpd,hde->bhpe", x, blk.W_Q)
    k = torch.einsum("bpd,hde->bhpe", x, blk.W_K)
    w = m.smear[None, :, None, None]
    k_prev = torch.cat([k[:, :, :1], k[:, :, :-1]], dim=2)
    ks = w * k + (1 - w) * k_prev
    scores = q @ ks.transpose(-1, -2) / math.sqrt(CFG.d_head)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def test_smearing_scores_equals_smearing_keys():
    torch.manual_seed(0)
    m = SmearedKeyTransformer(CFG)
    with torch.no_grad():
        m.smear_logit.copy_(torch.tensor([1.5, -2.0]))
    toks = torch.randint(0, 40, (3, 12))
    torch.testing.assert_close(m.patterns(toks), hand_smeared_patterns(m, toks), atol=1e-5, rtol=1e-5)
    # the forward pass uses those patterns
    logits = m(toks)
    ref = m.model(toks, patterns={(0, h): hand_smeared_patterns(m, toks)[:, h] for h in range(2)})
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


def test_no_smear_is_the_ordinary_model_and_gradients_are_finite():
    torch.manual_seed(1)
    m = SmearedKeyTransformer(CFG)
    toks = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        m.smear_logit.fill_(30.0)  # sigma = 1: own key only
        torch.testing.assert_close(m(toks), m.model(toks), atol=1e-4, rtol=1e-4)
    m.smear_logit.data.zero_()
    loss_fn(m(toks), toks).backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    assert m.smear_logit.grad.abs().sum() > 0
    s = torch.tensor([[[[1.0, float("-inf")], [2.0, 3.0]]]])
    torch.testing.assert_close(smear_scores(s, torch.tensor([0.25])), torch.tensor([[[[1.0, float("-inf")], [2.0, 2.25]]]]))


def test_smeared_one_layer_model_learns_induction():
    """Trained briefly on repeats of varied length, the smeared model prefix-matches; the
    ordinary one-layer model, trained the same way, cannot."""
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_head=16, d_vocab=64, n_ctx=32)
    toks = varied_repeats(32, 32, 64, torch.Generator().manual_seed(9))
    targets = prefix_match_targets(toks)
    rows = targets.any(-1)  # queries that have an earlier occurrence to match
    pm = {}
    for name, make in (("smeared", SmearedKeyTransformer), ("plain", Transformer)):
        torch.manual_seed(0)
        m = make(cfg)
        losses = train_on_repeated_tokens(m, steps=150, batch_size=16, lr=5e-3)
        assert losses[-1] < losses[0]
        with torch.no_grad():
            pat = m.patterns(toks) if name == "smeared" else m.run_with_cache(toks)[1].pattern[0]
        pm[name] = (pat * targets[:, None]).sum(-1)[:, :, rows[0]].mean((0, 2)).max().item()
    assert pm["smeared"] > 0.5 and pm["plain"] < 0.3, pm


def test_smeared_bad_input():
    with pytest.raises(ValueError, match="exactly one layer"):
        SmearedKeyTransformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=40, n_ctx=24))
    with pytest.raises(ValueError, match="at least 1"):
        train_on_repeated_tokens(SmearedKeyTransformer(CFG), steps=0)
