"""Chapter 13's pieces: the in-context Markov chains and their exact predictors, the clamps (targets,
the forward hook, the training loop's hook) and the Markov trainer; each bad input refused in one
line that names the fix."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attncircuits.data.markov import PREDICTORS, MarkovChains, cross_entropy, kl_to
from attncircuits.models.transformer import ModelConfig
from attncircuits.train import clamps, markov
from attncircuits.train.loop import TrainConfig, train


# ---- the generator and its predictors ---------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [
    ({"alpha": 0}, "alpha must be a finite number > 0"),
    ({"alpha": -1.0}, "alpha must be a finite number > 0"),
    ({"alpha": float("nan")}, "alpha must be a finite number > 0"),
    ({"alpha": "1"}, "alpha must be a finite number > 0"),
    ({"k": 1}, "k must be a whole number of symbols >= 2"),
    ({"k": 2.5}, "k must be a whole number of symbols >= 2"),
    ({"k": True}, "k must be a whole number of symbols >= 2"),
    ({"length": 2}, "length must be a whole number >= 3"),
    ({"length": 10.0}, "length must be a whole number >= 3"),
])
def test_the_generator_refuses_what_it_cannot_use_in_one_line(kw, words):
    with pytest.raises(ValueError, match=words) as err:
        MarkovChains(**kw)
    assert "\n" not in str(err.value)


def test_the_chains_follow_their_own_transition_tables():
    task = MarkovChains(k=3, length=4000, alpha=1.0)
    x, P = task.sample(2, seed=0)
    assert x.shape == (2, 4000) and x.dtype == torch.int64 and P.shape == (2, 3, 3)
    assert torch.allclose(P.sum(-1), torch.ones(2, 3), atol=1e-5)
    for b in range(2):
        counts = np.zeros((3, 3))
        np.add.at(counts, (x[b, :-1].numpy(), x[b, 1:].numpy()), 1)
        freq = counts / counts.sum(1, keepdims=True).clip(1)
        seen = counts.sum(1) > 200  # rows visited often enough to compare
        assert np.abs(freq - P[b].numpy())[seen].max() < 0.06
    again, _ = task.sample(2, seed=0)
    assert torch.equal(x, again)  # seeded


def _predict_by_loop(tokens, k, alpha):
    b, n = tokens.shape
    uni, bi = torch.zeros(b, n, k), torch.zeros(b, n, k)
    for i in range(b):
        for t in range(n):
            seen = torch.bincount(tokens[i, : t + 1], minlength=k).double()
            uni[i, t] = ((seen + alpha) / (t + 1 + k * alpha)).float()
            row = torch.zeros(k, dtype=torch.float64)
            for s in range(t):
                if tokens[i, s] == tokens[i, t]:
                    row[tokens[i, s + 1]] += 1
            bi[i, t] = ((row + alpha) / (row.sum() + k * alpha)).float()
    return uni, bi


def test_the_predictors_are_the_posterior_means_counted_by_hand():
    task = MarkovChains(k=4, length=12, alpha=0.5)
    x, _ = task.sample(3, seed=1)
    pred = task.predictors(x)
    uni, bi = _predict_by_loop(x, 4, 0.5)
    assert torch.allclose(pred["unigram"], uni, atol=1e-6) and torch.allclose(pred["bigram"], bi, atol=1e-6)
    assert torch.allclose(pred["uniform"], torch.full_like(uni, 0.25))
    assert all(torch.allclose(p.sum(-1), torch.ones(3, 12), atol=1e-5) for p in pred.values())


def test_the_bigram_is_the_best_predictor_and_kl_is_zero_to_itself():
    task = MarkovChains()
    x, _ = task.sample(256, seed=2)
    pred = task.predictors(x)
    loss = {p: cross_entropy(pred[p], x) for p in PREDICTORS}
    assert abs(loss["uniform"] - math.log(3)) < 1e-5
    assert loss["bigram"] < loss["unigram"] - 0.05 < loss["uniform"] - 0.1
    assert abs(kl_to(pred["bigram"], pred["bigram"].log())) < 1e-6  # float32 logs
    assert kl_to(pred["bigram"], pred["uniform"].log()) > 0.1


def test_the_predictors_refuse_tokens_outside_the_task():
    task = MarkovChains(k=3)
    with pytest.raises(ValueError, match="symbols 0..2"):
        task.predictors(torch.tensor([[0, 1, 3]]))
    with pytest.raises(TypeError, match="int64 tensor"):
        task.predictors([[0, 1, 2]])


# ---- the Markov trainer -----------------------------------------------------------------------------
def test_a_tiny_markov_run_logs_every_evaluation_and_names_its_stages():
    task = MarkovChains(k=2, length=8)
    recipe = markov.MarkovRecipe(d_model=8, batch_size=4, eval_every=2, eval_size=8)
    runs = markov.train_markov(task, (2, 1), {2: 4, 1: 6}, seed=0, recipe=recipe)
    assert runs[2].log["step"] == [0, 2, 4] and runs[1].log["step"] == [0, 2, 4, 6]
    assert set(runs[1].log) == {"step", "loss", *(f"kl_{p}" for p in PREDICTORS)}
    assert all(v >= -1e-6 for v in runs[2].log["kl_bigram"])
    log = {"step": [0, 25, 50, 75], "kl_uniform": [0.0, 0.3, 0.5, 0.4], "kl_unigram": [0.2, 0.1, 0.2, 0.3],
           "kl_bigram": [0.3, 0.2, 0.1, 0.2]}
    assert markov.stage_steps(log) == {"uniform": 0, "unigram": 25, "bigram": 50}
    with pytest.raises(ValueError, match="steps for the 2-layer model"):
        markov.train_markov(task, (2,), {2: 0}, recipe=recipe)


# ---- clamps -----------------------------------------------------------------------------------------
CFG = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=12)


@pytest.mark.parametrize("cfg, clamp, words", [
    (CFG, clamps.Clamp(1, 2, "induction"), "cannot clamp head 1.2: the model has layers 0..1 with heads 0..1"),
    (CFG, clamps.Clamp(2, 0, "previous"), "cannot clamp head 2.0"),
    (ModelConfig(n_layers=0, d_model=16, n_heads=2, d_vocab=20, n_ctx=12), clamps.Clamp(0, 0, "previous"),
     "no attention layers"),
    (CFG, clamps.Clamp(0, 0, "previous", distance=12), "does not fit a context of n_ctx=12"),
    (CFG, clamps.Clamp(0, 0, "previous", distance=0), "use a distance from 1 to 11"),
    (CFG, clamps.Clamp(0, 0, "next"), "is not one of 'previous', 'induction'"),
])
def test_a_clamp_the_model_cannot_take_is_refused_in_one_line(cfg, clamp, words):
    with pytest.raises(ValueError, match=words) as err:
        clamps.check_clamps(cfg, [clamp])
    assert "\n" not in str(err.value)


def test_the_same_head_clamped_twice_and_an_unknown_condition_are_refused():
    with pytest.raises(ValueError, match="clamped twice"):
        clamps.check_clamps(CFG, [clamps.Clamp(0, 0), clamps.Clamp(0, 0, "induction")])
    with pytest.raises(ValueError, match="unknown condition 'all'"):
        clamps.clamp_train("all")


def test_the_targets_are_causal_patterns_on_the_right_keys():
    tokens = torch.tensor([[5, 6, 5, 6, 7, 5]])
    prev = clamps.target_pattern(clamps.Clamp(0, 0, "previous"), tokens)[0]
    assert prev[0, 0] == 1 and all(prev[q, q - 1] == 1 for q in range(1, 6))
    ind = clamps.target_pattern(clamps.Clamp(1, 0, "induction"), tokens)[0]
    assert torch.allclose(ind.sum(-1), torch.ones(6)) and (ind.triu(1) == 0).all()
    assert torch.allclose(ind[2], torch.tensor([0, 1.0, 0, 0, 0, 0]))  # 5 was followed by 6 at key 1
    assert torch.allclose(ind[5], torch.tensor([0, 0.5, 0, 0.5, 0, 0]))  # after both earlier 5s
    assert torch.allclose(ind[1], torch.tensor([0.5, 0.5, 0, 0, 0, 0]))  # no earlier 6: the prefix, evenly
    two = clamps.target_pattern(clamps.Clamp(0, 0, "previous", distance=2), tokens)[0]
    assert two[1, 0] == 1 and two[4, 2] == 1


def test_a_clamp_replaces_the_heads_pattern_and_stops_its_query_key_gradient():
    torch.manual_seed(0)
    model = CFG.build()
    tokens = torch.randint(0, 20, (3, 12))
    held = clamps.clamp_patterns(clamps.CONDITIONS["both"], tokens)
    _, cache = model.run_with_cache(tokens, patterns=held)
    assert torch.equal(cache.pattern[0][:, 0], held[(0, 0)]) and torch.equal(cache.pattern[1][:, 0], held[(1, 0)])
    with torch.enable_grad():
        logits = model(tokens, patterns=held)
        logits.logsumexp(-1).mean().backward()
    for layer in (0, 1):
        assert model.blocks[layer].W_Q.grad[0].abs().max() == 0 and model.blocks[layer].W_K.grad[0].abs().max() == 0
        assert model.blocks[layer].W_Q.grad[1].abs().max() > 0  # the free head learns
    assert model.blocks[1].W_V.grad[0].abs().max() > 0  # the clamped head's values still learn


def test_the_training_loop_takes_the_clamp_as_a_hook():
    cfg = TrainConfig(steps=2, batch_size=2, eval_every=2, eval_batches=1, warmup_steps=0, random_repeat_frac=0.0,
                      repeat_frac=0.0)
    stream = np.random.default_rng(0).integers(0, 20, 400)
    seen = []

    def hook(batch):
        seen.append(batch.shape)
        return clamps.clamp_patterns(clamps.CONDITIONS["previous"], batch)

    model, history, _ = train(CFG, cfg, stream, stream, device="cpu", progress=False, patterns=hook)
    assert seen == [(2, 12), (2, 12)] and history["step"] == [0, 2]


def test_clamped_scores_measure_with_the_clamps_in_place():
    live = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=30, n_ctx=33)
    torch.manual_seed(0)
    model = live.build()
    free = clamps.clamped_scores(model)
    held = clamps.clamped_scores(model, clamps.CONDITIONS["induction"])
    assert held["prefix_matching"][1][0] > 0.99 > 0.5 > free["prefix_matching"][1][0]
    assert not clamps.formed(free)
