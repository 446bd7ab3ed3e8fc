"""Figures of a family of models (chapter 11): one panel per group of members with each member's
score over training and its phase change marked, and the per-token-loss PCA's trajectories."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from attncircuits.show.plotting.base import LABEL_PT, SMALL_PT, TICK_PT, finish, new_figure, numpy, set_title

#: one colour per depth (1 to 6 layers), the same in every figure of the family: colour-blind-safe
#: hues in order round the colour wheel, each dark enough to show on the white figure and on the
#: book's dark mode, which dims it (six blues from light to dark were hard to tell apart there)
DEPTH_COLOURS = ("#009E73", "#0072B2", "#7570B3", "#CC79A7", "#D55E00", "#A6761D")
SCHEME_COLOURS = ("tab:green", "tab:orange", "tab:purple", "tab:red")


def _colour(label: str, i: int) -> str:
    digits = [c for c in label if c.isdigit()]
    if digits and label.rstrip().endswith("l") and 1 <= int(digits[-1]) <= 6:
        return DEPTH_COLOURS[int(digits[-1]) - 1]
    return SCHEME_COLOURS[i % len(SCHEME_COLOURS)]


def member_trajectories(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float], tuple[float, float] | None]]],
    xlabel: str = "tokens seen (millions)",
    ylabel: str = "best induction head's\nprefix matching",
    threshold: float | None = None,
    title: str | None = None,
) -> Figure:
    """Panels side by side on one y scale: ``panels[title][member] = (x, y, window)``, where
    ``window`` (x at the start and the end of the rise, or None) is drawn as a thick stretch of the
    line. ``threshold`` draws a dotted level."""
    if not panels:
        raise ValueError("pass at least one panel: {title: {member: (x, y, window)}}")
    n = len(panels)
    fig, axes = new_figure(1, n, figsize=(2.3 * n, 3.4), sharey=True)
    for col, (name, lines) in enumerate(panels.items()):
        ax = axes[0, col]
        for i, (label, (x, y, window)) in enumerate(lines.items()):
            x, y = numpy(x), numpy(y)
            if x.shape != y.shape:
                raise ValueError(f"{name!r}, {label!r}: {len(y)} values but x has {len(x)}")
            colour = _colour(label, i)
            ax.plot(x, y, color=colour, linewidth=1.2, label=label)
            if window is not None:
                inside = (x >= window[0]) & (x <= window[1])
                ax.plot(x[inside], y[inside], color=colour, linewidth=3.5, solid_capstyle="round")
        if threshold is not None:
            ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
        ax.set_ylim(0, 1.05)
        ax.tick_params(labelsize=TICK_PT)
        ax.set_xlabel(xlabel if col == n // 2 else "", fontsize=LABEL_PT)
        if col == 0:
            ax.set_ylabel(ylabel, fontsize=LABEL_PT)
        set_title(ax, name)
        # under the panel, where it covers no line
        ax.legend(fontsize=SMALL_PT, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False,
                  ncol=3 if len(lines) > 4 else 2, handlelength=1.2, columnspacing=0.8, labelspacing=0.2)
    return finish(fig, title)


def loss_pca_paths(
    paths: Mapping[str, np.ndarray],
    marks: Mapping[str, int | None],
    explained: Sequence[float],
    title: str | None = None,
) -> Figure:
    """The per-token-loss PCA: ``paths[member]`` is ``[n_snapshots, 2]``, drawn from its first
    snapshot (a small circle) to its last; ``marks[member]`` (a snapshot index or None) is drawn as
    a large dot, the phase change. Members with MLPs are dashed."""
    if not paths:
        raise ValueError("pass at least one member's path: {member: [n_snapshots, 2]}")
    fig, axes = new_figure(1, 1, figsize=(6.7, 4.6))
    ax = axes[0, 0]
    for i, (label, p) in enumerate(paths.items()):
        p = numpy(p)
        if p.ndim != 2 or p.shape[1] != 2:
            raise ValueError(f"{label!r}: a path is [n_snapshots, 2], got shape {p.shape}")
        colour = _colour(label, i)
        style = "--" if "mlp" in label else "-"
        ax.plot(p[:, 0], p[:, 1], style, color=colour, linewidth=1.1, label=label)
        ax.plot(*p[0], "o", color=colour, markersize=3, markerfacecolor="white")
        at = marks.get(label)
        if at is not None:
            ax.plot(*p[at], "o", color=colour, markersize=6, markeredgecolor="black", markeredgewidth=0.6)
    ev = list(explained)
    ax.set_xlabel(f"component 1 ({ev[0]:.0%} of the variance)", fontsize=LABEL_PT)
    ax.set_ylabel(f"component 2 ({ev[1]:.0%})", fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.legend(fontsize=SMALL_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              frameon=False, handlelength=1.8, labelspacing=0.25)
    return finish(fig, title)
