"""HTML views: text with tokens shaded by a weight, and tables. Plain HTML with inline styles and no
JavaScript, so a notebook and the built book (a ``text/html`` output) show the same thing offline.

Tokens are shown with their whitespace made visible (``·`` space, ``⏎`` newline) in a small tinted
box (:func:`token_html`), so a token's extent is always visible: a lone ``_`` or ``·`` reads as a
token in its own cell, never as a stray line over the next row.
"""

from __future__ import annotations

import html
from typing import Mapping, Sequence

import numpy as np
from jaxtyping import Float

from attncircuits.data import visible
from attncircuits.show.plotting.base import numpy

#: The outlined box around one token (inline style: no stylesheet needed). Its text and background
#: colours are set together, from the book theme's variables where there are any (so the box follows
#: the theme's light and dark modes) and otherwise dark on white (Jupyter, Colab).
TOKEN_STYLE = (
    "background:var(--pst-color-background,#fff);color:var(--pst-color-text-base,#24292f);"
    "border:1px solid var(--pst-color-border,#d0d7de);border-radius:3px;padding:0 3px;"
    "white-space:pre;line-height:1.5"
)

#: The class of every table here: pandas' class, which the book theme styles in both of its modes
#: (heading, zebra rows, text colour); a table without it sits on a light box in dark mode.
TABLE_CLASS = "dataframe"


def _html(markup: str):
    from IPython.display import HTML

    return HTML(markup)


def title_html(title: str | None) -> str:
    """A bold line above a view; empty without a title."""
    return f'<div style="font-weight:bold;margin-bottom:4px">{html.escape(title)}</div>' if title else ""


def token_html(token: str) -> str:
    """One token as escaped, whitespace-visible monospace text in a tinted box."""
    return f'<code style="{TOKEN_STYLE}">{html.escape(visible(token))}</code>'


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
    w = numpy(weights).reshape(-1)
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
    legend = (
        f'<div style="font-size:80%;opacity:.75;margin-top:4px">shade: |weight|, full at {scale:.3g}'
        + (" (blue positive, red negative)" if (w < 0).any() else "")
        + ("; outlined: the query token" if highlight is not None else "")
        + "</div>"
    )
    body = '<div style="font-family:monospace;line-height:1.8;white-space:normal">' + "".join(spans) + "</div>"
    return _html(f'<div class="attncircuits-tokens">{title_html(title)}{body}{legend}</div>')


def _cell(x, token: bool) -> str:
    if token and isinstance(x, str):
        return f"<td style='text-align:left'>{token_html(x)}</td>"
    if isinstance(x, float):
        return f"<td style='text-align:right'>{x:.2f}</td>"
    return f"<td style='text-align:left'>{html.escape(str(x))}</td>"


def html_table(
    columns: Sequence[str],
    rows: Sequence[Sequence],
    title: str | None = None,
    token_columns: Sequence[str] | None = None,
):
    """A table as HTML: string cells in ``token_columns`` (default: every column) are tokens
    (:func:`token_html`), floats get two decimals, anything else is escaped text."""
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"row {tuple(r)!r} has {len(r)} cells for {len(columns)} columns")
    is_token = [token_columns is None or c in token_columns for c in columns]
    th = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(x, t) for x, t in zip(r, is_token)) + "</tr>" for r in rows)
    return _html(f'{title_html(title)}<table class="{TABLE_CLASS}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>')


def next_token_table_html(
    current: Sequence[str],
    columns: Mapping[str, Sequence[Sequence[tuple[str, float]]]],
    title: str | None = None,
):
    """An HTML table: one row per current token, one column per source, each cell its top next
    tokens with probabilities (``columns[name][row] = [(token, p), ...]``)."""
    for name, cells in columns.items():
        if len(cells) != len(current):
            raise ValueError(f"column {name!r} has {len(cells)} rows but there are {len(current)} current tokens")
    th = "".join(f"<th style='text-align:left'>{html.escape(n)}</th>" for n in ["current token", *columns])
    rows = []
    for i, tok in enumerate(current):
        cells = [f"<td style='text-align:left'>{token_html(tok)}</td>"]
        for col in columns.values():
            items = ", ".join(f"{token_html(t)}&nbsp;{p:.2f}" for t, p in col[i])
            cells.append(f"<td style='text-align:left'>{items}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return _html(
        f'{title_html(title)}<table class="{TABLE_CLASS}"><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def skip_trigram_table_html(rows: Sequence[Sequence], columns: Sequence[str], title: str | None = None):
    """An HTML table of skip-trigram rows: string cells are tokens (a ``head`` column is a head's
    name), numbers have two decimals."""
    return html_table(columns, rows, title, token_columns=[c for c in columns if c != "head"])
