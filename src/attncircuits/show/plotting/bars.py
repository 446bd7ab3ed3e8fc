"""Bar charts: next-token probabilities side by side, and grouped bars per head or per term."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from jaxtyping import Float
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attncircuits.show.plotting.base import (
    LABEL_PT,
    SMALL_PT,
    TICK_PT,
    finish,
    legend_under_axis,
    new_axes,
    new_figure,
    numpy,
    place_legend,
    set_title,
    token_ticks,
)


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
    fig, axes = new_figure(1, len(panels), figsize=(3.4 * len(panels), 1.2 + 0.3 * k))
    top = max(float(numpy(p).max(initial=0.0)) for _, p in panels.values()) or 1.0
    for ax, (name, (toks, probs)) in zip(axes[0], panels.items()):
        p = numpy(probs)
        if len(p) != len(toks):
            raise ValueError(f"panel {name!r}: {len(toks)} tokens but {len(p)} probabilities")
        ax.barh(range(len(p)), p, color="tab:blue")
        token_ticks(ax, "y", toks)
        ax.set_ylim(k - 0.5, -0.5)
        ax.set_xlim(0, top * 1.3)
        ax.tick_params(axis="x", labelsize=TICK_PT)
        for i, pi in enumerate(p):
            ax.text(pi, i, f" {pi:.2f}", va="center", fontsize=SMALL_PT + 0.5)
        ax.set_xlabel("probability", fontsize=LABEL_PT)
        set_title(ax, name, pt=LABEL_PT)
    return finish(fig, title)


def grouped_bars(
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ax: Axes | None = None,
    title: str | None = None,
    ylabel: str = "",
    hline: float | None = None,
    xlabel: str = "",
    legend_below: bool = False,
) -> Figure:
    """Bars per group (e.g. per head), one colour per series (e.g. from the weights vs measured).

    ``legend_below`` puts the legend under the axes, in up to three columns, where it cannot cover
    a bar (for many series)."""
    if not series:
        raise ValueError("pass at least one series: {name: values per group}")
    for name, vals in series.items():
        if len(vals) != len(groups):
            raise ValueError(f"series {name!r} has {len(vals)} values for {len(groups)} groups")
    ax = new_axes(ax, (max(5.0, 1.8 + 0.9 * len(groups)), 3.6))
    width = 0.8 / len(series)
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(np.arange(len(groups)) + (i - (len(series) - 1) / 2) * width, numpy(vals), width, label=name)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups, fontsize=TICK_PT)
    ax.tick_params(axis="y", labelsize=TICK_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    if legend_below:
        legend_under_axis(ax, fontsize=SMALL_PT + 0.5, ncols=min(3, len(series)), frameon=False)
    set_title(ax, title)
    if not legend_below:
        place_legend(ax, ncols=2 if len(series) > 3 else 1)
    return ax.figure
