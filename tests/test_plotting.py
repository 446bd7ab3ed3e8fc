"""plotting: figures get the right shapes and labels, are legible in the book's column and show
once in a notebook; the HTML views are script-free and mark every token visibly."""

import re
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

from attncircuits import load_pretrained
from attncircuits.checkpoints.pretrained import frequent_tokens  # noqa: E402
from attncircuits.core.heads import head_name  # noqa: E402
from attncircuits.data import decode, token_str, token_strs  # noqa: E402
from attncircuits.show import plotting  # noqa: E402
from attncircuits.show.plotting import (  # noqa: E402
    COLUMN_PX,
    MIN_TEXT_PX,
    attention_heatmap,
    loss_curve,
    smallest_text_px,
    tokens_html,
)
from attncircuits.show.plotting.base import legibility, shown_width_px  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_attention_heatmap_labels_and_scale():
    pat = torch.tril(torch.rand(4, 4))
    fig = attention_heatmap(pat, ["a", " b", "\n", "c"], title="head 0.1")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "·b", "⏎", "c"]
    assert ax.get_title() == "head 0.1"
    assert ax.images[0].get_clim() == (0.0, 1.0)  # fixed scale: heads comparable by colour
    np.testing.assert_allclose(ax.images[0].get_array(), pat.numpy())


def test_attention_heatmap_bad_input():
    with pytest.raises(ValueError, match="one label per position"):
        attention_heatmap(np.eye(3), ["a", "b"])
    with pytest.raises(ValueError, match="pick one batch row and head"):
        attention_heatmap(np.ones((1, 3, 3)), ["a", "b", "c"])


def test_loss_curve_skips_missing_points_labels_levels_beside_and_checks_keys():
    hist = {"tokens": [0, 10, 20], "train_loss": [None, 5.0, 4.0], "val_loss": [8.0, 6.0, 5.0]}
    fig = loss_curve(hist, hlines={"uniform": 9.0, "unigram": 7.0})
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert list(lines[0].get_xdata()) == [10, 20] and list(lines[1].get_ydata()) == [8.0, 6.0, 5.0]
    # the level labels sit just right of the axes, where no data is drawn, inside the figure (not
    # cut off), each at its level's height
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    box = ax.get_window_extent(renderer)
    for t, level in zip(ax.texts, (9.0, 7.0)):
        ext = t.get_window_extent(renderer)
        assert box.x1 <= ext.x0 and ext.x1 <= fig.bbox.x1, t.get_text()
        y = ax.transData.transform((0, level))[1]
        assert ext.y0 <= y <= ext.y1, t.get_text()
    with pytest.raises(KeyError, match="available"):
        loss_curve(hist, keys=("nope",))


def test_tokens_html_is_plain_html_with_visible_whitespace():
    out = tokens_html(["def", " f", "(", "):\n", "<b>"], [0.0, 0.5, 1.0, 0.25, 0.0], highlight=2, title="head 0.0")
    text = out.data
    assert "<script" not in text.lower() and "javascript" not in text.lower()
    assert not re.search(r"\son\w+\s*=", text)  # no event handlers either
    assert "·f" in text and "):⏎" in text and "<br>" in text
    assert "&lt;b&gt;" in text  # token text is escaped, never interpreted as markup
    alphas = [float(a) for a in re.findall(r"rgba\(31,119,180,([0-9.]+)\)", text)]
    assert alphas == [0.0, 0.5, 1.0, 0.25, 0.0]  # shade is weight / max weight
    assert text.count("outline:") == 1 and 'title="position 2: 1.000"' in text
    assert out._repr_html_() == text  # displays as text/html in notebooks and the book


def test_tokens_html_signed_weights_and_bad_input():
    text = tokens_html(["a", "b"], torch.tensor([-2.0, 1.0])).data
    assert "rgba(214,39,40,1.000)" in text and "rgba(31,119,180,0.500)" in text
    with pytest.raises(ValueError, match="one weight per token"):
        tokens_html(["a", "b"], [1.0])
    with pytest.raises(IndexError, match="use 0..1"):
        tokens_html(["a", "b"], [1.0, 0.0], highlight=5)


def test_html_tables_box_every_token_so_underscores_and_spaces_stay_in_their_cell():
    text = plotting.html_table(["pos", "current", "p"], [(1, "_", 0.5), (2, " x ", 0.25), (3, "<i>", 1.0)],
                               token_columns=["current"]).data
    cells = re.findall(r"<code style=\"([^\"]*)\">([^<]*)</code>", text)
    assert [c for _, c in cells] == ["_", "·x·", "&lt;i&gt;"]  # spaces visible, markup escaped
    assert all("background" in style and "padding" in style for style, _ in cells)  # a visible box
    assert "<td style='text-align:right'>0.50</td>" in text and "<script" not in text
    html = plotting.skip_trigram_table_html([("0.1", "a", "b", "c", 1.5)], ["head", "source", "… dest", "→ out", "score"]).data
    assert html.count("<code") == 3 and "<td style='text-align:left'>0.1</td>" in html  # a head is no token
    with pytest.raises(ValueError, match="3 cells for 2 columns"):
        plotting.html_table(["a", "b"], [(1, 2, 3)])


def test_byte_tokens_that_are_not_utf8_alone_show_their_bytes():
    tok = load_pretrained("attn-only-2l").tokenizer
    partial = [i for i in range(tok.get_vocab_size()) if "\ufffd" in decode(tok, [i])]
    assert partial, "the shipped tokenizer has byte pieces of multi-byte characters"
    labels = token_strs(tok, partial)
    assert all(re.fullmatch(r"(<0x[0-9A-F]{2}>|[^\ufffd])+", s) for s in labels), labels[:5]
    assert token_str(tok, tok.token_to_id("Ġthe") or 0) != ""  # ordinary tokens are unchanged


def test_circuit_heatmap_scale_signed_vs_norms():
    signed = plotting.circuit_heatmap(np.array([[1.0, -3.0], [2.0, 0.0]]), ["a", "b"], ["c", "d"])
    im = signed.axes[0].images[0]
    assert im.get_clim() == (-3.0, 3.0) and im.get_cmap().name == "RdBu_r"
    norms = plotting.circuit_heatmap(np.array([[1.0, 13.0], [2.0, 0.5]]), ["a", "b"], ["c", "d"])
    im = norms.axes[0].images[0]
    assert im.get_clim() == (0.0, 13.0) and im.get_cmap().name == "viridis"  # sequential, from 0


def test_eigen_scatter_labels_never_overlap_and_ticks_are_spaced():
    x, y = [0.9, 0.91, 0.9, 0.92, -0.2], [0.8, 0.8, 0.82, 0.81, 0.1]
    fig = plotting.eigen_scatter(x, y, [head_name(1, h) for h in range(5)], "OV", "QK", highlight=[0])
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert [t.get_text() for t in ax.texts] == ["1.0", "1.1", "1.2", "1.3", "1.4"]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["-1", "-0.5", "0", "0.5", "1"]


def test_eigenvalue_planes_keep_every_point_inside_and_explain_the_colours():
    lam = [torch.tensor([5.0 + 0j, -0.1 + 2j, -0.1 - 2j, 0.01]), torch.tensor([-3.0 + 0j, 0.2])]
    fig = plotting.eigenvalue_planes(lam, [0.9, -0.8], ["head 0.0", "head 0.1"], [True, False])
    for ax, l in zip(fig.axes, lam):
        lo, hi = ax.get_xlim()
        assert lo < l.real.min() * 1.5 and l.real.abs().max() * 1.5 < hi  # a margin, not on the frame
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["Re λ ≥ 0 (copying)", "Re λ < 0"] and "copying head" in labels


def test_composition_titles_clear_the_colorbars():
    m = np.random.default_rng(0).random((4, 4))
    fig = plotting.composition_heatmaps({k: m for k in "QKV"}, {k: 0.2 for k in "QKV"}, {k: 0.05 for k in "QKV"},
                                        [f"0.{h}" for h in range(4)], [f"1.{h}" for h in range(4)], title="scores")
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    heat = [ax for ax in fig.axes if ax.images]
    bars = [ax for ax in fig.axes if not ax.images]
    assert len(heat) == 3 and len(bars) == 3
    for ax in heat:
        title = ax.title.get_window_extent(renderer)
        assert not any(title.overlaps(cb.get_window_extent(renderer)) for cb in bars), ax.get_title()


# ---- legibility: every figure function at the calls the chapters make -------------------------
def _chapter_figures():
    """Each figure function called as the chapters call it, on the shipped models' tokens."""
    ck1, ck2 = load_pretrained("attn-only-1l"), load_pretrained("attn-only-2l")
    tok = ck2.tokenizer
    rng = np.random.default_rng(0)
    words = token_strs(tok, frequent_tokens(tok, 20).tolist())
    text = token_strs(tok, list(range(300, 364)))
    h1 = [head_name(1, h) for h in range(4)]
    yield "attention_heatmap, 24 tokens", lambda: attention_heatmap(np.tril(rng.random((24, 24))), text[:24], title="head 0.1 on a line of code")
    yield "attention_heatmap, 64 tokens", lambda: attention_heatmap(np.tril(rng.random((64, 64))), text, title="head 1.2")
    yield "loss_curve", lambda: loss_curve({"tokens": list(range(0, 3_000_000, 100_000)), "train_loss": list(rng.random(30) + 4),
                                           "val_loss": list(rng.random(30) + 4)}, hlines={"uniform": 7.62, "unigram": 6.1},
                                          title="training attn-only-2l for 300 steps")
    yield "bigram_scatter", lambda: plotting.bigram_scatter(rng.normal(size=5000), rng.normal(size=5000), rng.random(5000) * 100,
                                                            "log p from the weights", "log p counted", title="weights vs counts")
    yield "next_token_bars", lambda: plotting.next_token_bars({"from the weights (W_E @ W_U)": (words[:8], np.sort(rng.random(8))[::-1] / 4),
                                                               "counted (training split)": (words[8:16], np.sort(rng.random(8))[::-1] / 4)},
                                                              title="next tokens after ·self")
    yield "path_terms_heatmap", lambda: plotting.path_terms_heatmap(rng.normal(size=(18, 5)) * 3, ["direct"] + [f"head 0.{h}" for h in range(4)],
                                                                    [f"{a}\u2009→\u2009{b}" for a, b in zip(words, words[1:19])],
                                                                    title="contribution to the true next token's logit (centred)")
    yield "heatmap_grid, 8 circuits", lambda: plotting.heatmap_grid([rng.normal(size=(18, 18)) for _ in range(8)],
                                                                    [f"{k} circuit, head 0.{h}" for h in range(4) for k in ("OV", "QK")],
                                                                    words[:18], words[:18], xlabels=["output logit", "source (key)"] * 4,
                                                                    ylabels=["source (attended to)", "destination (query)"] * 4)
    yield "circuit_heatmap, norms", lambda: plotting.circuit_heatmap(rng.random((4, 4)) * 13, [f"0.{h}" for h in range(4)], h1,
                                                                     title="virtual heads b∘a: logit size", xlabel="layer-1 head b (reads)",
                                                                     ylabel="layer-0 head a (writes)", colorbar_label="mean logit norm")
    yield "grouped_bars", lambda: plotting.grouped_bars([f"0.{h}" for h in range(4)], {f"{n}, {s}": rng.random(4) for n in ("current", "previous", "two back")
                                                                                        for s in ("from W_pos", "on text")},
                                                        ylabel="mean attention", title="attention to the last three tokens: positions alone vs real text")
    yield "grouped_bars, legend below", lambda: plotting.grouped_bars(
        ["direct path\n(vs uniform)", "+ single\nheads", "+ virtual\nheads", "layer-0 heads\n(to direct)", "layer-1 heads\n(to direct)"],
        {"ours": rng.random(5) * 3, "paper (2 layers of 12 heads)": rng.random(5) * 3}, title="what each set of terms buys (nats per token)",
        ylabel="loss reduction (nats)", legend_below=True)
    yield "eigenvalue_planes", lambda: plotting.eigenvalue_planes([torch.randn(32, dtype=torch.complex64) * 10 for _ in range(4)],
                                                                  rng.random(4), [f"head 0.{h}" for h in range(4)], [True, False, True, False])
    yield "composition_heatmaps", lambda: plotting.composition_heatmaps({k: rng.random((4, 4)) for k in "QKV"}, {k: 0.2 for k in "QKV"},
                                                                        {k: 0.05 for k in "QKV"}, [f"0.{h}" for h in range(4)], h1,
                                                                        title="composition scores (white = random baseline; framed: > baseline + 3 std)")
    yield "head_patterns_grid", lambda: plotting.head_patterns_grid(rng.random((4, 128, 128)), [f"head {h}" for h in h1], boundaries=[64],
                                                                    suptitle="layer 1 at training step 3000")
    yield "position_loss_plot", lambda: plotting.position_loss_plot({"attn-only-2l": rng.random(127) * 7, "attn-only-1l": rng.random(127) * 7},
                                                                    copy_starts=[64], hlines={"uniform": 7.62}, title="loss on repeated random tokens")
    yield "score_heatmaps", lambda: plotting.score_heatmaps({"previous-token": rng.random((2, 4)), "prefix-matching": rng.random((2, 4)),
                                                             "copying": rng.random((2, 4)) * 2 - 1})
    yield "eigen_scatter", lambda: plotting.eigen_scatter(rng.random(4), rng.random(4), h1, "OV circuit: eigenvalue positivity (copying)",
                                                          "QK circuit (K-composition): eigenvalue positivity", highlight=[0])
    yield "phase_change_plot", lambda: plotting.phase_change_plot(list(range(0, 40)), {"loss": {"val": list(rng.random(40))},
                                                                                       "prefix matching": {h: list(rng.random(40)) for h in h1},
                                                                                       "in-context learning": {"score": list(rng.random(40))}},
                                                                  vlines={"phase change": 20})
    run = (list(range(40)), {"validation loss": list(rng.random(40)), "ICL score": [None] + list(rng.random(39))})
    yield "histories_side_by_side", lambda: plotting.histories_side_by_side({"attn-only-2l": run, "ln-mlp-4l": run},
                                                                            vlines={"ln-mlp-4l": 20})
    x = np.arange(97) * 25 * 1024 / 1e6  # chapter 11: 15 members, 97 snapshots
    rise = lambda at: 0.06 + 0.85 / (1 + np.exp(-(x - at) * 12))  # noqa: E731
    panels = {g: {f"{n}l": (x, rise(0.4 + 0.15 * n) if n > 1 else x * 0 + 0.07, (0.4 + 0.15 * n, 0.5 + 0.15 * n) if n > 1 else None)
                  for n in range(1, 7)} for g in ("attention only", "MLPs and LayerNorm")}
    panels["2 layers: positions"] = {s: (x, rise(0.6 + 0.2 * i) if s != "none" else x * 0.1 + 0.05, None)
                                     for i, s in enumerate(("sinusoidal-qk", "learned", "rotary", "none"))}
    yield "member_trajectories", lambda: plotting.member_trajectories(panels, threshold=0.5)
    paths = {f"{k}-{n}l": np.cumsum(rng.normal(size=(80, 2)), 0) for k in ("attn", "ln-mlp") for n in range(1, 7)}
    yield "loss_pca_paths", lambda: plotting.loss_pca_paths(paths, {m: 40 for m in paths}, [0.25, 0.2])
    from attncircuits.train.stages import SNAPSHOTS

    st = np.array(SNAPSHOTS)  # chapter 14: 30 checkpoints
    yield "stage_panels", lambda: plotting.stage_panels(
        st, {"LLC": {"LLC": rng.random(30) * 300, "half the Hessian's trace": rng.random(30) * 300},
             "loss (nats)": {"model": rng.random(30) * 6},
             "best head score": {"previous token (layer 0)": rng.random(30), "prefix matching (layer 1)": rng.random(30)},
             "KL from bigrams": {"model": rng.random(30) * 3}},
        boundaries=[50, 450], levels={"loss (nats)": {"bigram table": 3.1, "in-context predictor": 2.2}},
        title="seed 0: the LLC and the detectors over training")
    yield "loss_traces", lambda: plotting.loss_traces(
        {f"lr 1e-0{k}, gamma 1,000, nbeta 1,000": (list(range(0, 100, 5)), 3 + rng.random(20) * 10 ** (2 - k))
         for k in range(2, 6)}, 3.0, title="sampled loss above L(w*) while sampling the shipped 2-layer model "
        "(mean of the chains)")
    yield "checkpoint_paths", lambda: plotting.checkpoint_paths(
        {"essential dynamics": np.cumsum(rng.normal(size=(30, 2)), 0), "per-token-loss PCA": np.cumsum(
            rng.normal(size=(30, 2)), 0)}, marks={"essential dynamics": [5, 17]}, explained={
            "essential dynamics": [0.8, 0.1], "per-token-loss PCA": [0.7, 0.2]},
        title="seed 0: 30 checkpoints on two principal components (circle: step 0)")
    from attncircuits.show.widgets import head_explorer, snapshot_explorer

    head = head_explorer(ck1.model, ck1.tokenizer, frequent_tokens(ck1.tokenizer, 20), k=12)  # chapter 4's call
    yield "head_circuits_figure (head explorer)", lambda: head.render(layer=0, head=1)
    rep = torch.cat([torch.randint(1, 2048, (1, 64))] * 2, 1)
    snap = snapshot_explorer(ck2, rep, layer=1, boundaries=[64])  # chapter 7's call
    yield "head_patterns_grid (snapshot explorer)", lambda: snap.render()


@pytest.fixture(scope="module")
def chapter_figures():
    """The figures of :func:`_chapter_figures`, drawn once for the two tests that read them all
    (legibility and covered data); closed when this module's tests are done."""
    with plt.rc_context({"figure.max_open_warning": 0}):  # all 22 stay open until both tests ran
        figures = [(name, make()) for name, make in _chapter_figures()]
        yield figures
    plt.close("all")


def test_every_figure_is_legible_in_the_book_column(chapter_figures):
    """The rule in the plotting docstring: every text, at the size a reader sees it in the column,
    is at least MIN_TEXT_PX; no figure is wider than the column (so none is scaled down); no two
    tick labels run into each other."""
    seen, small = 0, []
    for name, fig in chapter_figures:
        assert isinstance(fig, Figure), name
        px, width, clash = legibility(fig)
        if px < MIN_TEXT_PX or width > COLUMN_PX + 0.5 or clash:
            small.append(f"{name}: smallest text {px:.1f} px, {width:.0f} px wide, overlapping {clash[:3]}")
        seen += 1
    assert seen == 25 and not small, small  # every figure _chapter_figures draws


def test_the_legibility_measure_catches_a_figure_scaled_down_too_far():
    fig = Figure(figsize=(20, 4), dpi=100)  # 2000 px shown in a 736 px column: 8 pt text is ~4 px
    ax = fig.add_subplot()
    ax.set_title("tiny", fontsize=8)
    assert smallest_text_px(fig) == pytest.approx(8 * 100 / 72 * COLUMN_PX / shown_width_px(fig))
    assert smallest_text_px(fig) < 5
    crowded = Figure(figsize=(2, 2), dpi=100)
    ax = crowded.add_subplot()
    ax.set_xticks(range(40), [f"token{i}" for i in range(40)], fontsize=9)
    assert plotting.overlapping_labels(crowded)[0] == ("token0", "token1")
    # one drawing gives what the three measures give one by one
    assert legibility(fig) == (smallest_text_px(fig), shown_width_px(fig), plotting.overlapping_labels(fig))
    assert legibility(crowded)[2] == plotting.overlapping_labels(crowded)


# ---- shown once in a notebook -----------------------------------------------------------------
SHOW = [
    "import matplotlib.pyplot as plt\nfrom attncircuits.show import plotting\nhist = {'tokens': [0, 1], 'val_loss': [2.0, 1.0]}",
    "plotting.loss_curve(hist, keys=['val_loss'])",  # the cell's value
    "fig = plotting.loss_curve(hist, keys=['val_loss'])\nplt.show()",  # kept, then shown by pyplot
    "fig, ax = plt.subplots()\nplotting.loss_curve(hist, keys=['val_loss'], ax=ax)\nplt.show()",  # composed
    "plotting.loss_curve(hist, keys=['val_loss'])\nx = 1",  # drawn, not the value
    "display(plotting.loss_curve(hist, keys=['val_loss']))",  # displayed explicitly
    "plotting.tokens_html(['a', 'b'], [1.0, 0.5])",
    "print(len(plt.get_fignums()))",  # nothing is left open for a later cell to show
]


@pytest.mark.skipif(sys.platform == "win32", reason="kernel start-up is slow there")
def test_a_figure_shows_exactly_once_in_a_notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in SHOW]
    NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    shown = [[o for o in c.outputs if o.output_type in ("display_data", "execute_result")] for c in nb.cells]
    for cell, outs in zip(SHOW[1:6], shown[1:6]):
        assert len(outs) == 1 and "image/png" in outs[0].data, (cell, outs)
    assert len(shown[6]) == 1 and "text/html" in shown[6][0].data
    assert nb.cells[7].outputs[0].text.strip() == "0"


def test_subplots_for_composed_panels_fit_the_column():
    fig, axes = plotting.subplots(1, 2, figsize=(11, 5))  # chapter 3's two heatmaps side by side
    assert isinstance(fig, plotting.ShowOnceFigure) and axes.shape == (2,)
    assert fig.get_figwidth() == pytest.approx(plotting.MAX_WIDTH_IN) and fig.get_figheight() == pytest.approx(5 * plotting.MAX_WIDTH_IN / 11)
    for ax, n in zip(axes, (16, 16)):
        attention_heatmap(np.eye(n), [f"t{i}" for i in range(n)], ax=ax, title="head 0.1")
    assert smallest_text_px(fig) >= MIN_TEXT_PX
    assert plotting.subplots()[1].__class__.__name__ == "Axes"


def test_no_legend_or_label_covers_data(chapter_figures):
    """Every legend and reference label of the figure functions, at the chapters' calls, sits where
    no plotted point is (``place_legend`` moves a legend beside the axes when "best" is not clear)."""
    from attncircuits.show.plotting.base import covered_data

    found = []
    for name, fig in chapter_figures:
        found += [f"{name}: {c}" for c in covered_data(fig)]
    assert len(chapter_figures) == 25 and not found, found


def test_the_cover_check_sees_a_legend_on_a_line():
    from attncircuits.show.plotting.base import covered_data, place_legend

    fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    ax.plot([0, 1], [1, 1], label="a line along the top")
    ax.plot([0, 1], [0, 0], label="one along the bottom")
    ax.legend(loc="upper left")
    assert covered_data(fig)
    place_legend(ax)
    assert not covered_data(fig)
    plt.close(fig)


def test_the_cover_check_sees_a_legend_on_tick_labels():
    """A legend placed under the axes at a fixed offset runs into tick labels of two lines."""
    from attncircuits.show.plotting.base import covered_data, legend_under_axis

    fig, ax = plt.subplots(figsize=(5, 3), layout="constrained")
    ax.bar([0, 1, 2], [1, 2, 1], label="bars")
    ax.set_xticks([0, 1, 2], ["two", "lines\nof", "labels"])
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.05))
    assert any("axis label" in c for c in covered_data(fig))
    ax.get_legend().remove()
    legend_under_axis(ax)
    assert not covered_data(fig)
    plt.close(fig)


def test_the_family_depth_colours_are_told_apart_and_show_on_both_themes():
    """Chapter 11 draws up to six depths in one panel, on a white figure that the book's dark mode
    dims (brightness 0.8): each depth's colour keeps a contrast of 2 with white and 1.5 with the
    dimmed white, and no two depths share a hue family (six blues from light to dark did not)."""
    import colorsys

    from matplotlib.colors import to_rgb

    from attncircuits.show.plotting.family import DEPTH_COLOURS

    def luminance(rgb):
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    def contrast(a, b):
        hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
        return (hi + 0.05) / (lo + 0.05)

    rgbs = [to_rgb(c) for c in DEPTH_COLOURS]
    assert len(set(DEPTH_COLOURS)) == 6
    for c, rgb in zip(DEPTH_COLOURS, rgbs):
        assert contrast(rgb, (1, 1, 1)) >= 2 and contrast(rgb, (0.8, 0.8, 0.8)) >= 1.5, c
    hues = sorted(colorsys.rgb_to_hls(*rgb)[0] * 360 for rgb in rgbs)
    gaps = [b - a for a, b in zip(hues, hues[1:])] + [hues[0] + 360 - hues[-1]]
    assert sum(g >= 15 for g in gaps) >= 5, hues  # at most two of the six share a hue family
