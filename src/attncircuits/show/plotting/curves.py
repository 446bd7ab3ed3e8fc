"""Curves: loss over training, loss at each position of a text, and several measures over training
time on one shared axis (the phase change)."""

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
    new_axes,
    new_figure,
    numpy,
    place_legend,
    reference_lines,
    set_title,
)


def _points(xs: Sequence, ys: Sequence) -> tuple[list, list]:
    """The ``(x, y)`` pairs whose ``y`` is not ``None`` (e.g. no train loss before the first step)."""
    pts = [(a, b) for a, b in zip(xs, ys) if b is not None]
    return [a for a, _ in pts], [b for _, b in pts]


def _style(ax: Axes, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)


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
    ax = new_axes(ax, (6.4, 3.6))
    for key in keys:
        if key not in history:
            raise KeyError(f"history has no {key!r} column; available: {sorted(history)}")
        ax.plot(*_points(list(history[x]), history[key]), marker=".", label=key.replace("_", " "))
    reference_lines(ax, hlines)
    _style(ax, x, "loss (nats / token)")
    set_title(ax, title)
    place_legend(ax)
    return ax.figure


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
    ax = new_axes(ax, (7.0, 3.6))
    for label, loss in curves.items():
        y = numpy(loss).ravel()
        ax.plot(np.arange(1, len(y) + 1), y, label=label, linewidth=1.2)
    for s in copy_starts:
        ax.axvline(s, color="grey", linestyle=":", linewidth=1)
    reference_lines(ax, hlines)
    _style(ax, "position of the predicted token", "loss (nats)")
    set_title(ax, title)
    place_legend(ax)
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
    fig, axes = new_figure(len(panels), 1, figsize=(7.0, 2.0 * len(panels) + 0.7), sharex=True)
    for ax, (ylabel, lines) in zip(axes[:, 0], panels.items()):
        for label, ys in lines.items():
            if len(ys) != len(xs):
                raise ValueError(f"line {label!r} has {len(ys)} values but x has {len(xs)}")
            ax.plot(*_points(xs, ys), marker=".", markersize=3, label=label)
        for at in (vlines or {}).values():
            ax.axvline(at, color="tab:red", linestyle="--", linewidth=1)
        _style(ax, "", ylabel)
    for name, at in (vlines or {}).items():
        axes[0, 0].annotate(name, (at, 1.0), xycoords=("data", "axes fraction"), ha="left", va="bottom",
                            fontsize=SMALL_PT + 0.5, color="tab:red")
    axes[-1, 0].set_xlabel(xlabel, fontsize=LABEL_PT)
    return finish(fig, title, legend_axes=list(axes[:, 0]))


def histories_side_by_side(
    runs: Mapping[str, tuple[Sequence[float], Mapping[str, Sequence[float | None]]]],
    xlabel: str = "tokens seen",
    vlines: Mapping[str, float | None] | None = None,
    title: str | None = None,
) -> Figure:
    """Training histories of several models, one column each, the same measures in the same rows
    on a shared y axis: ``runs[model] = (x, {y label: values})``. ``vlines[model]`` marks a moment
    (e.g. its phase change) in every panel of that column; ``None`` values are skipped."""
    if not runs:
        raise ValueError("pass at least one run: {model: (x, {y label: values})}")
    rows = list(next(iter(runs.values()))[1])
    for name, (_, panels) in runs.items():
        if list(panels) != rows:
            raise ValueError(f"run {name!r} has panels {list(panels)}, expected {rows}: every column shows the same rows")
    fig, axes = new_figure(len(rows), len(runs), figsize=(3.6 * len(runs), 1.9 * len(rows) + 0.8), sharey="row")
    for col, (name, (x, panels)) in enumerate(runs.items()):
        xs = list(x)
        for row, ylabel in enumerate(rows):
            ax, ys = axes[row, col], panels[ylabel]
            if len(ys) != len(xs):
                raise ValueError(f"{name!r}, {ylabel!r}: {len(ys)} values but x has {len(xs)}")
            ax.plot(*_points(xs, ys), marker=".", markersize=3)
            at = (vlines or {}).get(name)
            if at is not None:
                ax.axvline(at, color="tab:red", linestyle="--", linewidth=1)
            _style(ax, xlabel if row == len(rows) - 1 else "", ylabel if col == 0 else "")
        set_title(axes[0, col], name)
    return finish(fig, title)
