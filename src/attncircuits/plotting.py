"""Figures and token-highlight HTML. Functions here draw what they are given; they compute nothing.

Every figure function takes an optional matplotlib ``ax`` (so chapters can compose panels) and
returns the :class:`~matplotlib.figure.Figure` it drew on (so :mod:`attncircuits.widgets` can
show and redraw it). Token labels have their whitespace made visible (``·`` space, ``⏎`` newline)
with :func:`attncircuits.data.visible`; passing labels that are already visible is harmless.
"""

from __future__ import annotations

import html
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from jaxtyping import Float
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .data import visible


def _numpy(x) -> np.ndarray:
    """A tensor, array or list as a float numpy array (detached, on the CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


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
    upper triangle.
    """
    pat = _numpy(pattern)
    if pat.ndim != 2:
        raise ValueError(f"pattern must be [query, key], got shape {pat.shape}; pick one batch row and head first")
    labels = [visible(t) for t in tokens_str]
    if pat.shape[0] != len(labels) or pat.shape[1] != len(labels):
        raise ValueError(f"pattern is {pat.shape} but {len(labels)} token labels were given; pass one label per position")
    size = min(11.0, 2.5 + 0.16 * len(labels))
    ax = _axes(ax, (size + 1.2, size))
    im = ax.imshow(pat, cmap=cmap, vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8, family="monospace")
    ax.set_yticks(range(len(labels)), labels, fontsize=8, family="monospace")
    ax.set_xlabel("key (source) token")
    ax.set_ylabel("query (destination) token")
    if title:
        ax.set_title(title)
    ax.figure.colorbar(im, ax=ax, shrink=0.8, label="attention weight")
    return ax.figure


def loss_curve(
    history: Mapping[str, Sequence[float | None]],
    keys: Sequence[str] = ("train_loss", "val_loss"),
    x: str = "tokens",
    ax: Axes | None = None,
    title: str | None = None,
    hlines: Mapping[str, float] | None = None,
) -> Figure:
    """Curves from a training history (the dict :func:`attncircuits.train.train` returns).

    ``keys`` are plotted against ``history[x]``; ``None`` entries (e.g. no train loss before the
    first step) are skipped. ``hlines`` draws labelled reference levels, e.g. the unigram entropy.
    """
    if x not in history:
        raise KeyError(f"history has no {x!r} column; available: {sorted(history)}")
    ax = _axes(ax, (6.0, 3.5))
    xs = list(history[x])
    for key in keys:
        if key not in history:
            raise KeyError(f"history has no {key!r} column; available: {sorted(history)}")
        pts = [(a, b) for a, b in zip(xs, history[key]) if b is not None]
        ax.plot([a for a, _ in pts], [b for _, b in pts], marker=".", label=key.replace("_", " "))
    for label, level in (hlines or {}).items():
        ax.axhline(level, color="grey", linestyle="--", linewidth=1)
        ax.annotate(label, (1.0, level), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8, color="grey")
    ax.set_xlabel(x)
    ax.set_ylabel("loss (nats / token)")
    ax.legend()
    if title:
        ax.set_title(title)
    return ax.figure


def tokens_html(
    token_strs: Sequence[str],
    weights: Float[np.ndarray, "pos"],
    highlight: int | None = None,
    max_weight: float | None = None,
    title: str | None = None,
    line_breaks: bool = True,
):
    """Text with each token's background coloured by a weight: plain HTML, no JavaScript.

    Used for attention (``pattern[layer][0, head, query]``: where one query token looks) and for
    value-weighted attention (the same row scaled by each source's ``‖v W_O‖``). Opacity is
    ``|w| / max_weight`` (default: the largest ``|w|``); positive weights are blue, negative red,
    so signed attributions work too. ``highlight`` outlines one position (e.g. the query token).
    Hovering a token shows its position and weight through the ``title`` attribute, which needs
    no script. With ``line_breaks``, a token that contains a newline also ends the line.

    Returns an ``IPython.display.HTML`` object: it displays in a notebook and, being a
    ``text/html`` output, in the built book.
    """
    from IPython.display import HTML

    w = _numpy(weights).reshape(-1)
    if len(w) != len(token_strs):
        raise ValueError(f"{len(token_strs)} tokens but {len(w)} weights; pass one weight per token")
    if highlight is not None and not 0 <= highlight < len(w):
        raise IndexError(f"highlight={highlight} is outside the {len(w)} tokens; use 0..{len(w) - 1}")
    scale = float(max_weight) if max_weight is not None else float(np.abs(w).max(initial=0.0))
    scale = scale if scale > 0 else 1.0
    spans = []
    for i, (tok, wi) in enumerate(zip(token_strs, w)):
        text = visible(tok)
        alpha = min(1.0, abs(wi) / scale)
        rgb = "31,119,180" if wi >= 0 else "214,39,40"
        style = f"background:rgba({rgb},{alpha:.3f});padding:1px 0;margin:0;display:inline-block;"
        if highlight == i:
            style += "outline:2px solid #ff7f0e;"
        if alpha > 0.6:
            style += "color:white;"
        spans.append(f'<span style="{style}" title="position {i}: {wi:.3f}">{html.escape(text)}</span>')
        if line_breaks and "⏎" in text:
            spans.append("<br>")
    head = f'<div style="font-weight:bold;margin-bottom:4px">{html.escape(title)}</div>' if title else ""
    legend = (
        f'<div style="font-size:80%;color:#555;margin-top:4px">shade: |weight|, full at {scale:.3g}'
        + (" (blue positive, red negative)" if (w < 0).any() else "")
        + ("; outlined: the query token" if highlight is not None else "")
        + "</div>"
    )
    body = (
        '<div style="font-family:monospace;line-height:1.8;white-space:normal">'
        + "".join(spans)
        + "</div>"
    )
    return HTML(f'<div class="attncircuits-tokens">{head}{body}{legend}</div>')


# ---- chapter 2: the zero-layer bigram table ----------------------------------------------------
def bigram_scatter(
    x: Float[np.ndarray, "n"],
    y: Float[np.ndarray, "n"],
    weights: Float[np.ndarray, "n"],
    xlabel: str,
    ylabel: str,
    ax: Axes | None = None,
    title: str | None = None,
    gridsize: int = 60,
) -> Figure:
    """Two tables' ``log p(b | a)`` against each other, one point per observed bigram, shaded by
    how often the bigram occurs (a hexbin summing ``weights``, log colour scale), with ``y = x``.

    Frequency shading shows where the text's mass is: rare bigrams are many but light.
    """
    x, y, w = _numpy(x).ravel(), _numpy(y).ravel(), _numpy(weights).ravel()
    if not len(x) == len(y) == len(w):
        raise ValueError(f"x, y and weights must have one entry per bigram, got {len(x)}, {len(y)}, {len(w)}")
    ax = _axes(ax, (5.0, 4.5))
    hb = ax.hexbin(x, y, C=w, reduce_C_function=np.sum, gridsize=gridsize, bins="log", cmap="viridis", mincnt=1)
    lo, hi = min(x.min(), y.min()), max(x.max(), y.max())
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="y = x")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc="upper left", fontsize=8)
    ax.figure.colorbar(hb, ax=ax, label="occurrences of the bigrams in a cell")
    if title:
        ax.set_title(title)
    return ax.figure


def next_token_bars(
    panels: Mapping[str, tuple[Sequence[str], Float[np.ndarray, "k"]]],
    title: str | None = None,
) -> Figure:
    """Side-by-side bar charts of next-token probabilities, one panel per source (e.g. weights, counts).

    ``panels`` maps a panel title to ``(token strings, probabilities)``, best first; the x axes
    share one scale so the panels compare by length.
    """
    if not panels:
        raise ValueError("pass at least one panel: {title: (token strings, probabilities)}")
    k = max(len(toks) for toks, _ in panels.values())
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 0.9 + 0.3 * k), layout="constrained", squeeze=False)
    top = max(float(_numpy(p).max(initial=0.0)) for _, p in panels.values()) or 1.0
    for ax, (name, (toks, probs)) in zip(axes[0], panels.items()):
        p = _numpy(probs)
        if len(p) != len(toks):
            raise ValueError(f"panel {name!r}: {len(toks)} tokens but {len(p)} probabilities")
        ax.barh(range(len(p)), p, color="tab:blue")
        ax.set_yticks(range(len(p)), [visible(t) for t in toks], family="monospace", fontsize=9)
        ax.set_ylim(k - 0.5, -0.5)
        ax.set_xlim(0, top * 1.15)
        for i, pi in enumerate(p):
            ax.text(pi, i, f" {pi:.2f}", va="center", fontsize=8)
        ax.set_xlabel("probability")
        ax.set_title(name, fontsize=10)
    if title:
        fig.suptitle(title)
    return fig


def next_token_table_html(
    current: Sequence[str],
    columns: Mapping[str, Sequence[Sequence[tuple[str, float]]]],
    title: str | None = None,
):
    """An HTML table: one row per current token, one column per source, each cell its top next
    tokens with probabilities (``columns[name][row] = [(token, p), ...]``). Plain HTML, so the
    built book keeps it."""
    from IPython.display import HTML

    for name, cells in columns.items():
        if len(cells) != len(current):
            raise ValueError(f"column {name!r} has {len(cells)} rows but there are {len(current)} current tokens")
    th = "".join(f"<th style='text-align:left'>{html.escape(n)}</th>" for n in ["current token", *columns])
    rows = []
    for i, tok in enumerate(current):
        cells = [f"<td><code>{html.escape(visible(tok))}</code></td>"]
        for col in columns.values():
            items = ", ".join(f"<code>{html.escape(visible(t))}</code>&nbsp;{p:.2f}" for t, p in col[i])
            cells.append(f"<td style='text-align:left'>{items}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = f"<div style='font-weight:bold;margin-bottom:4px'>{html.escape(title)}</div>" if title else ""
    return HTML(f"{head}<table><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


# ---- chapters 3 and 4: one layer (circuits, path terms, eigenvalues, skip-trigrams) -------------
def circuit_heatmap(
    matrix: Float[np.ndarray, "rows cols"],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "",
    ylabel: str = "",
    colorbar_label: str = "",
) -> Figure:
    """A signed matrix (a QK or OV circuit on a token subset) on a diverging scale centred at 0,
    so red and blue mean the same sign in every panel."""
    m = _numpy(matrix)
    if m.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrix is {m.shape} but {len(row_labels)} row and {len(col_labels)} column labels were given")
    ax = _axes(ax, (1.5 + 0.28 * len(col_labels), 1.2 + 0.28 * len(row_labels)))
    lim = float(np.abs(m).max(initial=0.0)) or 1.0
    im = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_xticks(range(len(col_labels)), [visible(t) for t in col_labels], rotation=90, fontsize=8, family="monospace")
    ax.set_yticks(range(len(row_labels)), [visible(t) for t in row_labels], fontsize=8, family="monospace")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.figure.colorbar(im, ax=ax, shrink=0.8, label=colorbar_label)
    return ax.figure


def path_terms_heatmap(
    contributions: Float[np.ndarray, "pos term"],
    term_labels: Sequence[str],
    position_labels: Sequence[str],
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Each path term's contribution (columns) to the logit of the true next token at each position
    (rows, labelled "current → next"), with the values written in the cells."""
    c = _numpy(contributions)
    if c.shape != (len(position_labels), len(term_labels)):
        raise ValueError(f"contributions are {c.shape} but {len(position_labels)} position and {len(term_labels)} term labels were given")
    ax = _axes(ax, (1.8 + 0.75 * len(term_labels), 1.0 + 0.32 * len(position_labels)))
    lim = float(np.abs(c).max(initial=0.0)) or 1.0
    im = ax.imshow(c, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    for (i, j), v in np.ndenumerate(c):
        ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=7, color="white" if abs(v) > 0.6 * lim else "black")
    ax.set_xticks(range(len(term_labels)), term_labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(position_labels)), [visible(t) for t in position_labels], fontsize=8, family="monospace")
    ax.set_xlabel("path term")
    if title:
        ax.set_title(title, fontsize=10)
    ax.figure.colorbar(im, ax=ax, shrink=0.8, label="contribution to the next token's logit")
    return ax.figure


def eigenvalue_planes(
    eigenvalues: Sequence,
    scores: Sequence[float],
    titles: Sequence[str],
    highlight: Sequence[bool] | None = None,
    ncols: int = 4,
) -> Figure:
    """One complex plane per head with its OV eigenvalues (symmetric log scale, so large and small
    ones both show) and the summary ``Σλ/Σ|λ|`` in the title; ``highlight`` frames copying heads."""
    n = len(eigenvalues)
    if not n == len(scores) == len(titles):
        raise ValueError(f"got {n} eigenvalue sets, {len(scores)} scores and {len(titles)} titles; pass one of each per head")
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols, 2.3 * nrows), layout="constrained", squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        lam = np.asarray(eigenvalues[i].detach().cpu().numpy() if hasattr(eigenvalues[i], "detach") else eigenvalues[i])
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.scatter(lam.real, lam.imag, s=12, c=np.where(lam.real >= 0, "tab:blue", "tab:red"))
        lim = float(np.abs(lam).max(initial=0.0)) * 1.1 or 1.0
        ax.set_xscale("symlog", linthresh=lim / 20)
        ax.set_yscale("symlog", linthresh=lim / 20)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{titles[i]}: {float(scores[i]):+.2f}", fontsize=9)
        if highlight is not None and highlight[i]:
            for side in ax.spines.values():
                side.set_edgecolor("tab:green")
                side.set_linewidth(2.5)
    fig.suptitle("OV eigenvalues (real → right, imaginary → up); title: Σλ/Σ|λ|", fontsize=10)
    return fig


def grouped_bars(
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ax: Axes | None = None,
    title: str | None = None,
    ylabel: str = "",
    hline: float | None = None,
) -> Figure:
    """Bars per group (e.g. per head), one colour per series (e.g. from the weights vs measured)."""
    if not series:
        raise ValueError("pass at least one series: {name: values per group}")
    for name, vals in series.items():
        if len(vals) != len(groups):
            raise ValueError(f"series {name!r} has {len(vals)} values for {len(groups)} groups")
    ax = _axes(ax, (1.5 + 0.7 * len(groups), 3.2))
    width = 0.8 / len(series)
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(np.arange(len(groups)) + (i - (len(series) - 1) / 2) * width, _numpy(vals), width, label=name)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax.figure


def skip_trigram_table_html(rows: Sequence[Sequence], columns: Sequence[str], title: str | None = None):
    """An HTML table of skip-trigram rows; string cells are shown as code with visible whitespace,
    numbers with two decimals. Plain HTML, so the built book keeps it."""
    from IPython.display import HTML

    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"row {r!r} has {len(r)} cells for {len(columns)} columns")

    def cell(x):
        if isinstance(x, str):
            return f"<td style='text-align:left'><code>{html.escape(visible(x))}</code></td>"
        return f"<td>{x:.2f}</td>" if isinstance(x, float) else f"<td>{html.escape(str(x))}</td>"

    th = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(x) for x in r) + "</tr>" for r in rows)
    head = f"<div style='font-weight:bold;margin-bottom:4px'>{html.escape(title)}</div>" if title else ""
    return HTML(f"{head}<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>")


def head_circuits_figure(
    trigram_rows: Sequence[Sequence],
    ov: Float[np.ndarray, "n n"],
    qk: Float[np.ndarray, "n n"],
    token_labels: Sequence[str],
    title: str | None = None,
) -> Figure:
    """One head at a glance: its top skip-trigrams as a table (rows ``(source, destination, output,
    score)``), its OV circuit (source → output logit) and its QK circuit (destination → source score)
    on a token subset."""
    fig = plt.figure(figsize=(15, 0.9 + 0.3 * max(len(token_labels), len(trigram_rows) + 2)), layout="constrained")
    gs = fig.add_gridspec(1, 3, width_ratios=[1.1, 1, 1])
    ax_t = fig.add_subplot(gs[0])
    ax_t.axis("off")
    cells = [[visible(str(c)) if isinstance(c, str) else f"{c:.2f}" for c in r] for r in trigram_rows]
    if cells:
        tab = ax_t.table(cellText=cells, colLabels=["source", "… dest", "→ out", "score"], loc="upper center", cellLoc="left")
        tab.auto_set_font_size(False)
        tab.set_fontsize(8)
        tab.scale(1.0, 1.2)
    ax_t.set_title("top skip-trigrams (whole vocabulary)", fontsize=10)
    circuit_heatmap(ov, token_labels, token_labels, ax=fig.add_subplot(gs[1]), title="OV: source → output logit",
                    xlabel="output", ylabel="source (attended to)", colorbar_label="logit (row-centred)")
    circuit_heatmap(qk, token_labels, token_labels, ax=fig.add_subplot(gs[2]), title="QK: destination → source score",
                    xlabel="source (key)", ylabel="destination (query)", colorbar_label="score (row-centred)")
    if title:
        fig.suptitle(title)
    return fig


# ---- chapters 6 and 7: induction heads and why they need two layers ----------------------------
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
    pats = _numpy(patterns)
    if pats.ndim != 3:
        raise ValueError(f"patterns must be [n_heads, query, key], got shape {pats.shape}")
    if len(titles) != len(pats):
        raise ValueError(f"{len(pats)} patterns but {len(titles)} titles; pass one title per pattern")
    nrows = -(-len(pats) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.4 * ncols, 2.4 * nrows + 0.4), layout="constrained", squeeze=False)
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
        ax.set_title(title, fontsize=9)
    axes[-1, 0].set_xlabel("key position")
    axes[-1, 0].set_ylabel("query position")
    fig.colorbar(im, ax=axes, shrink=0.7, label="attention weight")
    if suptitle:
        fig.suptitle(suptitle)
    return fig


def position_loss_plot(
    curves: Mapping[str, Float[np.ndarray, "target"]],
    copy_starts: Sequence[int] = (),
    ax: Axes | None = None,
    title: str | None = None,
    hlines: Mapping[str, float] | None = None,
) -> Figure:
    """Loss at each target position (entry ``t`` predicts token ``t + 1``), one line per model or
    condition; dashed verticals where copies of a repeated sequence start (``copy_starts``)."""
    if not curves:
        raise ValueError("pass at least one curve: {label: per-position loss}")
    ax = _axes(ax, (7.0, 3.5))
    for label, loss in curves.items():
        y = _numpy(loss).ravel()
        ax.plot(np.arange(1, len(y) + 1), y, label=label, linewidth=1.2)
    for s in copy_starts:
        ax.axvline(s, color="grey", linestyle=":", linewidth=1)
    for label, level in (hlines or {}).items():
        ax.axhline(level, color="grey", linestyle="--", linewidth=1)
        ax.annotate(label, (1.0, level), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8, color="grey")
    ax.set_xlabel("position of the predicted token")
    ax.set_ylabel("loss (nats)")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
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
    mats = {k: _numpy(v) for k, v in scores.items()}
    n_layers, n_heads = next(iter(mats.values())).shape
    fig, axes = plt.subplots(1, len(mats), figsize=(0.55 * n_heads * len(mats) + 1.5, 0.6 * n_layers + 1.4),
                             layout="constrained", squeeze=False)
    for ax, (name, m) in zip(axes[0], mats.items()):
        if m.shape != (n_layers, n_heads):
            raise ValueError(f"score {name!r} has shape {m.shape}, the first has {(n_layers, n_heads)}")
        ax.imshow(m, cmap="RdBu", vmin=vmin, vmax=vmax)
        for (l, h), val in np.ndenumerate(m):
            ax.text(h, l, f"{val:.2f}", ha="center", va="center", fontsize=7, color="white" if abs(val) > 0.6 * vmax else "black")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers), [f"layer {l}" for l in range(n_layers)])
        ax.set_xlabel("head")
        ax.set_title(name, fontsize=10)
    if title:
        fig.suptitle(title)
    return fig


def eigen_scatter(
    x: Float[np.ndarray, "n"],
    y: Float[np.ndarray, "n"],
    labels: Sequence[str],
    xlabel: str,
    ylabel: str,
    highlight: Sequence[int] = (),
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Eigenvalue-positivity scatter on ``[-1, 1]²`` (the paper's QK-vs-OV figure), each point
    labelled; ``highlight`` indexes points drawn in orange (e.g. heads found by their behaviour)."""
    x, y = _numpy(x).ravel(), _numpy(y).ravel()
    if not len(x) == len(y) == len(labels):
        raise ValueError(f"x, y and labels must have one entry per head, got {len(x)}, {len(y)}, {len(labels)}")
    ax = _axes(ax, (4.8, 4.5))
    colors = ["tab:orange" if i in set(highlight) else "tab:blue" for i in range(len(x))]
    ax.scatter(x, y, c=colors, s=40, zorder=3)
    for xi, yi, lab in zip(x, y, labels):
        ax.annotate(lab, (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=8)
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.axvline(0, color="grey", linewidth=0.6)
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax.figure


def phase_change_plot(
    x: Sequence[float],
    panels: Mapping[str, Mapping[str, Sequence[float | None]]],
    xlabel: str = "tokens seen",
    vlines: Mapping[str, float] | None = None,
    title: str | None = None,
) -> Figure:
    """Stacked panels on one shared x axis (training time): ``panels[y label][line label] = values``;
    ``None`` values are skipped. ``vlines`` marks moments (e.g. the phase change) in every panel."""
    if not panels:
        raise ValueError("pass at least one panel: {y label: {line label: values}}")
    xs = list(x)
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.0, 1.9 * len(panels) + 0.6), sharex=True, layout="constrained", squeeze=False)
    for ax, (ylabel, lines) in zip(axes[:, 0], panels.items()):
        for label, ys in lines.items():
            if len(ys) != len(xs):
                raise ValueError(f"line {label!r} has {len(ys)} values but x has {len(xs)}")
            pts = [(a, b) for a, b in zip(xs, ys) if b is not None]
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker=".", markersize=3, label=label)
        for name, at in (vlines or {}).items():
            ax.axvline(at, color="tab:red", linestyle="--", linewidth=1)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.legend(fontsize=7, loc="best")
    for name, at in (vlines or {}).items():
        axes[0, 0].annotate(name, (at, 1.0), xycoords=("data", "axes fraction"), ha="left", va="bottom", fontsize=8, color="tab:red")
    axes[-1, 0].set_xlabel(xlabel)
    if title:
        fig.suptitle(title)
    return fig


# ---- chapter 5: two layers (composition, term importance) --------------------------------------
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
    kind's random baseline (white = what random heads score), and cells more than 3 baseline
    standard deviations above it are framed."""
    if not scores:
        raise ValueError("pass at least one kind of score: {'Q': [writer, reader] matrix, ...}")
    mats = {k: _numpy(v) for k, v in scores.items()}
    for k, m in mats.items():
        if m.shape != (len(writer_labels), len(reader_labels)):
            raise ValueError(f"{k} scores are {m.shape} but {len(writer_labels)} writer and {len(reader_labels)} reader labels were given")
        if k not in baseline_mean or k not in baseline_std:
            raise ValueError(f"no baseline for {k!r}: pass baseline_mean and baseline_std with the same keys as scores")
    hi = max(float(m.max()) for m in mats.values())
    n = len(mats)
    side = 1.2 + 0.45 * len(reader_labels)
    fig, axes = plt.subplots(1, n, figsize=(side * n + 1.0, 1.0 + 0.45 * len(writer_labels)), layout="constrained", squeeze=False)
    for ax, (k, m) in zip(axes[0], mats.items()):
        mu, sd = baseline_mean[k], baseline_std[k]
        span = max(hi - mu, 1e-9)
        im = ax.imshow(m, cmap="RdBu_r", vmin=mu - span, vmax=mu + span)
        for (i, j), v in np.ndenumerate(m):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6.5, color="white" if abs(v - mu) > 0.6 * span else "black")
            if v > mu + 3 * sd:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.2))
        ax.set_xticks(range(len(reader_labels)), reader_labels, rotation=90, fontsize=8)
        ax.set_yticks(range(len(writer_labels)), writer_labels, fontsize=8)
        ax.set_xlabel("reader (later layer)")
        ax.set_ylabel("writer (earlier layer)")
        ax.set_title(f"{k}  (baseline {mu:.3f} ± {sd:.3f})", fontsize=10)
        cb = fig.colorbar(im, ax=ax, shrink=0.8)
        cb.ax.axhline(mu, color="black", linewidth=1.5)
        cb.ax.axhspan(mu - 2 * sd, mu + 2 * sd, color="grey", alpha=0.4)
    if title:
        fig.suptitle(title)
    return fig
