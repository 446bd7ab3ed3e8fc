"""The figures and the snapshot explorer of chapters 6 and 7: shapes, labels, bad input."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attncircuits import ModelConfig, Transformer, load_checkpoint  # noqa: E402
from attncircuits.checkpoints.pretrained import CORPUS_DIR, save_checkpoint, state_dict_for_save  # noqa: E402
from attncircuits.show.plotting import (  # noqa: E402
    eigen_scatter,
    head_patterns_grid,
    pattern_windows,
    phase_change_plot,
    position_loss_plot,
    score_heatmaps,
)
from attncircuits.show.widgets import snapshot_explorer, snapshot_steps_control  # noqa: E402


def test_head_patterns_grid():
    pats = torch.rand(5, 6, 6)
    fig = head_patterns_grid(pats, [f"h{i}" for i in range(5)], ncols=3, boundaries=[3])
    shown = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in shown] == ["h0", "h1", "h2", "h3", "h4"]
    np.testing.assert_allclose(shown[2].images[0].get_array(), pats[2].numpy())
    assert shown[0].images[0].get_clim() == (0.0, 1.0)
    plt.close(fig)
    with pytest.raises(ValueError, match="one title per pattern"):
        head_patterns_grid(pats, ["a"])
    with pytest.raises(ValueError, match=r"\[n_heads, query, key\]"):
        head_patterns_grid(pats[0], ["a"])


def test_pattern_windows_show_each_window_cell_by_cell_with_its_tokens():
    pats = torch.rand(2, 12, 12)
    tokens = [f"t{i}" for i in range(11)] + ["\x1a"]  # a control character shows as its code
    fig = pattern_windows(pats, tokens, [(6, 9, 1, 5), (8, 12, 0, 12)], ["a", "b"])
    shown = [ax for ax in fig.axes if ax.images]
    np.testing.assert_allclose(shown[0].images[0].get_array(), pats[0, 6:9, 1:5].numpy())
    assert shown[1].images[0].get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in shown[0].get_yticklabels()] == ["6\u00a0t6", "7\u00a0t7", "8\u00a0t8"]
    assert [t.get_text() for t in shown[0].get_xticklabels()] == ["t1\u00a01", "t2\u00a02", "t3\u00a03", "t4\u00a04"]
    assert shown[1].get_yticklabels()[-1].get_text() == "11\u00a0<0x1A>"
    plt.close(fig)
    with pytest.raises(ValueError, match="not inside 12 positions"):
        pattern_windows(pats, tokens, [(6, 13, 1, 5), (8, 12, 0, 12)], ["a", "b"])
    with pytest.raises(ValueError, match="one window and one title each"):
        pattern_windows(pats, tokens, [(6, 9, 1, 5)], ["a", "b"])
    with pytest.raises(ValueError, match="11 token labels for 12 positions"):
        pattern_windows(pats, tokens[:-1], [(6, 9, 1, 5), (8, 12, 0, 12)], ["a", "b"])


def test_live_token_strs_name_the_shipped_token_each_live_id_stands_for():
    from attncircuits.data import load_tokenizer, token_str
    from attncircuits.train.live import live_token_strs, vocab_map

    new = vocab_map(256)
    tok = load_tokenizer(CORPUS_DIR / "tokenizer.json")
    kept = int(np.nonzero(new == 7)[0][0])  # the shipped token that live id 7 stands for
    assert live_token_strs([0, 7, 255]) == [token_str(tok, 0), token_str(tok, kept), "<rare>"]


def test_position_loss_plot_and_score_heatmaps():
    fig = position_loss_plot({"a": [3.0, 2.0, 1.0], "b": torch.tensor([1.0, 1.0, 1.0])}, copy_starts=[2], hlines={"u": 4.0})
    lines = fig.axes[0].get_lines()
    assert list(lines[0].get_xdata()) == [1, 2, 3] and list(lines[0].get_ydata()) == [3.0, 2.0, 1.0]
    plt.close(fig)
    with pytest.raises(ValueError, match="at least one curve"):
        position_loss_plot({})
    fig = score_heatmaps({"x": torch.zeros(2, 3), "y": torch.ones(2, 3)})
    assert [ax.get_title() for ax in fig.axes] == ["x", "y"]
    assert len(fig.axes[0].texts) == 6
    plt.close(fig)
    with pytest.raises(ValueError, match="has shape"):
        score_heatmaps({"x": torch.zeros(2, 3), "y": torch.zeros(3, 2)})


def test_eigen_scatter_and_phase_change_plot():
    fig = eigen_scatter([0.9, -0.2], [0.8, 0.1], ["L1H0", "L1H1"], "ov", "qk", highlight=[0])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["L1H0", "L1H1"] and ax.get_xlim() == (-1.1, 1.1)
    plt.close(fig)
    with pytest.raises(ValueError, match="one entry per head"):
        eigen_scatter([0.1], [0.1, 0.2], ["a"], "x", "y")
    fig = phase_change_plot([0, 1, 2], {"loss": {"val": [3.0, None, 1.0]}, "score": {"a": [0, 1, 1]}}, vlines={"change": 1})
    assert len(fig.axes) == 2 and list(fig.axes[0].get_lines()[0].get_xdata()) == [0, 2]
    plt.close(fig)
    with pytest.raises(ValueError, match="x has 3"):
        phase_change_plot([0, 1, 2], {"loss": {"val": [1.0]}})


def test_snapshot_steps_control():
    assert snapshot_steps_control([0, 500, 1000]) == range(0, 1001, 500)
    assert snapshot_steps_control([1000, 0, 300]) == [0, 300, 1000]
    with pytest.raises(ValueError, match="no snapshots"):
        snapshot_steps_control([])


def test_snapshot_explorer_draws_each_snapshot(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=2048, n_ctx=16)
    snaps = {}
    for step in (0, 10, 20):
        snaps[step] = state_dict_for_save(Transformer(cfg))
    model = Transformer(cfg)
    ck = load_checkpoint(save_checkpoint(model, tmp_path / "ck", CORPUS_DIR / "tokenizer.json", snapshots=snaps))
    toks = torch.randint(1, 2048, (2, 9))
    ex = snapshot_explorer(ck, toks, layer=1, initial=10)
    assert ex.values == {"step": 10} and ex.options["step"] == [0, 10, 20]
    fig = ex.render(step=20)
    assert fig._suptitle.get_text() == "layer 1 at training step 20" and len([a for a in fig.axes if a.images]) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="not an option"):
        ex.render(step=15)
    with pytest.raises(IndexError, match="valid layers"):
        snapshot_explorer(ck, toks, layer=2)
    fig = snapshot_explorer(ck, toks, layer=1, window=(4, 8, 0, 5)).render(step=0)  # a window, labelled
    shown = [a for a in fig.axes if a.images]
    assert len(shown) == 2 and {im.get_array().shape for a in shown for im in a.images} == {(4, 5)}
    assert shown[0].get_yticklabels()[0].get_text().startswith("4\u00a0")
    plt.close(fig)


def test_snapshot_explorer_reads_a_1d_row_as_one_row(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=2048, n_ctx=16)
    snaps = {step: state_dict_for_save(Transformer(cfg)) for step in (0, 10)}
    ck = load_checkpoint(save_checkpoint(Transformer(cfg), tmp_path / "ck", CORPUS_DIR / "tokenizer.json", snapshots=snaps))
    fig = snapshot_explorer(ck, torch.randint(1, 2048, (9,)), layer=1).render()  # one row of 9 tokens
    assert {im.get_array().shape for a in fig.axes for im in a.images} == {(9, 9)}  # once 1 x 1
    plt.close(fig)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        snapshot_explorer(ck, [5, 4096], layer=1)
