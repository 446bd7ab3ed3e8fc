"""Figures of chapter 14 (Stages in the weights): curves over training on one step axis with the
stage boundaries drawn across every panel, sampler loss traces, and paths of checkpoints on two
principal components."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from attncircuits.show.plotting.base import LABEL_PT, SMALL_PT, TICK_PT, finish, new_figure, numpy

BOUNDARY = dict(color="tab:red", linestyle="--", linewidth=0.9)


def stage_panels(
    steps: Sequence[float],
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    boundaries: Sequence[float] = (),
    levels: Mapping[str, Mapping[str, float]] | None = None,
    title: str | None = None,
) -> Figure:
    """One panel per entry of ``panels`` (its y label) stacked on a shared step axis, each with
    its curves ``{label: values}``; ``boundaries`` (steps) are dashed red lines across every panel,
    ``levels[panel]`` horizontal references ``{label: y}`` (dotted, dash-dotted, dashed) named in the
    legend."""
    if not panels:
        raise ValueError("pass at least one panel: {y label: {curve: values}}")
    x = numpy(steps)
    n = len(panels)
    fig, axes = new_figure(n, 1, figsize=(6.5, 1.55 * n + 0.6), sharex=True)
    legends = []
    for row, (ylabel, curves) in enumerate(panels.items()):
        ax = axes[row, 0]
        for label, y in curves.items():
            y = numpy(y)
            if y.shape != x.shape:
                raise ValueError(f"{ylabel!r}, {label!r}: {len(y)} values for {len(x)} steps")
            ax.plot(x, y, marker=".", markersize=3, linewidth=1.1, label=label)
        for k, (label, y) in enumerate(((levels or {}).get(ylabel) or {}).items()):
            ax.axhline(y, color=("dimgrey", "tab:purple", "tab:olive")[k % 3], linestyle=(":", "-.", "--")[k % 3],
                       linewidth=1.1, label=label)
        for b in boundaries:
            ax.axvline(b, **BOUNDARY)
        ax.set_ylabel(ylabel, fontsize=LABEL_PT)
        ax.tick_params(labelsize=TICK_PT)
        if len(curves) + len((levels or {}).get(ylabel) or {}) > 1:
            legends.append(ax)
    axes[-1, 0].set_xlabel("training step" + (" (dashed: stage boundaries)" if len(boundaries) else ""),
                           fontsize=LABEL_PT)
    return finish(fig, title, legends)


def loss_traces(
    traces: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    init_loss: float,
    title: str | None = None,
) -> Figure:
    """Sampler loss traces ``{label: (draw, loss)}`` against the loss at w* (dotted), on a log y
    axis of the rise above it (``loss - init_loss``, floored at 0.01 nats)."""
    if not traces:
        raise ValueError("pass at least one trace: {label: (draw, loss)}")
    fig, axes = new_figure(1, 1, figsize=(6.5, 3.4))
    ax = axes[0, 0]
    for label, (d, y) in traces.items():
        ax.plot(numpy(d), np.maximum(numpy(y) - init_loss, 0.01), linewidth=1.2, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("SGLD step", fontsize=LABEL_PT)
    ax.set_ylabel("loss minus L(w*) (nats)", fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.legend(fontsize=SMALL_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return finish(fig, title)


def checkpoint_paths(
    paths: Mapping[str, np.ndarray],
    marks: Mapping[str, Sequence[int]] | None = None,
    explained: Mapping[str, Sequence[float]] | None = None,
    title: str | None = None,
) -> Figure:
    """Panels side by side, one path of checkpoints ``[n, 2]`` each (first checkpoint a circle, the
    rest dots joined in order); ``marks[panel]`` (checkpoint indices) are drawn as red crosses, the
    stage boundaries; ``explained[panel]`` the two components' shares of variance, on the axes."""
    if not paths:
        raise ValueError("pass at least one path: {panel: [n_checkpoints, 2]}")
    n = len(paths)
    fig, axes = new_figure(1, n, figsize=(3.25 * n, 3.2))
    for col, (name, p) in enumerate(paths.items()):
        ax = axes[0, col]
        p = numpy(p)
        if p.ndim != 2 or p.shape[1] != 2:
            raise ValueError(f"{name!r}: a path is [n_checkpoints, 2], got shape {p.shape}")
        ax.plot(p[:, 0], p[:, 1], color="tab:blue", linewidth=1, marker=".", markersize=4)
        ax.plot(p[0, 0], p[0, 1], "o", color="tab:blue", markerfacecolor="none", markersize=7)
        for i in (marks or {}).get(name, ()):
            ax.plot(p[i, 0], p[i, 1], "x", color="tab:red", markersize=8, markeredgewidth=2)
        share = (explained or {}).get(name)
        ax.set_xlabel("component 1" + (f" ({share[0]:.0%})" if share is not None else ""), fontsize=LABEL_PT)
        ax.set_ylabel("component 2" + (f" ({share[1]:.0%})" if share is not None else ""), fontsize=LABEL_PT)
        ax.set_title(name, fontsize=LABEL_PT)
        ax.tick_params(labelsize=TICK_PT)
    return finish(fig, title)
