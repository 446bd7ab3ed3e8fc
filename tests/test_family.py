"""The family of models: members beyond chapters 1-9's, built from one config, trained briefly,
scored by every detector of the registry, exported to TransformerLens, saved and loaded.

The two members the family chapter needs most are trained here for a few seconds each: a 2-layer
attention-only model with rotary positions and a 3-layer model with MLPs and LayerNorm.
"""

import json

import numpy as np
import pytest
import torch

from attncircuits.analysis import scores as S
from attncircuits.analysis.circuits import composition_scores
from attncircuits.checkpoints.pretrained import CORPUS_DIR, load_checkpoint, save_checkpoint
from attncircuits.data import repeated_rows
from attncircuits.models.interface import features, require
from attncircuits.models.transformer import ModelConfig, Transformer
from attncircuits.train import TrainConfig, train

TINY = dict(d_model=32, n_heads=4, d_vocab=2048, n_ctx=32)  # the shipped tokenizer's vocabulary, to save
V = 64  # the phrases' vocabulary; the forced-pattern tests' too
MEMBERS = {
    "rotary-2l": ModelConfig(n_layers=2, positions="rotary", **TINY),
    "ln-mlp-3l": ModelConfig(n_layers=3, d_mlp=64, layernorm=True, positions="learned", **TINY),
}


def _corpus(n: int = 40_000, seed: int = 0) -> np.ndarray:
    """Tokens with structure to learn: short random phrases, each said twice."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(1, V, size=rng.integers(3, 9)) for _ in range(300)]
    out = []
    while sum(map(len, out)) < n:
        p = phrases[rng.integers(len(phrases))]
        out += [p, p]
    return np.concatenate(out)[:n].astype(np.int64)


@pytest.fixture(scope="module")
def trained():
    """Each new member trained for 120 steps (seconds on a CPU), with its history."""
    tokens = _corpus()
    cfg = TrainConfig(steps=120, batch_size=8, warmup_steps=10, eval_every=60, eval_batches=2, lr=3e-3)
    out = {}
    for name, mcfg in MEMBERS.items():
        model, history, _ = train(mcfg, cfg, tokens[:36_000], tokens[36_000:], progress=False)
        out[name] = (model.eval(), history)
    return out


@pytest.mark.parametrize("name", MEMBERS)
def test_member_trains(trained, name):
    model, history = trained[name]
    losses = [v for v in history["val_loss"] if v is not None]
    assert losses[-1] < losses[0] - 0.2, f"{name} did not learn: validation losses {losses}"
    assert features(model)["positions"] == MEMBERS[name].positions


@pytest.mark.parametrize("name", MEMBERS)
def test_every_detector_runs(trained, name):
    model, _ = trained[name]
    text = torch.as_tensor(_corpus(2_000, seed=1)[: 8 * 32]).view(8, 32)
    hs = S.head_scores(model, text, seq_len=10, n_repeats=3)
    assert list(hs.scores) == list(S.DETECTORS)
    for score, value in hs.scores.items():
        assert value.shape == (model.cfg.n_layers, model.cfg.n_heads), score
        assert torch.isfinite(value).all(), score
    for score in ("previous_token", "prefix_matching", "duplicate_token", "positional"):
        assert (hs.scores[score] >= -1e-6).all() and (hs.scores[score] <= 1 + 1e-6).all(), score
    assert (hs.copying.abs() <= 1 + 1e-6).all()
    assert len(hs.table().splitlines()) == 1 + model.cfg.n_layers * model.cfg.n_heads


@pytest.mark.parametrize("name", ["attn-only-2l", "ln-mlp-4l"])
def test_every_detector_runs_on_the_shipped_models(name):
    from attncircuits import load_pretrained
    from attncircuits.checkpoints.pretrained import validation_windows

    model = load_pretrained(name).model
    hs = S.head_scores(model, validation_windows(n_ctx=128)[:4])
    assert list(hs.scores) == list(S.DETECTORS)
    assert hs.prefix_matching.max() > 0.8  # both have induction heads
    assert hs.previous_token.max() > 0.5  # and a previous-token head


def test_a_detector_is_one_function_and_one_line():
    """The registry takes a new detector without any other change: HeadScores prints it."""
    S.register("first_token", "first-token", lambda m, p: S._patterns(m, repeated_rows(4, 8, 1, m.cfg.d_vocab, 0))[..., 0].mean(dim=(1, 3)))
    try:
        model = Transformer(ModelConfig(n_layers=1, **TINY))
        hs = S.head_scores(model, None, seq_len=7)
        assert "first_token" in hs.scores and "first-token" in hs.table().splitlines()[0]
        assert hs.first_token.shape == (1, 4)
    finally:
        del S.DETECTORS["first_token"]


def _forced(model, tokens, target):
    """Head 0.0's pattern replaced by ``target`` normalised (rows without a target look at 0)."""
    pat = target.float().clone()
    pat[:, :, 0] += pat.sum(-1) == 0
    return {(0, 0): pat / pat.sum(-1, keepdim=True)}


def test_duplicate_token_and_prefix_matching_score_the_heads_they_describe():
    """A head forced to attend to earlier copies of its own token scores 1 on duplicate-token and
    0 on prefix matching, and a head forced onto the token after them the other way round."""
    model = Transformer(ModelConfig(n_layers=1, **{**TINY, "d_vocab": V}))
    toks = repeated_rows(4, 10, 3, V, 0)
    dup = S._duplicate_targets(toks)
    nxt = S.prefix_match_targets(toks)
    d = S.duplicate_token_scores(model, 10, 3, tokens=toks, patterns=_forced(model, toks, dup))
    p = S.prefix_matching_scores(model, 10, 3, tokens=toks, patterns=_forced(model, toks, dup))
    assert d[0, 0] == pytest.approx(1.0) and p[0, 0] == pytest.approx(0.0, abs=1e-6)
    d = S.duplicate_token_scores(model, 10, 3, tokens=toks, patterns=_forced(model, toks, nxt))
    p = S.prefix_matching_scores(model, 10, 3, tokens=toks, patterns=_forced(model, toks, nxt))
    assert p[0, 0] == pytest.approx(1.0) and d[0, 0] == pytest.approx(0.0, abs=1e-6)


def test_positional_score_tells_a_fixed_pattern_from_a_content_one():
    model = Transformer(ModelConfig(n_layers=1, **{**TINY, "d_vocab": V}))
    toks = repeated_rows(16, 24, 1, V, 0)
    n = toks.shape[1]
    fixed = torch.eye(n).roll(-1, 0).tril()  # each query on the position before it
    fixed[0, 0] = 1.0
    s_fixed = S.positional_scores(model, tokens=toks, patterns={(0, 0): fixed.expand(16, n, n)})
    assert s_fixed[0, 0] == pytest.approx(1.0)
    # earlier copies of a token (64 ids, 24 draws: a few per row) sit where the text puts them
    s_content = S.positional_scores(model, tokens=toks, patterns=_forced(model, toks, S._duplicate_targets(toks)))
    assert s_content[0, 0] < 0.9
    with pytest.raises(ValueError, match="2 or more"):
        S.positional_scores(model, tokens=toks[:1])


@pytest.mark.parametrize("name", MEMBERS)
def test_export_to_transformer_lens_agrees(trained, name):
    pytest.importorskip("transformer_lens")
    from attncircuits.models.interop import to_transformer_lens

    model, _ = trained[name]
    tl_model = to_transformer_lens(model)
    toks = repeated_rows(3, 15, 2, TINY["d_vocab"], 1)
    ours, cache = model.run_with_cache(toks)
    theirs, tl_cache = tl_model.run_with_cache(toks)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(tl_cache["pattern", layer], cache.pattern[layer], atol=1e-5, rtol=1e-4)
    # the course's prefix-matching score, computed by TransformerLens's own forward pass
    ours_pm = S.prefix_matching_scores(model, 10, 3, batch_size=4)
    pm_toks = repeated_rows(4, 10, 3, TINY["d_vocab"], 0)
    _, tl_cache = tl_model.run_with_cache(pm_toks)
    target = S.prefix_match_targets(pm_toks).float()
    for layer in range(model.cfg.n_layers):
        mass = (tl_cache["pattern", layer] * target[:, None]).sum(-1)[:, :, 11:].mean(dim=(0, 2))
        torch.testing.assert_close(mass, ours_pm[layer], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", MEMBERS)
def test_folded_model_is_the_same_function(trained, name):
    model, _ = trained[name]
    toks = repeated_rows(2, 15, 2, TINY["d_vocab"], 2)
    fm = model.folded()
    torch.testing.assert_close(fm(toks), model(toks), atol=1e-4, rtol=1e-4)
    comp = composition_scores(model, 0, 1, n_baseline=50)
    assert comp.k.shape == (4, 4) and torch.isfinite(comp.k).all()


@pytest.mark.parametrize("name", MEMBERS)
def test_save_and_load_bit_for_bit(trained, name, tmp_path):
    model, history = trained[name]
    out = save_checkpoint(model, tmp_path / name, CORPUS_DIR / "tokenizer.json", history=history, dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())["model"]
    assert ModelConfig.from_dict(config) == model.cfg
    loaded = load_checkpoint(out).model
    for key, value in model.weights().items():
        assert torch.equal(loaded.weights()[key], value), key
    toks = repeated_rows(2, 10, 2, TINY["d_vocab"], 3)
    assert torch.equal(loaded(toks), model(toks))


def test_the_course_config_json_is_unchanged_for_the_attention_only_model():
    """The family's fields at their defaults stay out of config.json: the shipped files read as before."""
    d = ModelConfig(n_layers=2).to_dict()
    assert d == {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_head": 32, "d_vocab": 2048, "n_ctx": 128, "init_std_embed": 1.0}


BAD_CONFIGS = [
    (dict(positions="alibi"), "ModelConfig.positions='alibi'", "'rotary'"),
    (dict(d_model=64, n_heads=3), "ModelConfig.n_heads=3 does not divide d_model=64", "1, 2, 4, 8, 16, 32, 64"),
    (dict(positions="rotary", d_model=24, n_heads=8), "d_head must be even", "d_head=3"),
    (dict(act_fn="tanh", d_mlp=16), "ModelConfig.act_fn='tanh'", "'gelu'"),
    (dict(act_fn="relu"), "needs an MLP", "d_mlp > 0"),
    (dict(layernorm="yes"), "ModelConfig.layernorm", "True or False"),
    (dict(d_mlp=-4), "ModelConfig.d_mlp", "-4"),
    (dict(n_layers=-1), "ModelConfig.n_layers", "-1"),
    (dict(n_heads=0), "ModelConfig.n_heads", "0"),
]


@pytest.mark.parametrize("kwargs, field, allowed", BAD_CONFIGS, ids=[str(k) for k, *_ in BAD_CONFIGS])
def test_a_config_the_code_cannot_build_is_refused_in_one_line(kwargs, field, allowed, monkeypatch):
    def no_tensors(*a, **k):
        raise AssertionError("a tensor was made before the config was checked")

    monkeypatch.setattr(torch, "randn", no_tensors)
    monkeypatch.setattr(torch, "zeros", no_tensors)
    with pytest.raises(ValueError) as err:
        ModelConfig(**kwargs).build()
    msg = str(err.value)
    assert field in msg and allowed in msg and "\n" not in msg, msg


def test_a_detector_on_a_model_without_attention_is_refused_in_one_line():
    model = Transformer(ModelConfig(n_layers=0, **TINY))
    for fn in (lambda: S.head_scores(model, None), lambda: S.positional_scores(model),
               lambda: S.duplicate_token_scores(model)):
        with pytest.raises(ValueError, match="n_layers=0") as err:
            fn()
        assert "\n" not in str(err.value)


def test_a_measure_written_for_one_kind_of_member_says_so(trained):
    from attncircuits.analysis.attribution import logit_attribution

    model, _ = trained["rotary-2l"]
    toks = repeated_rows(1, 8, 2, TINY["d_vocab"], 0)
    with pytest.raises(ValueError, match="positions='sinusoidal-qk'.*this model has positions='rotary'"):
        logit_attribution(model, toks)
    with pytest.raises(ValueError, match="LayerNorm"):
        require(trained["ln-mlp-3l"][0], "the path expansion", no_layernorm=True)


def test_circuits_read_from_the_weights_refuse_a_member_they_are_not_written_for(trained):
    from attncircuits.analysis.circuits.factored import full_ov_circuit, positional_qk_circuit
    from attncircuits.analysis.circuits.paths import attention_patterns_from_weights

    rotary, ln = trained["rotary-2l"][0], trained["ln-mlp-3l"][0]
    assert full_ov_circuit(rotary, 0, 0).A.shape[0] == TINY["d_vocab"]  # OV circuits need no positions
    with pytest.raises(ValueError, match="positions='sinusoidal-qk'.*this model has positions='rotary'") as err:
        positional_qk_circuit(rotary, 0, 0)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="attention-only models"):
        full_ov_circuit(ln, 0, 0)
    with pytest.raises(ValueError, match="positions="):
        attention_patterns_from_weights(rotary, repeated_rows(1, 8, 2, TINY["d_vocab"], 0))


def test_folding_with_positions_in_queries_and_keys_after_layernorm_keeps_the_values():
    """There the folded gain scales the positions' part of the queries and keys (as in
    TransformerLens), but what a head reads and writes (its values, its OV circuit) stays exact."""
    torch.manual_seed(0)
    model = ModelConfig(n_layers=2, d_mlp=32, layernorm=True, **{**TINY, "d_vocab": V}).build()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".w"):
                p.copy_(1 + 0.5 * torch.rand_like(p))
    toks = repeated_rows(2, 10, 2, V, 0)
    _, real = model.run_with_cache(toks)
    fm = model.folded()
    _, folded = fm.run_with_cache(toks, patterns={(l, h): real.pattern[l][:, h] for l in range(2) for h in range(4)})
    for layer in range(2):
        torch.testing.assert_close(folded.v[layer], real.v[layer], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fm(toks, patterns={(l, h): real.pattern[l][:, h] for l in range(2) for h in range(4)}),
                               model(toks), atol=1e-4, rtol=1e-4)  # with the real patterns, the same logits
