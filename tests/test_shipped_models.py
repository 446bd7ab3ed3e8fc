"""The shipped checkpoints meet the targets the course relies on, measured on the shipped files."""

import platform

import pytest
import torch

from attncircuits import MODEL_NAMES, load_pretrained, loss_fn
from attncircuits.analysis.losses import repeated_token_loss
from attncircuits.analysis.scores import prefix_matching_scores, previous_token_scores
from attncircuits.checkpoints.pretrained import (
    PRETRAINED_DIR,
    corpus_info,
    load_train_bigram_counts,
    validation_windows,
)


@pytest.fixture(scope="module")
def models():
    return {name: load_pretrained(name).model for name in MODEL_NAMES}


@pytest.fixture(scope="module")
def val_windows():
    return validation_windows()[::8]  # ~320 disjoint windows of 128 tokens, every 8th


def test_total_size_fits_in_git():
    deeper = PRETRAINED_DIR / "ln-mlp-4l"  # chapter 10's model has a budget of its own
    size = sum(p.stat().st_size for p in PRETRAINED_DIR.rglob("*") if p.is_file() and deeper not in p.parents)
    assert size <= 25e6, f"the attention-only models and corpus take {size / 1e6:.1f} MB"
    size = sum(p.stat().st_size for p in deeper.rglob("*") if p.is_file())
    assert size <= 25e6, f"chapter 10's model takes {size / 1e6:.1f} MB"


def test_zero_layer_is_a_near_optimal_bigram_model(models):
    prev, nxt, count = load_train_bigram_counts()
    model = models["attn-only-0l"]
    with torch.no_grad():
        logp = (model.W_E @ model.W_U).log_softmax(-1)
    n = count.sum()
    model_loss = -(count * logp[prev, nxt]).sum() / n
    row = torch.zeros(model.cfg.d_vocab, dtype=torch.long).index_add_(0, prev, count)
    entropy = -(count * (count / row[prev]).log()).sum() / n
    assert model_loss <= 1.05 * entropy, (model_loss, entropy)


def test_loss_falls_with_depth(models, val_windows):
    with torch.no_grad():
        losses = [loss_fn(models[m](val_windows), val_windows).item() for m in MODEL_NAMES]
    assert losses[0] > losses[1] > losses[2]


def test_two_layer_model_has_induction_heads(models, val_windows):
    model = models["attn-only-2l"]
    assert previous_token_scores(model, val_windows[:64])[0].max() >= 0.5
    assert prefix_matching_scores(model)[1].max() >= 0.5
    assert repeated_token_loss(model).ratio <= 0.5


def test_one_layer_model_has_no_induction_heads(models):
    model = models["attn-only-1l"]
    assert prefix_matching_scores(model).max() < 0.2
    assert repeated_token_loss(model).ratio >= 0.8


@pytest.mark.skipif(
    corpus_info()["source"].split()[1] != platform.python_version(),
    reason="the default corpus is this Python's standard library; the shipped files were made with another",
)
def test_training_reproduces_the_shipped_history(monkeypatch):
    """`make train` on any machine gives the shipped run's first evaluations within REL_TOL.

    Same machine: reruns are bit-identical (test_train_and_checkpoints.py). Another CPU rounds
    differently from the first forward pass on: measured 7e-9 relative at steps 0 and 250 on one,
    and rounding differences grow with training, so the promise is on the early steps only, with
    a tolerance 1,000x the measured gap and far below what a change to the recipe moves (the data,
    the initialisation or the first 250 updates move these losses by more than 1e-3).
    """
    from attncircuits import data
    from attncircuits.checkpoints.pretrained import CORPUS_DIR
    from attncircuits.models.transformer import ModelConfig
    from attncircuits.train import loop as T
    from attncircuits.train.presets import PRESETS

    class Stop(Exception):
        pass

    seen, evaluate = [], T.evaluate

    def first_two(model, batches):
        out = evaluate(model, batches)
        seen.append(out["val_loss"])
        if len(seen) == 2:  # steps 0 and 250
            raise Stop
        return out

    monkeypatch.setattr(T, "evaluate", first_two)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the shipped models were trained with --threads 1
    try:
        model_kw, train_kw = PRESETS["attn-only-2l"]
        train_tokens, val_tokens, _ = T.corpus_streams(data.load_tokenizer(CORPUS_DIR / "tokenizer.json"))
        with pytest.raises(Stop):
            T.train(ModelConfig(**model_kw), T.TrainConfig(**train_kw), train_tokens, val_tokens, progress=False)
    finally:
        torch.set_num_threads(threads)
    shipped = load_pretrained("attn-only-2l").history["val_loss"][:2]
    gaps = [abs(a - b) / abs(b) for a, b in zip(seen, shipped)]
    print(f"relative gap to the shipped history at steps 0 and 250: {gaps}")
    assert max(gaps) <= REL_TOL, (seen, shipped)


#: promised agreement of a retrained run's first evaluations with the shipped history, any CPU
REL_TOL = 1e-5
