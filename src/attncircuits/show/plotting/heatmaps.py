"""Heatmaps: attention patterns, circuits on a token subset, path terms, per-head scores,
composition scores, and one head's skip-trigrams beside its OV and QK circuits."""

from __future__ import annotations

import math
import unicodedata
from typing import Mapping, Protocol, Sequence

import numpy as np
from jaxtyping import Float
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from attncircuits.data import visible
from attncircuits.show.plotting.base import (
    LABEL_PT,
    MAX_WIDTH_IN,
    SMALL_PT,
    TICK_PT,
    annotate_cells,
    colorbar,
    finish,
    new_axes,
    new_figure,
    numpy,
    set_title,
    signed_or_sequential,
    token_ticks,
)

#: The smallest heatmap cell that still fits a tick label beside it, in inches (8 pt text + gap).
MIN_CELL_IN = 0.135


def _label_every(n: int, room_in: float) -> int:
    """Label every k-th row or column when ``n`` labels do not fit in ``room_in`` inches."""
    return max(1, math.ceil(n * MIN_CELL_IN / room_in))


def attention_heatmap(
    pattern: Float[np.ndarray, "q k"],
    tokens_str: Sequence[str],
    ax: Axes | None = None,
    title: str | None = None,
    cmap: str = "Blues",
) -> Figure:
    """One head's attention pattern: row ``q`` is where query position ``q`` looks, columns are keys.

    ``pattern`` is ``[q, k]`` (one head of the model's ``[batch, head, q, k]`` cache) and is drawn
    on a fixed 0..1 scale, so heads are comparable by colour. The causal mask shows as the empty
    upper triangle. With more tokens than fit legibly, every k-th token is labelled.
    """
    pat = numpy(pattern)
    if pat.ndim != 2:
        raise ValueError(f"pattern must be [query, key], got shape {pat.shape}; pick one batch row and head first")
    labels = [visible(t) for t in tokens_str]
    if pat.shape[0] != len(labels) or pat.shape[1] != len(labels):
        raise ValueError(f"pattern is {pat.shape} but {len(labels)} token labels were given; pass one label per position")
    n = len(labels)
    side = min(MAX_WIDTH_IN - 1.9, max(2.5, 0.16 * n))
    ax = new_axes(ax, (side + 1.9, side + 1.2))
    im = ax.imshow(pat, cmap=cmap, vmin=0.0, vmax=1.0)
    step = _label_every(n, side)
    shown = [t if i % step == 0 else "" for i, t in enumerate(labels)]
    token_ticks(ax, "x", shown, rotation=90, pt=SMALL_PT)
    token_ticks(ax, "y", shown, pt=SMALL_PT)
    ax.set_xlabel("key (source) token", fontsize=LABEL_PT)
    ax.set_ylabel("query (destination) token", fontsize=LABEL_PT)
    set_title(ax, title)
    colorbar(ax.figure, im, ax, "attention weight")
    return ax.figure


def circuit_heatmap(
    matrix: Float[np.ndarray, "rows cols"],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "",
    ylabel: str = "",
    colorbar_label: str = "",
    row_ticks: bool = True,
    colorbar_location: str = "right",
) -> Figure:
    """A matrix on a token subset (a QK or OV circuit, a table of norms). Signed values use a
    diverging scale centred at 0, so red and blue mean the same sign in every panel; values that
    are all non-negative (norms) use a sequential scale from 0. Panels side by side can drop
    their row labels (``row_ticks=False``) and put the colorbar ``"bottom"`` to widen the cells."""
    m = numpy(matrix)
    if m.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrix is {m.shape} but {len(row_labels)} row and {len(col_labels)} column labels were given")
    ax = new_axes(ax, (max(3.8, 2.0 + 0.2 * len(col_labels)), max(3.0, 1.6 + 0.2 * len(row_labels))))
    im = ax.imshow(m, **signed_or_sequential(m), aspect="auto")  # fills its box: the colorbar never outgrows it
    token_ticks(ax, "x", col_labels, rotation=90, pt=SMALL_PT)
    token_ticks(ax, "y", row_labels if row_ticks else [""] * len(row_labels), pt=SMALL_PT)
    ax.set_xlabel(xlabel, fontsize=LABEL_PT - 1)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT - 1)
    set_title(ax, title, pt=LABEL_PT)
    colorbar(ax.figure, im, ax, colorbar_label, location=colorbar_location)
    return ax.figure


def heatmap_grid(
    matrices: Sequence[Float[np.ndarray, "rows cols"]],
    titles: Sequence[str],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    ncols: int = 2,
    xlabels: Sequence[str] | str = "",
    ylabels: Sequence[str] | str = "",
    colorbar_label: str = "",
    title: str | None = None,
) -> Figure:
    """Several :func:`circuit_heatmap` panels on one token subset, ``ncols`` to a row (e.g. each
    head's OV and QK circuit side by side, one head per row), sized so every label stays legible
    in the book's column: the panels share the row labels of the first column, and each has its
    colorbar below it. ``xlabels``/``ylabels`` give one label per panel, or one for all."""
    if not len(matrices) == len(titles):
        raise ValueError(f"{len(matrices)} matrices but {len(titles)} titles; pass one title per panel")
    if not len(matrices):
        raise ValueError("pass at least one matrix")
    xl = [xlabels] * len(matrices) if isinstance(xlabels, str) else list(xlabels)
    yl = [ylabels] * len(matrices) if isinstance(ylabels, str) else list(ylabels)
    nrows = -(-len(matrices) // ncols)
    panel_h = 2.3 + MIN_CELL_IN * 1.1 * len(row_labels)
    fig, axes = new_figure(nrows, ncols, figsize=(MAX_WIDTH_IN, panel_h * nrows + (0.4 if title else 0)))
    for ax in axes.flat[len(matrices):]:
        ax.axis("off")
    for i, (ax, m, t) in enumerate(zip(axes.flat, matrices, titles)):
        circuit_heatmap(m, row_labels, col_labels, ax=ax, title=t, xlabel=xl[i], ylabel=yl[i],
                        colorbar_label=colorbar_label, row_ticks=i % ncols == 0, colorbar_location="bottom")
    return finish(fig, title)


def path_terms_heatmap(
    contributions: Float[np.ndarray, "pos term"],
    term_labels: Sequence[str],
    position_labels: Sequence[str],
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Each path term's contribution (columns) to the logit of the true next token at each position
    (rows, labelled "current → next"), with the values written in the cells."""
    c = numpy(contributions)
    if c.shape != (len(position_labels), len(term_labels)):
        raise ValueError(f"contributions are {c.shape} but {len(position_labels)} position and {len(term_labels)} term labels were given")
    ax = new_axes(ax, (min(MAX_WIDTH_IN, 2.8 + 0.75 * len(term_labels)), 1.4 + 0.26 * len(position_labels)))
    lim = float(np.abs(c).max(initial=0.0)) or 1.0
    im = ax.imshow(c, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    annotate_cells(ax, c, ".1f", 0.0, lim)
    ax.set_xticks(range(len(term_labels)), term_labels, rotation=45, ha="right", fontsize=TICK_PT)
    token_ticks(ax, "y", position_labels)
    ax.set_xlabel("path term", fontsize=LABEL_PT)
    set_title(ax, title, pt=LABEL_PT)
    colorbar(ax.figure, im, ax, "contribution to the next token's logit")
    return ax.figure


def score_heatmaps(
    scores: Mapping[str, Float[np.ndarray, "layer head"]],
    vmin: float = -1.0,
    vmax: float = 1.0,
    title: str | None = None,
) -> Figure:
    """One ``[layer, head]`` heatmap per score, each cell labelled with its value (head 1.4 is
    row "layer 1", column 4)."""
    if not scores:
        raise ValueError("pass at least one score: {name: [layer, head] tensor}")
    mats = {k: numpy(v) for k, v in scores.items()}
    n_layers, n_heads = next(iter(mats.values())).shape
    for name, m in mats.items():
        if m.shape != (n_layers, n_heads):
            raise ValueError(f"score {name!r} has shape {m.shape}, the first has {(n_layers, n_heads)}")
    fig, axes = new_figure(1, len(mats), figsize=(0.6 * n_heads * len(mats) + 1.2, 0.6 * n_layers + 1.5))
    for ax, (name, m) in zip(axes[0], mats.items()):
        ax.imshow(m, cmap="RdBu", vmin=vmin, vmax=vmax, aspect="auto")
        annotate_cells(ax, m, ".2f", 0.0, vmax)
        ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=TICK_PT)
        ax.set_yticks(range(n_layers), [f"layer {l}" for l in range(n_layers)], fontsize=TICK_PT)
        ax.set_xlabel("head", fontsize=LABEL_PT)
        set_title(ax, name, pt=LABEL_PT)
    return finish(fig, title)


def composition_heatmaps(
    scores: Mapping[str, Float[np.ndarray, "writer reader"]],
    baseline_mean: Mapping[str, float],
    baseline_std: Mapping[str, float],
    writer_labels: Sequence[str],
    reader_labels: Sequence[str],
    title: str | None = None,
) -> Figure:
    """Composition scores side by side (one panel per kind, e.g. Q, K, V), rows = writer heads,
    columns = reader heads, values written in the cells. The colour scale is centred on each
    kind's random baseline (white = what random heads score; the colorbar marks it with a line
    and its ±2 std band in grey), and cells more than 3 baseline standard deviations above it
    are framed."""
    if not scores:
        raise ValueError("pass at least one kind of score: {'Q': [writer, reader] matrix, ...}")
    mats = {k: numpy(v) for k, v in scores.items()}
    for k, m in mats.items():
        if m.shape != (len(writer_labels), len(reader_labels)):
            raise ValueError(f"{k} scores are {m.shape} but {len(writer_labels)} writer and {len(reader_labels)} reader labels were given")
        if k not in baseline_mean or k not in baseline_std:
            raise ValueError(f"no baseline for {k!r}: pass baseline_mean and baseline_std with the same keys as scores")
    hi = max(float(m.max()) for m in mats.values())
    side = 1.5 + 0.42 * len(reader_labels)
    fig, axes = new_figure(1, len(mats), figsize=(side * len(mats), 2.0 + 0.4 * len(writer_labels)))
    for ax, (k, m) in zip(axes[0], mats.items()):
        mu, sd = baseline_mean[k], baseline_std[k]
        span = max(hi - mu, 1e-9)
        im = ax.imshow(m, cmap="RdBu_r", vmin=mu - span, vmax=mu + span, aspect="auto")
        annotate_cells(ax, m, ".2f", mu, span, pt=SMALL_PT)
        for (i, j), v in np.ndenumerate(m):
            if v > mu + 3 * sd:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.2))
        ax.set_xticks(range(len(reader_labels)), reader_labels, rotation=90, fontsize=TICK_PT)
        ax.set_yticks(range(len(writer_labels)), writer_labels, fontsize=TICK_PT)
        ax.set_xlabel("reader (later layer)", fontsize=LABEL_PT - 1)
        ax.set_ylabel("writer (earlier layer)", fontsize=LABEL_PT - 1)
        ax.set_title(f"{k}\nbaseline {mu:.3f} ± {sd:.3f}", fontsize=LABEL_PT)
        cb = colorbar(fig, im, ax, shrink=0.8)
        cb.ax.axhline(mu, color="black", linewidth=1.5)
        cb.ax.axhspan(mu - 2 * sd, mu + 2 * sd, color="grey", alpha=0.4)
    return finish(fig, title)


def head_patterns_grid(
    patterns: Float[np.ndarray, "n q k"],
    titles: Sequence[str],
    ncols: int = 4,
    suptitle: str | None = None,
    boundaries: Sequence[int] = (),
) -> Figure:
    """Several heads' attention patterns side by side on one 0..1 scale, without token labels
    (for random tokens, where the shape is the message: an induction head's stripe sits one
    position right of the diagonal offset by the sequence length). ``boundaries`` draws thin lines
    where the copies of a repeated sequence start."""
    pats = numpy(patterns)
    if pats.ndim != 3:
        raise ValueError(f"patterns must be [n_heads, query, key], got shape {pats.shape}")
    if len(titles) != len(pats):
        raise ValueError(f"{len(pats)} patterns but {len(titles)} titles; pass one title per pattern")
    ncols = min(ncols, len(pats))
    nrows = -(-len(pats) // ncols)
    side = min(2.4, (MAX_WIDTH_IN - 1.0) / ncols)
    fig, axes = new_figure(nrows, ncols, figsize=(side * ncols + 1.0, side * nrows + 0.7))
    for ax in axes.flat[len(pats):]:
        ax.axis("off")
    im = None
    for ax, pat, title in zip(axes.flat, pats, titles):
        im = ax.imshow(pat, cmap="Blues", vmin=0.0, vmax=1.0)
        for b in boundaries:
            ax.axhline(b - 0.5, color="grey", linewidth=0.5)
            ax.axvline(b - 0.5, color="grey", linewidth=0.5)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(title, fontsize=LABEL_PT)
    axes[-1, 0].set_xlabel("key position", fontsize=LABEL_PT - 1)
    axes[-1, 0].set_ylabel("query position", fontsize=LABEL_PT - 1)
    colorbar(fig, im, axes, "attention weight", shrink=0.7)
    return finish(fig, suptitle)


def pattern_windows(
    patterns: Float[np.ndarray, "n q k"],
    tokens_str: Sequence[str],
    windows: Sequence[tuple[int, int, int, int]],
    titles: Sequence[str],
    suptitle: str | None = None,
    ncols: int = 2,
) -> Figure:
    """A window of each of several attention patterns, large enough to read: panel ``i`` is rows
    ``q0:q1`` (queries) by columns ``k0:k1`` (keys) of ``patterns[i]`` (``windows[i] = (q0, q1,
    k0, k1)``), each row and column labelled with its position and token, on one 0..1 scale. On a
    repeated sequence, queries of the second copy beside keys of the first show an induction head's
    stripe one column right of each query's earlier occurrence, cell by cell (a whole pattern of a
    hundred positions leaves it a pixel wide)."""
    pats = numpy(patterns)
    if pats.ndim != 3 or not len(pats) == len(windows) == len(titles):
        raise ValueError(f"pass [n, query, key] patterns with one window and one title each; got shape {pats.shape}, "
                         f"{len(windows)} windows and {len(titles)} titles")
    n_pos = pats.shape[1]
    for q0, q1, k0, k1 in windows:
        if not (0 <= q0 < q1 <= n_pos and 0 <= k0 < k1 <= n_pos):
            raise ValueError(f"window {(q0, q1, k0, k1)} is not inside {n_pos} positions; use 0 <= start < stop <= {n_pos}")
    if len(tokens_str) != n_pos:
        raise ValueError(f"{len(tokens_str)} token labels for {n_pos} positions; pass one label per position")
    ncols = min(ncols, len(pats))
    nrows = -(-len(pats) // ncols)
    cells = max(max(q1 - q0, k1 - k0) for q0, q1, k0, k1 in windows)
    side = min((MAX_WIDTH_IN - 1.2) / ncols - 1.0, 0.24 * cells)  # about 0.24 in a cell: room for a label
    fig, axes = new_figure(nrows, ncols, figsize=(ncols * (side + 1.0) + 1.2, nrows * (side + 1.3) + 0.5))
    for ax in axes.flat[len(pats):]:
        ax.axis("off")
    im = None
    for ax, pat, (q0, q1, k0, k1), title in zip(axes.flat, pats, windows, titles):
        im = ax.imshow(pat[q0:q1, k0:k1], cmap="Blues", vmin=0.0, vmax=1.0)
        # a no-break space between position and token: token_ticks shows a space as ·
        token_ticks(ax, "x", [f"{_printable(tokens_str[k])}\u00a0{k}" for k in range(k0, k1)], rotation=90,
                    pt=SMALL_PT)
        token_ticks(ax, "y", [f"{q}\u00a0{_printable(tokens_str[q])}" for q in range(q0, q1)], pt=SMALL_PT)
        ax.set_xlabel("key: token, position", fontsize=LABEL_PT - 1)
        ax.set_ylabel("query: position, token", fontsize=LABEL_PT - 1)
        set_title(ax, title, pt=LABEL_PT)
    colorbar(fig, im, axes, "attention weight", shrink=0.6)
    return finish(fig, suptitle)


def _printable(token: str, n: int = 9) -> str:
    """A token label: whitespace made visible, a control character as its code (``<0x1A>``), cut
    to ``n`` characters."""
    text = "".join(f"<0x{ord(c):02X}>" if unicodedata.category(c) == "Cc" else c for c in visible(token))
    return _short(text, n)


def _short(text: str, n: int = 14) -> str:
    """``text`` cut to ``n`` characters with an ellipsis (long whitespace runs, in a table cell)."""
    return text if len(text) <= n else text[: n - 1] + "…"


class TrigramRow(Protocol):
    """What :func:`head_circuits_figure` reads of a skip-trigram row (``circuits.SkipTrigramRow`` has it)."""

    source: str
    dest: str
    out: str
    score: float


def head_circuits_figure(
    trigram_rows: Sequence[TrigramRow],
    ov: Float[np.ndarray, "n n"],
    qk: Float[np.ndarray, "n n"],
    token_labels: Sequence[str],
    title: str | None = None,
) -> Figure:
    """One head at a glance: its top skip-trigrams as a table (each row's ``source``, ``dest``,
    ``out`` and ``score``) above its OV circuit (source → output logit) and its QK circuit (destination →
    source score) on a token subset, side by side."""
    n = len(token_labels)
    table_h = 0.45 + 0.2 * (len(trigram_rows) + 1)
    heat_h = 2.5 + MIN_CELL_IN * 1.1 * n
    fig = new_figure(figsize=(MAX_WIDTH_IN, table_h + heat_h + (0.4 if title else 0)))[0]
    fig.clear()
    gs = fig.add_gridspec(2, 2, height_ratios=[table_h, heat_h])
    ax_t = fig.add_subplot(gs[0, :])
    ax_t.axis("off")
    cells = [[_short(visible(r.source)), _short(visible(r.dest)), _short(visible(r.out)), f"{r.score:.2f}"]
             for r in trigram_rows]
    if cells:
        tab = ax_t.table(cellText=cells, colLabels=["source", "… destination", "→ output", "score"],
                         loc="upper center", cellLoc="left", colWidths=[0.26, 0.26, 0.26, 0.12])
        tab.auto_set_font_size(False)
        tab.set_fontsize(TICK_PT)
        tab.scale(1.0, 1.25)
    ax_t.set_title("top skip-trigrams (whole vocabulary)", fontsize=LABEL_PT)
    labels = [_short(visible(t), 9) for t in token_labels]
    circuit_heatmap(ov, labels, labels, ax=fig.add_subplot(gs[1, 0]), title="OV: source → output logit",
                    xlabel="output", ylabel="source (attended to)", colorbar_label="logit (row-centred)",
                    colorbar_location="bottom")
    circuit_heatmap(qk, labels, labels, ax=fig.add_subplot(gs[1, 1]), title="QK: destination → source",
                    xlabel="source (key)", ylabel="destination\n(rows as on the left)",
                    colorbar_label="score (row-centred)", row_ticks=False, colorbar_location="bottom")
    return finish(fig, title)
