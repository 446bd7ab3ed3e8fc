"""Chapter 14's machinery: the LLC adapter (attncircuits.analysis.llc) against devinterp's own
numbers and an exact Hessian, the stage rules (attncircuits.analysis.stages) on curves with known
answers, and the one-line errors of bad input. Tiny random models only; the tests that sample
need devinterp (the `stages` extra) and are skipped without it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attncircuits.analysis import llc as L
from attncircuits.analysis import stages as ST
from attncircuits.models.transformer import ModelConfig, Transformer


def tiny(n_layers=2, seed=0):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(n_layers=n_layers, d_model=8, n_heads=2, d_head=4, d_vocab=7, n_ctx=6))


def rows(n=32, seed=0):
    return torch.randint(0, 7, (n, 6), generator=torch.Generator().manual_seed(seed))


# ---- the LLC from a trace, and the verdict ---------------------------------------------------------
def test_llc_from_trace_leaves_out_diverged_chains_and_is_nan_when_all_diverged():
    t = np.array([[3.0, 3.2, 3.4], [3.0, 3.4, 3.6], [3.0, 9.0, np.nan]])
    expected = np.mean([100 * (np.mean([3.0, 3.2, 3.4]) - 3.0), 100 * (np.mean([3.0, 3.4, 3.6]) - 3.0)])
    assert L.llc_from_trace(t, 3.0, 100.0) == pytest.approx(expected)
    assert math.isnan(L.llc_from_trace(np.full((2, 3), np.nan), 3.0, 100.0))
    assert L.llc_from_trace(np.array([[1.0, np.inf]]), 1.0, 1.0) != L.llc_from_trace(np.array([[1.0, 2.0]]), 1.0, 1.0)


def test_the_verdict_names_each_kind_of_trace():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.02, (2, 40))
    flat = 3.0 + 0.3 * (1 - np.exp(-np.arange(40) / 3)) + noise
    assert L.verdict(flat, 3.0) == "flat"
    assert L.verdict(3.0 + np.linspace(0, 2, 40) + noise, 3.0) == "not flat"
    assert L.verdict(flat - 0.5, 3.0) == "negative"
    bad = flat.copy()
    bad[0, 7] = np.nan
    assert L.verdict(bad, 3.0) == L.verdict(bad - 0.5, 3.0) == "diverged"


def test_sampler_settings_refuse_values_that_cannot_sample():
    for bad in (dict(lr=0), dict(n_beta=-1.0), dict(localization=float("nan")), dict(chains=0), dict(draws=1.5)):
        with pytest.raises(ValueError, match="SamplerSettings"):
            L.SamplerSettings(**bad).check()


# ---- the Hessian's trace against the exact one ------------------------------------------------------
def test_hutchinson_trace_agrees_with_the_exact_hessian_of_a_tiny_model():
    model = tiny(1)
    data = rows(8)
    params = [p for p in model.parameters() if p.requires_grad]
    shapes = [p.shape for p in params]
    flat0 = torch.cat([p.detach().reshape(-1) for p in params])

    def loss_of(flat):
        out, i = {}, 0
        for (name, p), shape in zip([(n, p) for n, p in model.named_parameters() if p.requires_grad], shapes):
            k = math.prod(shape)
            out[name] = flat[i:i + k].reshape(shape)
            i += k
        logits = torch.func.functional_call(model, out, (data,))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 7), data[:, 1:].reshape(-1))

    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        exact = torch.autograd.functional.hessian(loss_of, flat0).diagonal().sum().item()
    est, se = L.hessian_trace(model, data, probes=300, batch_size=8)
    assert abs(est - exact) < 4 * se + 1e-3, (est, exact, se)


def test_too_few_rows_for_a_batch_is_one_line():
    with pytest.raises(ValueError, match="fewer than one batch of 16"):
        L.hessian_trace(tiny(), rows(5), batch_size=16)
    pytest.importorskip("datasets")
    with pytest.raises(ValueError, match="fewer than one batch of 16; pass at least 16 rows"):
        L.token_dataset(rows(5), 16)


def test_head_masks_move_only_the_heads_asked_for():
    model = tiny(2)
    masks = L.head_masks(model, [(1, 0)])
    assert set(masks) == {f"inner.blocks.1.{w}" for w in ("W_Q", "W_K", "W_V", "W_O")}
    for m in masks.values():
        assert m[0].all() and not m[1].any()
    with pytest.raises(ValueError, match=r"no attention weights for heads \[\(2, 0\)\]"):
        L.head_masks(model, [(2, 0)])


# ---- with devinterp -----------------------------------------------------------------------------
def test_the_estimate_is_devinterps_own_and_leaves_the_model_unchanged():
    pytest.importorskip("devinterp")
    model = tiny(2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    s = L.SamplerSettings(chains=2, draws=8, batch_size=8)
    est = L.estimate_llc(model, rows(32), s, progress=False)
    assert not est.failed and est.trace.shape == (2, 8)
    # the mean of devinterp's per-chain values is the LLC computed again from its trace
    assert est.llc == pytest.approx(L.llc_from_trace(est.trace, est.init_loss, s.n_beta), rel=1e-4, abs=1e-3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    head = L.estimate_llc(model, rows(32), s, heads=[(1, 1)], progress=False)
    assert math.isfinite(head.llc) and head.summary()["settings"]["draws"] == 8


def test_diverging_settings_are_named_never_averaged():
    pytest.importorskip("devinterp")
    with pytest.raises(ValueError, match="every chain diverged .* lower lr or raise localization"):
        L.estimate_llc(tiny(1), rows(32), L.SamplerSettings(lr=1e12, chains=2, draws=6, batch_size=8), progress=False)


def test_devinterp_missing_says_how_to_install_it(monkeypatch):
    import importlib

    real = importlib.import_module

    def fake(name, *a, **k):
        if name.startswith("devinterp"):
            raise ModuleNotFoundError(f"No module named '{name}'", name="devinterp")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[stages\]'"):
        L.require_devinterp()
    from attncircuits.train import stages

    assert stages.main(["--seeds", "0"]) == 2


# ---- the stage rules ----------------------------------------------------------------------------
def test_critical_points_place_a_turn_after_a_flat_stretch_at_its_start():
    assert ST.critical_points([0, 1, 2, 2, 1]) == [2]
    assert ST.critical_points([0, 1, 1, 1, 2]) == []
    assert ST.critical_points([3, 1, 2, 0]) == [1, 2]


def test_boundaries_find_planted_turns_and_ignore_noise_below_the_floor():
    steps = np.arange(40) * 25
    curve = np.concatenate([np.linspace(0, 100, 15), np.linspace(100, 60, 10), np.linspace(60, 160, 15)])
    noisy = curve + np.random.default_rng(0).normal(0, 2, 40)
    st = ST.boundaries(steps, noisy, min_swing=20)
    assert len(st.steps) == 2 and abs(st.index[0] - 14) <= 2 and abs(st.index[1] - 24) <= 2, st
    assert st.direction == [1, -1, 1]
    assert ST.boundaries(steps, noisy, min_swing=1000).steps == []


def test_a_curve_with_a_hole_is_refused_not_filled():
    with pytest.raises(ValueError, match=r"no value at steps \[20\]"):
        ST.boundaries([0, 10, 20, 30], [1.0, 2.0, float("nan"), 1.0], 0.1)


def test_stage_names_follow_the_stated_rule():
    base = dict(prefix_matching=0.05, prev_token=0.1, bigram_kl=2.0)
    assert ST.name_stage(base, {**base, "prefix_matching": 0.6}, 1) == "induction heads form"
    assert ST.name_stage(base, {**base, "prev_token": 0.3}, 1) == "previous-token heads form"
    assert ST.name_stage(base, {**base, "bigram_kl": 1.4}, 1) == "bigram statistics"
    assert ST.name_stage(base, {**base, "bigram_kl": 1.6}, 1) == "refinement"
    formed = {**base, "prefix_matching": 0.6}
    assert ST.name_stage(formed, {**formed, "prefix_matching": 0.7}, 1) == "the heads sharpen"
    assert ST.name_stage(base, base, -1) == "simplification" and ST.name_stage(base, base, 1) == "refinement"


def test_essential_dynamics_is_the_pca_of_the_centred_outputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 50))
    ed = ST.essential_dynamics(x, 2)
    xc = x - x.mean(0)
    u, s, vt = np.linalg.svd(xc, full_matrices=False)
    assert np.allclose(np.abs(ed.coords), np.abs(xc @ vt[:2].T)) and ed.explained.sum() <= 1


def test_in_context_predictor_copies_what_followed_the_last_occurrence():
    bigram = torch.log(torch.full((4, 4), 0.25))
    tokens = torch.tensor([[1, 2, 1, 3]])
    lp = ST.in_context_logprobs(tokens, bigram, 0.9).exp()
    assert torch.allclose(lp[0, 0], torch.full((4,), 0.25))  # token 1 not seen before
    assert lp[0, 2, 2] == pytest.approx(0.9 + 0.1 * 0.25)  # after the second 1: the 2 that followed


# ---- results files ------------------------------------------------------------------------------
def test_a_results_file_that_does_not_load_is_one_line(tmp_path):
    from attncircuits.train import stages

    with pytest.raises(FileNotFoundError, match="run `make stages`"):
        stages.load(2, 7, tmp_path)
    (tmp_path / stages.run_name(2, 7)).write_text("{not json")
    with pytest.raises(ValueError, match="is not a results file .* delete it and run `make stages` again"):
        stages.load(2, 7, tmp_path)


def test_the_committed_results_cover_three_seeds_and_the_control():
    from attncircuits.train import stages

    seeds = stages.recorded_seeds(2, stages.OUT)
    assert len(seeds) >= 3 and stages.recorded_seeds(1, stages.OUT) == [0]
    for s in seeds:
        run = stages.load(2, s, stages.OUT)
        assert len(run["points"]) >= 30 and run["points"][0]["step"] == 0
        assert all(math.isfinite(p["llc"]["llc"]) for p in run["points"])
    size = sum(p.stat().st_size for p in stages.OUT.glob("*.json"))
    assert size < 2_000_000, size  # small: JSON summaries, no weights
    calib = json.loads((stages.OUT / "calibration.json").read_text())
    assert calib["complete"] and len(calib["tried"]) >= 6
