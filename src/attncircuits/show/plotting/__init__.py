"""Figures and HTML views. Functions here draw what they are given; they compute nothing.

One module per kind of picture: :mod:`~.heatmaps`, :mod:`~.curves`, :mod:`~.scatter`,
:mod:`~.bars`, the HTML views (token shading, tables) in :mod:`~.html`, and what they all share
(sizes, the single display, titles, reference lines, cell values) in :mod:`~.base`. Every name is
re-exported here: ``from attncircuits.show.plotting import attention_heatmap``. To compose panels, take
the axes from :func:`~.base.subplots` (``plt.subplots`` capped at the column's width).

**Shown once.** Figure functions take an optional matplotlib ``ax`` (so chapters can compose
panels) and return the figure they drew on. A figure they create themselves is a
:class:`~.base.ShowOnceFigure`: a cell that ends in the call shows it exactly once (not once by the
inline backend and again as the cell's value), and ``fig = ...; plt.show()`` works as usual.

**Legible in the book.** The built book's content column is :data:`~.base.COLUMN_PX` = 692 CSS px
wide at a 1300 px window (measured in the built HTML with headless Chromium: ``article.bd-article``
is 756 px with 32 px padding on each side, and cell outputs are 692 px wide). A wider image either
runs past the column's edge (a cell's PNG output, measured: 703 px shown at 703 px) or is scaled
down to fit it (an explorer's states). The rule: every figure fits the column, and every text of
it, at the size a reader sees it,

    font size in pt x dpi / 72 x min(1, column px / figure px)  >=  MIN_TEXT_PX = 11 px,

where "figure px" is the width of the PNG the notebook shows (cropped to what is drawn, plus a
0.1 in margin on each side). 11 px is the smallest print the theme itself uses (10.8 px keyboard
hints; its small print is 14.4 px, code 14 px, body text 16 px). Figures here are at most 6.72 in
wide at 100 dpi (692 px with the margins), so they are never scaled down, and their smallest type
is 8 pt (11.1 px): numbers in cells and dense token labels; tick labels are 9 pt (12.5 px), axis
labels 10 pt and titles 11 pt.
:func:`~.base.smallest_text_px` measures a figure against the rule, and
:func:`~.base.overlapping_labels` finds tick labels that run into each other; the tests apply both
to every figure function at the calls the chapters make.

**Nothing covers the data.** A reference level's label sits just right of the axes, and a legend is
placed by :func:`~.base.place_legend`: at matplotlib's "best" place only when that place holds no
plotted point nor label, else beside the axes; :func:`~.base.covered_data` is the check, and the
tests apply it to every figure function at the chapters' calls.

Token labels have their whitespace made visible (``·`` space, ``⏎`` newline) with
:func:`attncircuits.data.visible`; passing labels that are already visible is harmless.
"""

from attncircuits.show.plotting.bars import grouped_bars, next_token_bars
from attncircuits.show.plotting.base import (
    COLUMN_PX,
    DPI,
    MAX_WIDTH_IN,
    MIN_TEXT_PX,
    ShowOnceFigure,
    covered_data,
    figure_png,
    overlapping_labels,
    place_legend,
    smallest_text_px,
    subplots,
    text_sizes_px,
)
from attncircuits.show.plotting.curves import histories_side_by_side, loss_curve, phase_change_plot, position_loss_plot
from attncircuits.show.plotting.family import loss_pca_paths, member_trajectories
from attncircuits.show.plotting.heatmaps import (
    attention_heatmap,
    circuit_heatmap,
    composition_heatmaps,
    head_circuits_figure,
    head_patterns_grid,
    heatmap_grid,
    path_terms_heatmap,
    pattern_windows,
    score_heatmaps,
)
from attncircuits.show.plotting.html import (
    html_table,
    next_token_table_html,
    skip_trigram_table_html,
    token_html,
    tokens_html,
)
from attncircuits.show.plotting.scatter import bigram_scatter, eigen_scatter, eigenvalue_planes
from attncircuits.show.plotting.stages import checkpoint_paths, loss_traces, stage_panels

__all__ = [
    "COLUMN_PX",
    "DPI",
    "MAX_WIDTH_IN",
    "MIN_TEXT_PX",
    "ShowOnceFigure",
    "attention_heatmap",
    "bigram_scatter",
    "checkpoint_paths",
    "circuit_heatmap",
    "composition_heatmaps",
    "covered_data",
    "eigen_scatter",
    "eigenvalue_planes",
    "figure_png",
    "grouped_bars",
    "head_circuits_figure",
    "head_patterns_grid",
    "heatmap_grid",
    "html_table",
    "loss_curve",
    "loss_pca_paths",
    "loss_traces",
    "member_trajectories",
    "next_token_bars",
    "next_token_table_html",
    "overlapping_labels",
    "path_terms_heatmap",
    "pattern_windows",
    "phase_change_plot",
    "place_legend",
    "histories_side_by_side",
    "position_loss_plot",
    "score_heatmaps",
    "skip_trigram_table_html",
    "smallest_text_px",
    "stage_panels",
    "subplots",
    "text_sizes_px",
    "token_html",
    "tokens_html",
]
