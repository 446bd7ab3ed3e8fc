"""What every figure shares: its size and type sizes, the single display, and the repeated pieces
(titles, reference lines, legends placed where they cover no data, numbers written in heatmap
cells, token tick labels).

The legibility rule and the numbers behind it are stated in :mod:`attncircuits.show.plotting`.
"""

from __future__ import annotations

import io
import textwrap
import warnings
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox, offset_copy

from attncircuits.data import visible

#: The book's content column at a 1300 px window, in CSS px (measured in the built book).
COLUMN_PX = 692
#: The smallest text a figure may show, in CSS px once the figure is scaled to the column.
MIN_TEXT_PX = 11.0
#: Pixels per inch of every figure (the inline backend's default): an inch of figure is 100 px.
DPI = 100
#: The margin the notebook's PNG adds around what is drawn, on each side, in inches (savefig's default).
PAD_IN = 0.1
#: The widest figure that is shown at its own size in the column (margins included), in inches.
MAX_WIDTH_IN = COLUMN_PX / DPI - 2 * PAD_IN
#: Type sizes in points (a point is DPI / 72 px): numbers in cells and tick labels, axis labels, titles.
SMALL_PT, TICK_PT, LABEL_PT, TITLE_PT = 8.0, 9.0, 10.0, 11.0


class ShowOnceFigure(Figure):
    """A pyplot figure that a notebook shows exactly once.

    Jupyter's inline backend shows every open pyplot figure at the end of a cell, and a figure left
    as the cell's value is shown a second time. This figure, when displayed (as the cell's value or
    by ``display``), leaves pyplot's list of open figures first and is then shown as a PNG, so the
    end-of-cell pass no longer sees it. A cell that keeps it in a variable and calls ``plt.show()``
    shows it once through pyplot as before.
    """

    def _ipython_display_(self) -> None:
        from IPython.display import Image, display

        release(self)
        display(Image(data=figure_png(self)))


def release(fig) -> None:
    """Remove ``fig`` from pyplot's open figures (if it is one), keeping the figure itself usable."""
    if isinstance(fig, Figure) and fig.canvas.manager is not None and plt.fignum_exists(fig.number):
        plt.close(fig)


def figure_png(fig: Figure) -> bytes:
    """The PNG a notebook shows for ``fig``: its own dpi, cropped to what is drawn."""
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a token the font lacks shows as a box, not as a warning in the page
        warnings.filterwarnings("ignore", message=r"Glyph .* missing from", category=UserWarning)
        fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight", pad_inches=PAD_IN, facecolor="white")
    return buf.getvalue()


def numpy(x) -> np.ndarray:
    """A tensor, array or list as a float numpy array (detached, on the CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def new_figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (6.0, 3.5), **kw):
    """``(figure, axes[nrows, ncols])``: a :class:`ShowOnceFigure` at :data:`DPI`, constrained layout,
    never wider than the column (:data:`MAX_WIDTH_IN`) so it is never scaled down."""
    w, h = figsize
    if w > MAX_WIDTH_IN:
        w, h = MAX_WIDTH_IN, h * MAX_WIDTH_IN / w
    kw.setdefault("layout", "constrained")
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, h), dpi=DPI, squeeze=False, FigureClass=ShowOnceFigure, **kw)
    return fig, axes


def subplots(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (6.0, 3.5), squeeze: bool = True, **kw):
    """Like ``plt.subplots``, for composing panels from the functions here: the figure shows once
    and is never wider than the column, so its text keeps the size it was drawn at."""
    fig, axes = new_figure(nrows, ncols, figsize, **kw)
    if not squeeze:
        return fig, axes
    return fig, axes[0, 0] if axes.size == 1 else axes.squeeze()


def new_axes(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    """``ax`` itself when the caller composes panels, else the one axes of a new figure."""
    if ax is not None:
        return ax
    return new_figure(figsize=figsize)[1][0, 0]


def axes_width_chars(ax: Axes, pt: float) -> int:
    """About how many characters of ``pt``-point text fit across ``ax`` (average glyph 0.55 em)."""
    fig = ax.figure
    width_in = ax.get_position().width * fig.get_figwidth()
    return max(12, int(width_in * 72 / (0.55 * pt)))


def set_title(ax: Axes, title: str | None, pt: float = TITLE_PT) -> None:
    """An axes title wrapped to the axes' width, so it never runs over a neighbouring colorbar."""
    if title:
        ax.set_title(wrap(title, axes_width_chars(ax, pt) + 6), fontsize=pt)


def wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters, keeping its own line breaks."""
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def finish(fig: Figure, title: str | None = None, legend_axes: Sequence[Axes] = ()) -> Figure:
    """The common ending: a figure title wrapped to the figure's width, then legends on
    ``legend_axes`` (last, since each is placed where the finished layout leaves it clear of data)."""
    if title:
        chars = int(fig.get_figwidth() * 72 / (0.55 * (TITLE_PT + 0.5)))
        fig.suptitle(wrap(title, chars), fontsize=TITLE_PT + 0.5)
    for ax in legend_axes:
        place_legend(ax)
    return fig


def reference_lines(ax: Axes, levels: Mapping[str, float] | None) -> None:
    """Dashed horizontal lines at named levels (e.g. the uniform and unigram losses), each labelled
    just outside the right edge of the axes, where no data is drawn; call it after plotting the
    data, as it widens the y range to include the levels."""
    if not levels:
        return
    for label, level in levels.items():
        ax.axhline(level, color="grey", linestyle="--", linewidth=1)
        ax.annotate(label, (1.0, level), xycoords=("axes fraction", "data"), xytext=(3, 0),
                    textcoords="offset points", ha="left", va="center", fontsize=SMALL_PT + 0.5,
                    color="dimgrey", annotation_clip=False)
    lo, hi = ax.get_ylim()
    lo, hi = min(lo, *levels.values()), max(hi, *levels.values())
    pad = 0.03 * (hi - lo)
    ax.set_ylim(lo - pad, hi + pad)


def _renderer(fig: Figure):
    """``fig`` drawn once (layout included), and its renderer: boxes are known only after a draw."""
    if not hasattr(fig.canvas, "get_renderer"):  # a Figure made without pyplot has no drawing canvas yet
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    return renderer


def _data_points(ax: Axes) -> np.ndarray:
    """Display coordinates of what ``ax`` plots: points along every line (each segment sampled, so a
    line crossing a box between two of its points is caught), scatter points and bar corners."""
    pts = []
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.isfinite(xy).all(1)]
        if len(xy) > 1:
            t = np.linspace(0.0, 1.0, 24)[:, None, None]
            xy = (xy[:-1] * (1 - t) + xy[1:] * t).reshape(-1, 2)
        pts.append(xy)
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets(), dtype=float)
        if coll.get_visible() and offsets.size:
            pts.append(coll.get_offset_transform().transform(offsets))
    for patch in ax.patches:
        if patch.get_visible():
            box = patch.get_window_extent()
            pts.append(np.array([[box.x0, box.y1], [box.x1, box.y1], [(box.x0 + box.x1) / 2, box.y1]]))
    return np.concatenate(pts) if pts else np.zeros((0, 2))


def _covers(box: Bbox, points: np.ndarray) -> bool:
    inside = (points[:, 0] > box.x0) & (points[:, 0] < box.x1) & (points[:, 1] > box.y0) & (points[:, 1] < box.y1)
    return bool(inside.any())


def _axis_labels(fig: Figure) -> list[Text]:
    """Every visible tick label and axis label of ``fig``'s axes."""
    texts = []
    for ax in fig.axes:
        for i, axis in enumerate((ax.xaxis, ax.yaxis)):
            lo, hi = sorted(axis.get_view_interval())
            texts += [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text().strip()
                      and lo - 1e-9 * (hi - lo) <= t.get_position()[i] <= hi + 1e-9 * (hi - lo)]
            if axis.label.get_visible() and axis.label.get_text().strip():
                texts.append(axis.label)
    return texts


def covered_data(fig: Figure) -> list[str]:
    """What a legend or a text label of an axes covers in ``fig``: one line per legend or label
    whose box holds a plotted point of its axes (a line, a scatter point, a bar's top), runs into a
    tick label or an axis label, or overlaps another label or legend of the figure. Draws the figure."""
    renderer = _renderer(fig)
    found = []
    axis_labels = [(t, t.get_window_extent(renderer)) for t in _axis_labels(fig)]
    for ax in fig.axes:
        points = _data_points(ax)
        boxes = [(f"legend {[t.get_text() for t in leg.get_texts()][:3]}", leg.get_window_extent(renderer))
                 for leg in [ax.get_legend()] if leg is not None]
        boxes += [(f"label {t.get_text()!r}", t.get_window_extent(renderer)) for t in ax.texts
                  if t.get_visible() and t.get_text().strip()]
        for name, box in boxes:
            if _covers(box, points):
                found.append(f"{name} covers data in {ax.get_title()!r}")
            for label, label_box in axis_labels:
                inter = Bbox.intersection(box, label_box)
                if inter is not None and inter.width * inter.height > 1.0:
                    found.append(f"{name} covers the axis label {label.get_text()!r} in {ax.get_title()!r}")
        for (a, ba), (b, bb) in zip(boxes, boxes[1:]):
            inter = Bbox.intersection(ba, bb)
            if inter is not None and inter.width * inter.height > 1.0:
                found.append(f"{a} overlaps {b} in {ax.get_title()!r}")
    return found


def legend_under_axis(ax: Axes, gap_pt: float = 4.0, **kw):
    """The axes' legend centred under its x axis: below the tick labels and the x label, however
    many lines they take, so it covers neither them nor a bar. The gap is in points, so it holds
    whatever size the layout later gives the axes."""
    renderer = _renderer(ax.figure)
    axis_box = ax.xaxis.get_tightbbox(renderer)  # None when the x axis draws nothing
    below = 0.0 if axis_box is None else ax.get_window_extent(renderer).y0 - axis_box.y0
    depth_pt = max(0.0, below) * 72 / ax.figure.dpi + gap_pt
    under = offset_copy(ax.transAxes, fig=ax.figure, y=-depth_pt, units="points")
    return ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=under, **kw)


def place_legend(ax: Axes, fontsize: float = SMALL_PT + 0.5, **kw):
    """The axes' legend where it covers no data: at matplotlib's "best" place inside the axes when
    that place holds no plotted point nor label (:func:`covered_data`), then fixed there, else just
    outside the right edge, at the top, or at the bottom if a label sits there. Call it once the
    axes are complete (title and labels included): the check is made on the figure as drawn."""
    leg = ax.legend(fontsize=fontsize, loc="best", **kw)
    if not covered_data(ax.figure):
        # "best" is recomputed at every draw: keep the place that was checked
        (x0, y0), _ = ax.transAxes.inverted().transform(leg.get_window_extent())
        leg.set_loc((float(x0), float(y0)))
        return leg
    for loc, anchor in (("upper left", (1.02, 1.0)), ("lower left", (1.02, 0.0))):
        leg.remove()
        leg = ax.legend(fontsize=fontsize, loc=loc, bbox_to_anchor=anchor, borderaxespad=0.0, **kw)
        if not covered_data(ax.figure):
            break
    return leg


def annotate_cells(ax: Axes, m: np.ndarray, fmt: str, center: float, span: float, pt: float = SMALL_PT) -> None:
    """Write each cell's value in an ``imshow`` heatmap, white on cells far from ``center``."""
    for (i, j), v in np.ndenumerate(m):
        ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=pt,
                color="white" if abs(v - center) > 0.6 * span else "black")


def token_ticks(ax: Axes, which: str, labels: Sequence[str], rotation: float = 0, pt: float = TICK_PT, **kw) -> None:
    """Token tick labels in monospace, whitespace made visible (``·`` space, ``⏎`` newline)."""
    shown = [visible(str(t)) for t in labels]
    if which == "x":
        ax.set_xticks(range(len(shown)), shown, rotation=rotation, fontsize=pt, family="monospace", **kw)
    else:
        ax.set_yticks(range(len(shown)), shown, fontsize=pt, family="monospace", **kw)


def colorbar(fig: Figure, mappable, ax, label: str = "", shrink: float = 0.85, location: str = "right"):
    """A colorbar beside ``ax`` (or below it) with its label and ticks at the type sizes above."""
    cb = fig.colorbar(mappable, ax=ax, shrink=shrink, location=location)
    cb.set_label(label, fontsize=LABEL_PT - 1)
    cb.ax.tick_params(labelsize=SMALL_PT + 0.5)
    return cb


def signed_or_sequential(m: np.ndarray) -> dict:
    """``imshow`` colour arguments: a diverging scale centred at 0 for signed values, a sequential
    one from 0 for values that are all non-negative (norms, probabilities)."""
    hi = float(np.abs(m).max(initial=0.0)) or 1.0
    if m.size and float(m.min()) >= 0:
        return {"cmap": "viridis", "vmin": 0.0, "vmax": hi}
    return {"cmap": "RdBu_r", "vmin": -hi, "vmax": hi}


# ---- legibility ---------------------------------------------------------------------------------
def _drawn_texts(fig: Figure) -> list[Text]:
    """Every text the figure draws: titles, labels, visible tick labels, legends, cell values, tables."""
    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update((tick.label1, tick.label2))
    shown = [t for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in axis.get_ticklabels(which="both")]
    others = [t for t in fig.findobj(Text) if t not in ticks]
    return [t for t in others + shown if t.get_visible() and t.get_text().strip()]


def shown_width_px(fig: Figure) -> float:
    """The width of the PNG a notebook shows for ``fig`` (cropped to what is drawn, plus a margin
    of :data:`PAD_IN` on each side, as both the inline backend and :func:`figure_png` save it), in px."""
    if not hasattr(fig.canvas, "get_renderer"):  # a Figure made without pyplot has no drawing canvas yet
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    return (fig.get_tightbbox(renderer).width + 2 * PAD_IN) * fig.dpi


def text_sizes_px(fig: Figure, column_px: float = COLUMN_PX) -> list[tuple[float, str]]:
    """``(size in px, text)`` of every text in ``fig`` as a reader sees it in a column
    ``column_px`` wide: the figure is shown at its own size, or scaled down to the column."""
    return _sizes_px(fig, shown_width_px(fig), column_px)


def _sizes_px(fig: Figure, width_px: float, column_px: float) -> list[tuple[float, str]]:
    """:func:`text_sizes_px` of a figure just drawn, ``width_px`` wide."""
    scale = min(1.0, column_px / width_px)
    return sorted((t.get_fontsize() * fig.dpi / 72 * scale, t.get_text()) for t in _drawn_texts(fig))


def overlapping_labels(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of neighbouring tick labels on one axis whose drawn boxes overlap (unreadable however
    large they are)."""
    shown_width_px(fig)  # draws the figure
    return _overlaps(fig)


def legibility(fig: Figure, column_px: float = COLUMN_PX) -> tuple[float, float, list[tuple[str, str]]]:
    """``(smallest text in px, shown width in px, overlapping tick labels)`` of ``fig`` in a column
    ``column_px`` wide, from one drawing (:func:`smallest_text_px`, :func:`shown_width_px` and
    :func:`overlapping_labels` each draw the figure)."""
    width = shown_width_px(fig)
    sizes = _sizes_px(fig, width, column_px)
    return (sizes[0][0] if sizes else float("inf")), width, _overlaps(fig)


def _overlaps(fig: Figure) -> list[tuple[str, str]]:
    """:func:`overlapping_labels` of a figure just drawn."""
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text().strip()]
            boxes = [t.get_window_extent(renderer) for t in labels]
            for (a, ba), (b, bb) in zip(zip(labels, boxes), zip(labels[1:], boxes[1:])):
                inter = Bbox.intersection(ba, bb)
                if inter is not None and inter.width * inter.height > 1.0:  # more than touching
                    out.append((a.get_text(), b.get_text()))
    return out


def smallest_text_px(fig: Figure, column_px: float = COLUMN_PX) -> float:
    """The size in px of the smallest text of ``fig`` once shown in the column (see :func:`text_sizes_px`)."""
    sizes = text_sizes_px(fig, column_px)
    return sizes[0][0] if sizes else float("inf")
