"""Our models in TransformerLens 4: same log-probs, exact round trip, its tools give our numbers, refusals."""

import importlib.metadata
import subprocess
import sys

import pytest
import torch

from attncircuits import ModelConfig, Transformer, load_pretrained
from attncircuits.analysis import losses
from attncircuits.analysis import scores as S
from attncircuits.analysis.circuits.composition import composition_scores
from attncircuits.analysis.circuits.factored import full_ov_circuit
from attncircuits.checkpoints.pretrained import MODEL_NAMES, validation_windows
from attncircuits.models import interop
from lazy_tl import transformer_lens

tl = transformer_lens()
from attncircuits.models.interop import from_transformer_lens, to_transformer_lens  # noqa: E402

LOGPROB_TOL = 1e-4  # float32 logits of two implementations of one sum; measured about 2e-5


def random_model(n_layers, seed=0, **family):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=n_layers, d_model=32, n_heads=4, d_head=8, d_vocab=61, n_ctx=24, **family)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # gains and biases away from their initial 1 and 0
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def shipped():
    return {name: load_pretrained(name) for name in MODEL_NAMES + ("ln-mlp-4l",)}


@pytest.fixture(scope="module")
def two_layer(shipped):
    model = shipped["attn-only-2l"].model
    return model, to_transformer_lens(model)


def max_logprob_diff(model, tl_model, tokens):
    with torch.no_grad():
        return (model(tokens).log_softmax(-1) - tl_model(tokens).log_softmax(-1)).abs().max().item()


@pytest.mark.parametrize("name", MODEL_NAMES + ("ln-mlp-4l",))
def test_shipped_models_give_the_same_log_probs(shipped, name):
    model = shipped[name].model
    tokens = validation_windows(n_ctx=model.cfg.n_ctx)[:8]
    assert max_logprob_diff(model, to_transformer_lens(model), tokens) < LOGPROB_TOL


@pytest.mark.parametrize("n_layers", [0, 1, 2, 3])
def test_random_models_give_the_same_log_probs_and_round_trip_exactly(n_layers):
    model = random_model(n_layers, seed=n_layers)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, model.cfg.n_ctx), generator=torch.Generator().manual_seed(1))
    tl_model = to_transformer_lens(model)
    assert tl_model.cfg.n_layers == n_layers and tl_model.cfg.positional_embedding_type == "shortformer"
    assert max_logprob_diff(model, tl_model, tokens) < LOGPROB_TOL
    back = from_transformer_lens(tl_model)
    assert back.cfg == model.cfg
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key  # bit for bit
    assert max_logprob_diff(back, tl_model, tokens) < LOGPROB_TOL


@pytest.mark.parametrize("name", ["attn-only-2l", "ln-mlp-4l"])
def test_round_trip_of_a_shipped_model_is_exact(shipped, name):
    model = shipped[name].model
    back = from_transformer_lens(to_transformer_lens(model))
    assert back.cfg == model.cfg and model.state_dict().keys() == back.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


@pytest.mark.parametrize("family", [
    dict(positions="rotary"), dict(positions="learned"), dict(positions="none"),
    dict(layernorm=True, d_mlp=48), dict(layernorm=True, d_mlp=48, positions="rotary", act_fn="relu"),
    dict(layernorm=True, d_mlp=48, positions="learned", biases=True),
])
def test_family_members_give_the_same_log_probs_and_round_trip_exactly(family):
    model = random_model(2, seed=3, **family)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, model.cfg.n_ctx), generator=torch.Generator().manual_seed(2))
    tl_model = to_transformer_lens(model)
    assert max_logprob_diff(model, tl_model, tokens) < LOGPROB_TOL
    back = from_transformer_lens(tl_model)
    assert back.cfg == model.cfg
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def test_attention_cache_equals_ours(two_layer):
    model, tl_model = two_layer
    tokens = validation_windows(n_ctx=model.cfg.n_ctx)[:4]
    _, tl_cache = tl_model.run_with_cache(tokens)
    _, cache = model.run_with_cache(tokens)
    # hook_result never fires in 4.x: the per-head outputs are computed from the cache
    results, labels = tl_cache.stack_head_results(layer=model.cfg.n_layers, return_labels=True)
    assert labels[:2] == ["L0H0", "L0H1"]
    for l in range(model.cfg.n_layers):
        torch.testing.assert_close(tl_cache["pattern", l], cache.pattern[l], atol=1e-5, rtol=1e-4)
        # 4.x's hook_attn_scores holds the pattern, after the softmax (3.x's held the scores before it)
        torch.testing.assert_close(tl_cache["attn_scores", l], cache.pattern[l], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(tl_cache["v", l], cache.v[l], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(tl_cache["z", l], cache.z[l], atol=1e-5, rtol=1e-4)
        per_head = results[l * model.cfg.n_heads : (l + 1) * model.cfg.n_heads].permute(1, 2, 0, 3)
        torch.testing.assert_close(per_head, cache.head_out[l], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(tl_cache["resid_pre", l], cache.resid[l], atol=1e-4, rtol=1e-4)


def test_composition_scores_equal_ours(two_layer):
    model, tl_model = two_layer
    ours = composition_scores(model, n_baseline=2)
    for kind, mode in (("q", "Q"), ("k", "K"), ("v", "V")):
        theirs = tl_model.all_composition_scores(mode)[0, :, 1, :]  # [layer-0 head, layer-1 head]
        torch.testing.assert_close(theirs, ours[kind], atol=1e-5, rtol=1e-4)
    # the same through utilities.composition_scores (utils.composition_scores before 3.x) on one pair
    one = tl.utilities.composition_scores(tl_model.OV[0, 1], tl_model.QK[1, 2].T)
    assert one.item() == pytest.approx(ours.k[1, 2].item(), rel=1e-4)


def sorted_eigenvalues(values):
    """Complex eigenvalues in a fixed order (by real part, then imaginary), for comparing two sets."""
    values = values.to(torch.complex128)
    order = sorted(range(len(values)), key=lambda i: (round(values[i].real.item(), 4), values[i].imag.item()))
    return values[order]


def test_factored_matrix_eigenvalues_of_full_ov_circuits_equal_ours(two_layer):
    model, tl_model = two_layer
    theirs = (tl_model.W_E @ tl_model.OV @ tl_model.W_U).eigenvalues  # [layer, head, d_head]
    for l in range(model.cfg.n_layers):
        ours = full_ov_circuit(model, l).eigenvalues()  # [head, d_head]
        for h in range(model.cfg.n_heads):
            a, b = sorted_eigenvalues(ours[h]), sorted_eigenvalues(theirs[l, h])
            scale = a.abs().max().item()
            assert (a - b).abs().max().item() < 1e-4 * scale, (l, h)


def test_head_detector_equals_our_scores(two_layer, shipped):
    model, _ = two_layer
    tl_model = to_transformer_lens(model, tokenizer=shipped["attn-only-2l"].tokenizer)
    text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n" * 2
    tokens = tl_model.to_tokens(text)  # <|endoftext|> first, as our documents start
    assert tokens[0, 0].item() == 0
    n = tokens.shape[1]
    # TransformerLens divides the attention on the previous token by all n rows; ours averages rows 1..n-1
    theirs = tl.head_detector.detect_head(tl_model, text, "previous_token_head")
    ours = S.previous_token_scores(model, tokens) * (n - 1) / n
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-4)
    # its induction pattern is our prefix-matching target; it averages over every query
    theirs = tl.head_detector.detect_head(tl_model, text, "induction_head")
    _, cache = model.run_with_cache(tokens)
    target = S.prefix_match_targets(tokens).float()
    ours = torch.stack([torch.einsum("bhqk,bqk->h", p, target) / n for p in cache.pattern])
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-4)


def test_hooks_reproduce_our_zero_ablation(two_layer):
    model, tl_model = two_layer
    tokens = losses.repeated_tokens(model, batch_size=4)

    def zero_head(z, hook):
        z[:, :, 3] = 0.0  # z is [batch, pos, head, d_head]; a zero z is a zero head output
        return z

    with torch.no_grad():
        theirs = tl_model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", zero_head)])
        ours = model(tokens, **losses.zero_ablation(model, (0, 3)))
    assert (theirs.log_softmax(-1) - ours.log_softmax(-1)).abs().max().item() < LOGPROB_TOL


# ---- refusals -------------------------------------------------------------------------------------
def tl_config(**overrides):
    cfg = dict(n_layers=1, d_model=16, d_head=4, n_heads=4, n_ctx=8, d_vocab=20, attn_only=True,
               normalization_type=None, positional_embedding_type="standard", seed=0)  # fmt: skip
    cfg.update(overrides)
    return tl.TransformerBridge.boot_native(tl.TransformerBridgeConfig(**cfg))


@pytest.mark.parametrize("overrides", [dict(), dict(attn_only=False, d_mlp=32, normalization_type="LN", act_fn="relu"),
                                       dict(positional_embedding_type="rotary", rotary_dim=4)])
def test_a_native_tl_model_converts_with_its_biases(overrides):
    tl_model = tl_config(**overrides)
    assert not from_transformer_lens(tl_model).cfg.biases  # boot_native's biases start at zero
    state = tl_model.state_dict()
    state["blocks.0.attn.q.bias"] = torch.full_like(state["blocks.0.attn.q.bias"], 0.5)
    tl_model.load_state_dict(state)
    model = from_transformer_lens(tl_model)
    assert model.cfg.biases and model.b_Q.eq(0.5).all()
    tokens = torch.randint(0, 20, (2, 8))
    assert max_logprob_diff(model, tl_model, tokens) < LOGPROB_TOL


@pytest.mark.parametrize(
    "overrides, part",
    [
        (dict(normalization_type="RMS"), "another normalisation"),
        (dict(normalization_type="LNPre"), "another normalisation"),
        (dict(attn_only=False, d_mlp=32, gated_mlp=True, act_fn="silu"), "gated MLPs"),
        (dict(attn_only=False, d_mlp=32, act_fn="gelu_new"), "another MLP activation"),
        (dict(n_key_value_heads=2), "grouped keys and values"),
        (dict(positional_embedding_type="rotary", rotary_dim=2), "another rotary layout"),
        (dict(attention_dir="bidirectional"), "bidirectional attention"),
        (dict(attn_scale=3.0), "attention scale"),
        (dict(output_logits_soft_cap=30.0), "soft-capped logits"),
    ],
)
def test_refuses_what_it_cannot_represent(overrides, part):
    with pytest.raises(interop.UnsupportedModelError, match=part):
        from_transformer_lens(tl_config(**overrides))


def test_refuses_what_is_not_a_bridge():
    with pytest.raises(TypeError, match="TransformerBridge"):
        from_transformer_lens(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="already one of our Transformer"):
        from_transformer_lens(random_model(1))


def test_missing_or_wrong_transformer_lens_says_what_to_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[tl\]'"):
        to_transformer_lens(random_model(1))
    for old in ("3.9.0", "4.2.1"):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=old: v)
        with pytest.raises(ImportError, match=r"too old.*TransformerBridge.*pip install 'transformer-lens>=4\.3,<5'"):
            from_transformer_lens(tl_config())
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.0.0")
    with pytest.raises(ImportError, match=r"transformer-lens>=4\.3,<5"):
        to_transformer_lens(random_model(1))


def test_importing_the_package_does_not_import_transformer_lens():
    code = "import sys, attncircuits, attncircuits.models.interop; assert 'transformer_lens' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
