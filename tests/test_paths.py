"""The path expansion against the forward pass, on tiny random models."""

import pytest
import torch

from attncircuits import ModelConfig, Transformer
from attncircuits.analysis.circuits.factored import full_ov_circuit
from attncircuits.analysis.circuits.paths import attention_patterns_from_weights, path_expansion, path_expansion_error


def tiny(n_layers, seed=0):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(n_layers=n_layers, d_model=32, n_heads=4, d_head=8, d_vocab=50, n_ctx=16))


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(5))


def test_one_layer_expansion_is_exact(tokens):
    m = tiny(1)
    exp = path_expansion(m, tokens)
    logits = m(tokens)
    assert exp.terms.shape == (3, 16, 5, 50) and exp.labels == [
        "direct",
        "head 0.0",
        "head 0.1",
        "head 0.2",
        "head 0.3",
    ]
    assert exp.rest is None
    assert (exp.total - logits).abs().max() < 1e-4
    assert path_expansion_error(m, tokens) < 1e-4
    # the direct term alone is far from the logits: the heads matter, so the test has teeth
    assert (exp.direct - logits).abs().max() > 0.1


def test_patterns_from_weights_match_the_forward_pass(tokens):
    m = tiny(2)
    _, cache = m.run_with_cache(tokens)
    torch.testing.assert_close(attention_patterns_from_weights(m, tokens), cache.pattern[0], rtol=1e-5, atol=1e-6)


def test_head_term_is_pattern_times_ov_rows(tokens):
    """Term h at position q is Σ_k A[q, k] · OV[t_k], the OV circuit's rows weighted by the pattern."""
    m = tiny(1)
    exp = path_expansion(m, tokens)
    ov = full_ov_circuit(m, 0, 2)
    b, q = 1, 9
    want = exp.patterns[b, 2, q, : q + 1] @ ov.rows(tokens[b, : q + 1])
    torch.testing.assert_close(exp.heads[b, q, 2], want, rtol=1e-4, atol=1e-4)


def test_first_layer_of_a_deeper_model(tokens):
    m = tiny(2)
    exp = path_expansion(m, tokens)
    assert exp.rest is not None and exp.labels[-1] == "later layers"
    assert path_expansion_error(m, tokens) < 1e-4
    torch.testing.assert_close(exp.total, m(tokens), rtol=1e-5, atol=1e-4)
    assert exp.rest.abs().max() > 0.1  # the second layer really contributes


def test_frozen_patterns_change_the_terms(tokens):
    m = tiny(1)
    uniform = torch.tril(torch.ones(16, 16))
    uniform = (uniform / uniform.sum(-1, keepdim=True)).expand(3, 4, 16, 16)
    exp = path_expansion(m, tokens, patterns=uniform)
    ref = m(tokens, patterns={(0, h): uniform[:, h] for h in range(4)})
    assert (exp.total - ref).abs().max() < 1e-4


def test_next_token_contributions(tokens):
    m = tiny(1)
    exp = path_expansion(m, tokens)
    raw = exp.next_token_contributions(centered=False)
    assert raw.shape == (3, 15, 5)
    logits = m(tokens)
    torch.testing.assert_close(
        raw.sum(-1), logits[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0], rtol=1e-4, atol=1e-4
    )
    cen = exp.next_token_contributions()
    centered_logits = logits - logits.mean(-1, keepdim=True)
    torch.testing.assert_close(
        cen.sum(-1), centered_logits[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0], rtol=1e-4, atol=1e-4
    )


def test_bad_inputs(tokens):
    m = tiny(1)
    with pytest.raises(ValueError, match=r"patterns must be \[batch, head, q, k\]"):
        path_expansion(m, tokens, patterns=torch.zeros(3, 4, 15, 15))
    with pytest.raises(ValueError, match="n_ctx=16"):
        path_expansion(m, torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        path_expansion(m, torch.tensor([[1, 50]]))
    with pytest.raises(ValueError, match="no attention layers"):
        path_expansion(tiny(0), tokens)
