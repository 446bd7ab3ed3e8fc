"""Chapter 10's measures (attncircuits.analysis.deeper) on tiny family members with LayerNorm, MLPs and
biases, each against an independent computation; loading such a model refuses bad input."""

import dataclasses
import importlib.metadata

import pytest
import torch

from attncircuits import load_checkpoint  # noqa: E402
from attncircuits.analysis import deeper as D  # noqa: E402
from attncircuits.analysis.circuits import composition_scores  # noqa: E402
from attncircuits.checkpoints.pretrained import CORPUS_DIR, save_checkpoint  # noqa: E402
from attncircuits.models.parts import loss_fn  # noqa: E402
from attncircuits.models.transformer import ModelConfig  # noqa: E402
from learner_copy import learner_copy  # noqa: E402

SMALL = ModelConfig(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=48, n_ctx=20, d_vocab=53, layernorm=True,
                    biases=True, positions="learned")


def tiny(seed=0, cfg=SMALL):
    """A random model whose LayerNorms and biases are not the identity and zero they start at, so
    a test that forgets one of them fails."""
    torch.manual_seed(seed)
    model = cfg.build()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("ln") and name.endswith(".w"):
                p.copy_(1 + 0.5 * torch.rand_like(p))
            elif ".b_" in name or name.endswith(".b") or name == "b_U":
                p.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, SMALL.d_vocab, (3, SMALL.n_ctx), generator=torch.Generator().manual_seed(1))


def test_folding_keeps_the_logits(model, tokens):
    with torch.no_grad():
        real, folded = model(tokens), model.folded()(tokens)
    assert (real.log_softmax(-1) - folded.log_softmax(-1)).abs().max() < 1e-4


def test_fold_ln_into_gives_the_folded_models_weights_up_to_centring(model):
    fm = model.folded()
    for layer in range(SMALL.n_layers):
        block, ln = model.blocks[layer], model.ln_attn[layer]
        for name in ("Q", "K"):
            W, b = getattr(block, f"W_{name}"), getattr(block, f"b_{name}")
            W_f, b_f = D.fold_ln_into(ln.w, ln.b, W, b)
            # the folded model keeps the all-ones direction, which a LayerNorm's output never has
            ours = getattr(fm.blocks[layer], f"W_{name}")
            assert torch.allclose(W_f, ours - ours.mean(-2, keepdim=True), atol=1e-5)
            assert torch.allclose(b_f, getattr(fm.blocks[layer], f"b_{name}"), atol=1e-5)


def test_fold_ln_into_is_the_layer_norm_then_the_weight():
    """Independently: applying LN (gain, bias) and then W equals the normalised input times the
    folded weight, for any input."""
    g = torch.Generator().manual_seed(2)
    w_ln, b_ln = 1 + torch.rand(16, generator=g), torch.randn(16, generator=g)
    W, b = torch.randn(2, 16, 5, generator=g), torch.randn(2, 5, generator=g)
    x = torch.randn(7, 16, generator=g)
    x_hat = (x - x.mean(-1, keepdim=True)) / x.var(-1, unbiased=False, keepdim=True).add(1e-5).sqrt()
    W_f, b_f = D.fold_ln_into(w_ln, b_ln, W, b)
    expected = torch.einsum("nd,hde->hne", x_hat * w_ln + b_ln, W) + b[:, None]
    assert torch.allclose(torch.einsum("nd,hde->hne", x_hat, W_f) + b_f[:, None], expected, atol=1e-5)


def test_frozen_ln_sums_to_the_layer_norm_and_matches_transformer_lens(model, tokens):
    g = torch.Generator().manual_seed(3)
    parts = torch.randn(4, 2, 5, 12, generator=g)
    resid = parts.sum(0)
    x_hat = (resid - resid.mean(-1, keepdim=True)) / resid.var(-1, unbiased=False, keepdim=True).add(1e-5).sqrt()
    assert torch.allclose(D.frozen_ln(parts, resid).sum(0), x_hat, atol=1e-5)
    fm = model.folded()
    with torch.no_grad():
        stack, _, resid = D.writers(fm, tokens)
        assert torch.allclose(stack.sum(0), resid, atol=1e-4)
        # through the final LayerNorm (gain folded away): the frozen-scale parts sum to its output
        assert torch.allclose(D.frozen_ln(stack, resid).sum(0), fm.ln_final(resid), atol=1e-4)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal-qk"])
def test_logit_shares_sum_to_the_correct_tokens_logit(positions, tokens):
    model = tiny(cfg=dataclasses.replace(SMALL, positions=positions))
    shares = D.logit_shares(model, tokens)
    with torch.no_grad():
        logits = model(tokens)[:, :-1]
    # folding centres W_U: the logits are measured from their mean over the vocabulary
    real = (logits - logits.mean(-1, keepdim=True)).gather(-1, tokens[:, 1:, None]).mean().item()
    assert abs(shares.logit - real) < 1e-3 * max(1.0, abs(real))
    assert abs(float(shares.contributions.sum()) - shares.logit) < 1e-4
    n_heads = SMALL.n_layers * SMALL.n_heads
    assert len(shares.labels) == (positions == "learned") + 1 + n_heads + SMALL.n_layers + 2
    total = shares.direct() + shares.heads() + shares.group("mlp") + shares.share("bias") + shares.share("b_U")
    assert abs(total - 1) < 1e-4


def test_attention_only_gap(model, tokens):
    gap = D.attention_only_gap(model, tokens)
    with torch.no_grad():
        real = loss_fn(model(tokens), tokens).item()
    assert abs(gap.loss - real) < 1e-4 and gap.reconstruction_error < 1e-3
    assert gap.logit_error > 0.01  # random MLPs write to the logits: dropping them changes something
    attn_only = tiny(cfg=ModelConfig(n_layers=1, d_model=16, d_head=4, n_heads=4, n_ctx=8, d_vocab=20,
                                     layernorm=True, biases=True, positions="learned"))
    toks = torch.randint(0, 20, (2, 8))
    none = D.attention_only_gap(attn_only, toks)  # nothing to drop: the expansion is exact
    assert none.logit_error < 1e-4 and abs(none.loss_attention_only - none.loss) < 1e-4


@pytest.mark.parametrize(
    "values, bump",
    [
        ([5.0, 4.0, 3.0, 2.5], 0.0),
        ([5.0, 4.0, 4.3, 3.0], 0.3),  # one rise
        ([5.0, 4.0, 4.1, 4.2, 4.25, 3.0], 0.25),  # a slow rise over several evaluations
        ([5.0, 3.0, 3.2, 2.0, 2.6, 1.0], 0.6),  # the larger of two
        ([4.0, None, 4.5, 3.0], 0.5),
        ([2.0], 0.0),
    ],
)
def test_loss_bump(values, bump):
    assert D.loss_bump(values) == pytest.approx(bump)


def test_loss_bump_refuses_an_empty_curve():
    with pytest.raises(ValueError, match="empty"):
        D.loss_bump([None])


def test_rank_correlation():
    x = torch.tensor([[0.1, 0.5], [0.9, 0.2]])
    assert D.rank_correlation(x, x * 3 + 1) == pytest.approx(1.0)
    assert D.rank_correlation(x, -x) == pytest.approx(-1.0)
    assert D.rank_correlation(x, torch.tensor([[0.1, 0.2], [0.9, 0.5]])) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="one shape"):
        D.rank_correlation(x, x.flatten())


def test_composition_scores_refuse_a_reader_below_the_writer(model):
    with pytest.raises(ValueError, match="must come before"):
        composition_scores(model, 1, 0)
    scores = composition_scores(model, 0, 1, n_baseline=20)
    assert scores.k.shape == (SMALL.n_heads, SMALL.n_heads) and ((scores.k >= 0) & (scores.k <= 1)).all()


def test_mean_ablation_writes_the_mean_z_through_w_o(model, tokens):
    means = D.mean_z(model, tokens)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, ablate=D.head_ablation(model, [(1, 2)], means))
        expected = means[1][2] @ model.W_O[1, 2]
        assert torch.allclose(cache.head_out[1][:, :, 2], expected.expand_as(cache.head_out[1][:, :, 2]), atol=1e-6)
        ablated = model(tokens, ablate=D.head_ablation(model, [(0, 0)]))
        assert not torch.allclose(ablated, model(tokens))


def test_the_path_expansion_refuses_this_model_naming_its_parts(model):
    from attncircuits.models.interface import PATH_EXPANSION, require

    with pytest.raises(ValueError, match="needs positions=.*this model has positions=.learned."):
        require(model, "the path expansion", **PATH_EXPANSION)


SAVED = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=12, layernorm=True,
                    biases=True)  # the course's vocabulary


@pytest.fixture()
def saved(tmp_path):
    return save_checkpoint(tiny(cfg=SAVED), tmp_path / "ln-mlp", CORPUS_DIR / "tokenizer.json")


def test_a_saved_model_loads_back(saved, tokens):
    loaded = load_checkpoint(saved).model
    with torch.no_grad():
        assert (loaded(tokens[:, :12]) - tiny(cfg=SAVED)(tokens[:, :12])).abs().max() < 0.05  # stored as float16


def test_loading_needs_no_transformer_lens(saved, monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert load_checkpoint(saved).model.cfg == SAVED


def test_a_corrupted_weights_file_gives_the_manifest_error(saved):
    path = saved / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte in the weights
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors.*(hash|SHA|manifest|sha256)"):
        load_checkpoint(saved)


_FOLD = learner_copy(D.fold_ln_into)  # the learner's own fold_ln_into (the package's is withheld)


def _fold_no_centre(w, b_ln, W, b):
    return w[:, None] * W, b + torch.einsum("d,...de->...e", b_ln, W)


def _fold_scaled_bias(w, b_ln, W, b):
    W_f = w[:, None] * W
    return W_f - W_f.mean(-2, keepdim=True), b + torch.einsum("d,...de->...e", b_ln * w, W)


def _ln_own_scale(comps, resid):
    c = comps - comps.mean(-1, keepdim=True)
    return c / (c.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()


def _ln_unbiased(comps, resid):
    return (comps - comps.mean(-1, keepdim=True)) / (resid.var(-1, keepdim=True) + 1e-5).sqrt()


def _bump_one_step(values):
    v = [x for x in values if x is not None]
    return max([0.0] + [b - a for a, b in zip(v, v[1:])])


def _bump_first(values):
    v = [x for x in values if x is not None]
    for j in range(1, len(v)):
        if v[j] > min(v[:j]):
            top = j
            while top + 1 < len(v) and v[top + 1] >= v[top]:
                top += 1
            return v[top] - min(v[:j])
    return 0.0


@pytest.mark.parametrize(
    "check, fn, message",
    [
        ("check_fold_ln_into", _FOLD, "correct on 26 cases"),
        ("check_fold_ln_into", D.fold_ln_into, "the package's own answer"),
        ("check_fold_ln_into", _fold_no_centre, "not centred"),
        ("check_fold_ln_into", _fold_scaled_bias, "b_ln @ W, not (w_ln * b_ln) @ W"),
        ("check_fold_ln_into", lambda w, b_ln, W, b: _FOLD(w, b_ln, W, b)[0], "tuple"),
        ("check_frozen_ln", learner_copy(D.frozen_ln), "correct on 26 cases"),
        ("check_frozen_ln", D.frozen_ln, "the package's own answer"),
        ("check_frozen_ln", _ln_own_scale, "its own scale"),
        ("check_frozen_ln", _ln_unbiased, "unbiased variance"),
        ("check_frozen_ln", lambda c, r: c - c.mean(-1, keepdim=True), "not divided"),
        ("check_loss_bump", learner_copy(D.loss_bump), "correct on 29 cases"),
        ("check_loss_bump", D.loss_bump, "the package's own answer"),
        ("check_loss_bump", _bump_one_step, "consecutive"),
        ("check_loss_bump", lambda v: max(x for x in v if x is not None) - min(x for x in v if x is not None), "ignores order"),
        ("check_loss_bump", _bump_first, "first bump only"),
        ("check_loss_bump", lambda v: max(v) - min(v), "ignores order"),
    ],
)
def test_chapter_10s_checks_name_the_mistake(check, fn, message, capsys):
    from attncircuits.course.exercises import ch10

    ok = getattr(ch10, check)(fn)
    out = capsys.readouterr().out
    assert ok == message.startswith("correct") and message in " ".join(out.split()), out


def test_histories_side_by_side_refuses_mismatched_runs():
    from attncircuits.show.plotting import histories_side_by_side

    with pytest.raises(ValueError, match="same rows"):
        histories_side_by_side({"a": ([0, 1], {"loss": [1, 2]}), "b": ([0, 1], {"ICL": [1, 2]})})
    with pytest.raises(ValueError, match="2 values but x has 3"):
        histories_side_by_side({"a": ([0, 1, 2], {"loss": [1, 2]})})


def test_chapter_10s_solutions_pass_and_its_stubs_are_not_attempted_yet():
    """tests/test_chapters.py leaves the TransformerLens chapters to nbval; chapter 10's checks run
    here, with the extra installed."""
    import json
    from pathlib import Path

    from attncircuits.course.exercises.make_learner import learner_notebook
    from tests.test_chapters import _run_exercises

    path = Path(__file__).resolve().parents[1] / "notebooks" / "10_deeper_model.ipynb"
    solved = json.loads(path.read_text())
    results = _run_exercises(solved)
    assert len(results) >= 3
    for out, value in results:
        assert value is True and "correct on" in out and len(out.rstrip("\n")) <= 79, out
    for out, value in _run_exercises(learner_notebook(solved, path.name)):
        assert value is False and "not attempted yet" in out, out
