"""HeadWatch, the training callback: in a plain loop around a TransformerLens 4 model, against
TransformerLens's own forward pass, on the shipped model's induction heads, and its refusals."""

import re

import pytest
import torch

from attncircuits import load_pretrained
from attncircuits.analysis import scores as S
from attncircuits.data import repeated_rows
from attncircuits.models.transformer import ModelConfig
from attncircuits.train.watch import PROBE, HeadWatch
from lazy_tl import transformer_lens

tl = transformer_lens()


def tl_model(seed=0):
    cfg = tl.TransformerBridgeConfig(n_layers=2, d_model=32, d_head=8, n_heads=4, n_ctx=33, d_vocab=50,
                                     attn_only=True, normalization_type=None,
                                     positional_embedding_type="standard", seed=seed)
    return tl.TransformerBridge.boot_native(cfg)


def test_in_a_plain_training_loop_around_a_transformer_lens_model(capsys):
    model = tl_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch = HeadWatch(model, every=5, display="terminal")
    for step in range(12):
        toks = repeated_rows(8, 8, 4, 50, seed=step)
        loss = model(toks, return_type="loss")
        opt.zero_grad()
        loss.backward()
        opt.step()
        watch(step)
    assert [r["step"] for r in watch.rows] == [0, 5, 10]
    assert model.training  # put back as it was
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step      0, prefix-match") and len(out) >= 3
    assert re.search(r"prefix-match \d\.\d\d \(head \d\.\d\)", out[0])  # a head's name reads as one
    with pytest.raises(ValueError, match="unknown detectors"):
        HeadWatch(model, detectors=("induction",))
    gated = tl.TransformerBridge.boot_native(tl.TransformerBridgeConfig(
        n_layers=1, d_model=16, d_head=4, n_heads=4, n_ctx=17, d_vocab=20, attn_only=False, d_mlp=32, gated_mlp=True,
        act_fn="silu", normalization_type="RMS", seed=0))
    with pytest.raises(ValueError, match="gated MLPs"):  # what the family cannot represent, by name
        HeadWatch(gated)
    assert "no phase change" in watch.report() or "phase change at step" in watch.report()


def test_its_prefix_matching_score_is_transformer_lens_own_computation():
    """The score the callback reports, recomputed from TransformerLens's own attention patterns."""
    model = tl_model(1)
    row = HeadWatch(model, every=1, display="none", seq_len=8).score(0)
    toks = repeated_rows(16, 8, 4, 50, 0)  # the registry's probe: 16 rows, seed 0
    _, cache = model.run_with_cache(toks)
    target = S.prefix_match_targets(toks).float()
    for layer in range(2):
        mass = (cache["pattern", layer] * target[:, None]).sum(-1)[:, :, 9:].mean(dim=(0, 2))
        torch.testing.assert_close(row["prefix_matching"][layer], mass, atol=1e-6, rtol=1e-5)


def test_on_the_shipped_model_it_names_the_induction_heads_and_their_writers():
    model = load_pretrained("attn-only-2l").model
    watch = HeadWatch(model, every=100, display="none", threshold=0.5)
    watch(0)
    pc = watch.phase_change
    assert pc is not None and pc.step == 0
    assert sorted(h for h, _ in pc.induction_heads) == sorted(S.induction_heads(model, 0.5))
    assert all(w[0] == 0 and z > 3 for _, w, z in pc.writers)  # layer-0 writers far above chance
    assert "phase change at step 0" in watch.report()
    assert re.search(r"induction heads formed: head 1\.\d \(score \d\.\d\d\)", watch.report())
    assert re.search(r"K-composition from head 0\.\d into head 1\.\d \(z ", watch.report())


def test_a_notebook_shows_the_report_once_under_the_rows_and_their_windows():
    model = load_pretrained("attn-only-2l").model
    watch = HeadWatch(model, every=1, display="none", threshold=0.5)
    watch(0)
    watch(1)
    html = watch._html()
    assert html.count("phase change at step 0") == 1
    assert html.count("<img") == 1 and html.count("step      1, prefix-match") == 1
    assert watch.caption().endswith(":") and PROBE in watch.caption()


@pytest.mark.parametrize("kwargs, match", [
    (dict(every=0), "every"),
    (dict(threshold=0), "threshold"),
    (dict(display="gui"), "display='gui'"),
    (dict(seq_len=40), "maximum seq_len for 4 copies is 8"),
])
def test_bad_settings_are_refused_in_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        HeadWatch(tl_model(), **kwargs)
    assert "\n" not in str(err.value)


def test_a_model_without_attention_or_a_context_too_short_is_refused():
    with pytest.raises(ValueError, match="no attention layers"):
        HeadWatch(ModelConfig(n_layers=0, d_model=16, n_heads=2, d_vocab=20, n_ctx=16).build())
    with pytest.raises(ValueError, match="holds no 4 copies"):
        HeadWatch(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=6).build())
    with pytest.raises(TypeError, match="course model or a TransformerLens TransformerBridge"):
        HeadWatch(torch.nn.Linear(2, 2))
