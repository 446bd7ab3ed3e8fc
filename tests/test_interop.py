"""Our models in TransformerLens: same log-probs, exact round trip, its tools give our numbers, refusals."""

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

tl = pytest.importorskip(
    "transformer_lens", reason="TransformerLens is not installed: `pip install -e '.[tl]'` (make test installs it)"
)
from attncircuits.models.interop import from_transformer_lens, to_transformer_lens  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

LOGPROB_TOL = 1e-4  # float32 logits of two implementations of one sum; measured about 2e-5


def random_model(n_layers, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=n_layers, d_model=32, n_heads=4, d_head=8, d_vocab=61, n_ctx=24)
    return Transformer(cfg).eval()


@pytest.fixture(scope="module")
def shipped():
    return {name: load_pretrained(name) for name in MODEL_NAMES}


@pytest.fixture(scope="module")
def two_layer(shipped):
    model = shipped["attn-only-2l"].model
    return model, to_transformer_lens(model)


def max_logprob_diff(model, tl_model, tokens):
    with torch.no_grad():
        return (model(tokens).log_softmax(-1) - tl_model(tokens).log_softmax(-1)).abs().max().item()


@pytest.mark.parametrize("name", MODEL_NAMES)
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


def test_round_trip_of_a_shipped_model_is_exact(shipped):
    model = shipped["attn-only-2l"].model
    back = from_transformer_lens(to_transformer_lens(model))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def test_attention_cache_equals_ours(two_layer):
    model, tl_model = two_layer
    tokens = validation_windows(n_ctx=model.cfg.n_ctx)[:4]
    tl_model.set_use_attn_result(True)  # per-head outputs in the cache, as ours has them
    try:
        _, tl_cache = tl_model.run_with_cache(tokens)
    finally:
        tl_model.set_use_attn_result(False)
    _, cache = model.run_with_cache(tokens)
    for l in range(model.cfg.n_layers):
        torch.testing.assert_close(tl_cache["pattern", l], cache.pattern[l], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(tl_cache["attn_scores", l], cache.attn_scores[l], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(tl_cache["v", l], cache.v[l], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(tl_cache["z", l], cache.z[l], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(tl_cache["result", l], cache.head_out[l], atol=1e-4, rtol=1e-4)
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
               normalization_type=None, positional_embedding_type="shortformer", device="cpu", seed=0)  # fmt: skip
    cfg.update(overrides)
    return tl.HookedTransformer(tl.HookedTransformerConfig(**cfg))


def test_a_plain_tl_model_converts():
    tl_model = tl_config()
    model = from_transformer_lens(tl_model)
    tokens = torch.randint(0, 20, (2, 8))
    assert max_logprob_diff(model, tl_model, tokens) < LOGPROB_TOL


@pytest.mark.parametrize(
    "overrides, part",
    [
        (dict(normalization_type="LN"), "LayerNorm"),
        (dict(normalization_type="RMS"), "LayerNorm"),
        (dict(attn_only=False, act_fn="gelu", d_mlp=32), "MLPs"),
        (dict(positional_embedding_type="standard"), "positions in the residual stream"),
        (dict(positional_embedding_type="rotary"), "rotary positions"),
        (dict(attention_dir="bidirectional"), "bidirectional attention"),
        (dict(use_attn_scale=False), "attention scale"),
    ],
)
def test_refuses_what_it_cannot_represent(overrides, part):
    with pytest.raises(interop.UnsupportedModelError, match=part):
        from_transformer_lens(tl_config(**overrides))


def test_refuses_non_zero_biases():
    tl_model = tl_config()
    with torch.no_grad():
        tl_model.blocks[0].attn.b_Q[1, 2] = 0.5
    with pytest.raises(interop.UnsupportedModelError, match=r"non-zero biases: blocks\.0\.attn\.b_Q"):
        from_transformer_lens(tl_model)


def test_missing_or_wrong_transformer_lens_says_what_to_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[tl\]'"):
        to_transformer_lens(random_model(1))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.1.0")
    with pytest.raises(ImportError, match=r"needs 3\.x.*TransformerBridge.*transformer-lens>=3\.9,<4"):
        from_transformer_lens(tl_config())


def test_importing_the_package_does_not_import_transformer_lens():
    code = "import sys, attncircuits, attncircuits.models.interop; assert 'transformer_lens' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
