"""Scatter plots: two bigram tables against each other, eigenvalues in the complex plane, and the
QK-vs-OV eigenvalue-positivity plane of chapter 6."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from jaxtyping import Float
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from attncircuits.show.plotting.base import (
    LABEL_PT,
    SMALL_PT,
    TICK_PT,
    colorbar,
    finish,
    new_axes,
    new_figure,
    numpy,
    set_title,
)

#: Colours of eigenvalues by the sign of their real part (copying vs anti-copying directions).
POSITIVE, NEGATIVE = "tab:blue", "tab:red"


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
    x, y, w = numpy(x).ravel(), numpy(y).ravel(), numpy(weights).ravel()
    if not len(x) == len(y) == len(w):
        raise ValueError(f"x, y and weights must have one entry per bigram, got {len(x)}, {len(y)}, {len(w)}")
    ax = new_axes(ax, (5.6, 4.6))
    hb = ax.hexbin(x, y, C=w, reduce_C_function=np.sum, gridsize=gridsize, bins="log", cmap="viridis", mincnt=1)
    lo, hi = min(x.min(), y.min()), max(x.max(), y.max())
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="y = x")
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.legend(loc="upper left", fontsize=SMALL_PT + 0.5)
    colorbar(ax.figure, hb, ax, "occurrences of the bigrams in a cell")
    set_title(ax, title)
    return ax.figure


def eigenvalue_planes(
    eigenvalues: Sequence,
    scores: Sequence[float],
    titles: Sequence[str],
    highlight: Sequence[bool] | None = None,
    ncols: int = 4,
) -> Figure:
    """One complex plane per head with its OV eigenvalues (symmetric log scale, so large and small
    ones both show), coloured by the sign of the real part (legend), and the summary ``Σλ/Σ|λ|``
    in the title; ``highlight`` frames copying heads in green."""
    n = len(eigenvalues)
    if not n == len(scores) == len(titles):
        raise ValueError(f"got {n} eigenvalue sets, {len(scores)} scores and {len(titles)} titles; pass one of each per head")
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = new_figure(nrows, ncols, figsize=(2.3 * ncols, 2.3 * nrows + 1.0))
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        lam = np.asarray(eigenvalues[i].detach().cpu().numpy() if hasattr(eigenvalues[i], "detach") else eigenvalues[i])
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.scatter(lam.real, lam.imag, s=10, c=np.where(lam.real >= 0, POSITIVE, NEGATIVE))
        big = float(np.abs(lam).max(initial=0.0)) or 1.0
        lim = big * 3  # room around the outermost eigenvalue (the scale is logarithmic out there)
        ax.set_xscale("symlog", linthresh=big / 20)
        ax.set_yscale("symlog", linthresh=big / 20)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ticks = [-big, 0.0, big]  # the outermost eigenvalue's size, so the log axes have a scale
        size = f"{big:.0f}" if big >= 10 else f"{big:.2g}"  # 450, not 4.5e+02
        labels = [f"-{size}", "0", size]
        ax.set_xticks(ticks, labels, fontsize=SMALL_PT)
        ax.set_yticks(ticks, labels, fontsize=SMALL_PT)
        ax.minorticks_off()
        ax.set_title(f"{titles[i]}: {float(scores[i]):+.2f}", fontsize=LABEL_PT)
        if highlight is not None and highlight[i]:
            for side in ax.spines.values():
                side.set_edgecolor("tab:green")
                side.set_linewidth(2.5)
    marks = [Line2D([], [], marker="o", linestyle="", color=c, markersize=5, label=t)
             for c, t in ((POSITIVE, "Re λ ≥ 0 (copying)"), (NEGATIVE, "Re λ < 0"))]
    if highlight is not None and any(highlight):
        marks.append(Line2D([], [], color="tab:green", linewidth=2.5, label="copying head"))
    fig.legend(handles=marks, loc="outside lower center", ncols=len(marks), fontsize=SMALL_PT + 0.5, frameon=False)
    return finish(fig, "OV eigenvalues (real → right, imaginary → up, log scale); title: Σλ/Σ|λ|")


def _place_labels(ax: Axes, x: np.ndarray, y: np.ndarray, labels: Sequence[str]) -> None:
    """Label each point beside it, trying a few offsets in turn so no two labels overlap."""
    offsets = [(5, 4, "left", "bottom"), (5, -4, "left", "top"), (-5, 4, "right", "bottom"),
               (-5, -4, "right", "top"), (0, 8, "center", "bottom"), (0, -8, "center", "top")]
    renderer = ax.figure.canvas.get_renderer()
    placed = []
    for xi, yi, lab in zip(x, y, labels):
        for k, (dx, dy, ha, va) in enumerate(offsets):
            t = ax.annotate(lab, (xi, yi), textcoords="offset points", xytext=(dx, dy), ha=ha, va=va,
                            fontsize=SMALL_PT + 0.5)
            box = t.get_window_extent(renderer)
            if k == len(offsets) - 1 or not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            t.remove()


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
    x, y = numpy(x).ravel(), numpy(y).ravel()
    if not len(x) == len(y) == len(labels):
        raise ValueError(f"x, y and labels must have one entry per head, got {len(x)}, {len(y)}, {len(labels)}")
    ax = new_axes(ax, (5.0, 4.8))
    colors = ["tab:orange" if i in set(highlight) else "tab:blue" for i in range(len(x))]
    ax.scatter(x, y, c=colors, s=40, zorder=3)
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.axvline(0, color="grey", linewidth=0.6)
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ticks = [-1, -0.5, 0, 0.5, 1]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=TICK_PT)
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks], fontsize=TICK_PT)
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    set_title(ax, title)
    _place_labels(ax, x, y, labels)
    return ax.figure
