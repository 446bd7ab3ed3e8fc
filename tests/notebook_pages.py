"""What a notebook cell shows the reader of the book, checked on the outputs of the nbval run.

``make test`` runs the chapters with nbval and loads this module as a pytest plugin
(``-p tests.notebook_pages``): after each cell runs, its outputs and the kernel messages it sent
(widget state included) are checked, and the cell fails when the built book would show

* a printed line wider than the column: at a 1300 px window a code cell or an output block shows
  :data:`COLUMN_CHARS` characters of the 14 px monospace font (measured in headless Chromium on the
  built book; ``book/_static/custom.css`` sets the column), and lines are held to
  :data:`LINE_LIMIT` = 79, the same limit ruff's E501 applies to the notebooks' code;
* the same figure twice in one cell (a figure shown by pyplot and again as the cell's value);
* a progress bar that looks failed: a tqdm widget left red (``bar_style`` "danger") or stopped
  short of its total, or a text bar whose last state is ``n/total`` with ``n != total``;
* a figure too wide to stay legible: the book shows a figure at its own size, scaled down to the
  column when it is wider, so the package's smallest figure text (``SMALL_PT`` at ``DPI``, from
  :mod:`attncircuits.show.plotting`) must stay at least ``MIN_TEXT_PX`` on screen, which bounds the
  width of every PNG a cell shows (:func:`max_legible_width`).

Cells whose output the book removes (tags ``remove-output``, ``remove-cell``) are not checked.
The checks are plain functions of the outputs, so ``tests/test_notebook_pages.py`` tests them on
made-up outputs without running a notebook.
"""

from __future__ import annotations

import base64
import re
import unicodedata
from typing import Iterable

import pytest

#: Characters of code font a code cell or an output block shows at a 1300 px window (752 px of
#: 8.43 px glyphs, measured in the built book).
COLUMN_CHARS = 85
#: The longest line a cell may print (and ruff lets a notebook's code have).
LINE_LIMIT = 79

_HIDDEN_TAGS = {"remove-output", "remove-cell"}
_RICH = ("image/png", "image/jpeg", "image/svg+xml", "text/html", "application/vnd.jupyter.widget-view+json")
_TEXT_BAR = re.compile(r"(\d+)/(\d+) \[")
_PROGRESS_MODELS = {"FloatProgressModel", "IntProgressModel"}


def display_width(line: str) -> int:
    """Columns ``line`` takes in a monospace font (East Asian wide characters take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


def _visible_lines(text: str) -> list[str]:
    """The lines of a stream as a notebook shows them: what follows the last carriage return."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def long_lines(outputs: Iterable[dict], limit: int = LINE_LIMIT) -> list[str]:
    """Printed lines (streams, and plain-text results that nothing richer replaces) over ``limit``."""
    found = []
    for out in outputs:
        if out.get("output_type") == "stream":
            text = out.get("text", "")
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            if any(k in data for k in _RICH):
                continue
            text = data.get("text/plain", "")
        else:
            continue
        if isinstance(text, list):
            text = "".join(text)
        found += [line for line in _visible_lines(text) if display_width(line) > limit]
    return [f"a printed line of {display_width(line)} > {limit} characters: {line[:60]!r}..." for line in found]


def repeated_figures(outputs: Iterable[dict]) -> list[str]:
    """Images a cell shows more than once."""
    seen: dict[str, int] = {}
    for out in outputs:
        png = out.get("data", {}).get("image/png")
        if png:
            key = "".join(png) if isinstance(png, list) else png
            seen[key] = seen.get(key, 0) + 1
    return [f"the same figure is shown {n} times in this cell" for n in seen.values() if n > 1]


def png_width(b64: str) -> int:
    """The pixel width in a base64 PNG's header."""
    head = base64.b64decode(b64[:64])
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(head[16:20], "big")


def max_legible_width(column_px: float, min_text_px: float, small_pt: float, dpi: float) -> float:
    """The widest PNG whose smallest text (``small_pt`` at ``dpi``) is still ``min_text_px`` on
    screen once the book scales it down to a ``column_px`` column."""
    return column_px * (small_pt * dpi / 72) / min_text_px


def too_wide_figures(outputs: Iterable[dict], max_width: float) -> list[str]:
    found = []
    for out in outputs:
        data = out.get("data", {})
        png = data.get("image/png")
        if not png:
            continue
        shown = (out.get("metadata", {}).get("image/png") or {}).get("width")
        width = float(shown) if shown else png_width("".join(png) if isinstance(png, list) else png)
        if width > max_width:
            found.append(
                f"a {width:.0f} px wide figure is scaled down to the column, its text below legibility "
                f"(at most {max_width:.0f} px)"
            )
    return found


def failed_progress_bars(outputs: Iterable[dict], messages: Iterable[dict]) -> list[str]:
    """Progress bars that end red or short of their total (tqdm widgets and text bars)."""
    found = []
    bars: dict[str, dict] = {}
    for msg in messages:
        kind, content = msg.get("msg_type") or msg.get("header", {}).get("msg_type"), msg.get("content", {})
        comm, data = content.get("comm_id"), content.get("data") or {}
        if kind == "comm_open" and data.get("state", {}).get("_model_name") in _PROGRESS_MODELS:
            bars[comm] = dict(data["state"])
        elif kind == "comm_msg" and comm in bars and data.get("method") in ("update", "echo_update"):
            bars[comm].update(data.get("state", {}))
        elif kind == "comm_close":
            bars.pop(comm, None)
    for state in bars.values():
        value, total, style = state.get("value"), state.get("max"), state.get("bar_style")
        short = style != "info" and value is not None and total and value != total  # "info": no total
        if style == "danger" or short:
            found.append(f"a progress bar ends at {value}/{total}, style {state.get('bar_style')!r}")
    for out in outputs:
        if out.get("output_type") == "stream":
            text = out.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            states = _TEXT_BAR.findall(text)
            if states and states[-1][0] != states[-1][1]:
                found.append(f"a text progress bar ends at {states[-1][0]}/{states[-1][1]}")
    return found


def cell_problems(outputs: list[dict], messages: list[dict], tags: Iterable[str], max_width: float) -> list[str]:
    if _HIDDEN_TAGS & set(tags):
        return []
    return (
        long_lines(outputs)
        + repeated_figures(outputs)
        + too_wide_figures(outputs, max_width)
        + failed_progress_bars(outputs, messages)
    )


def _book_max_width() -> float:
    from attncircuits.show.plotting import base

    return max_legible_width(base.COLUMN_PX, base.MIN_TEXT_PX, base.SMALL_PT, base.DPI)


def _checked(item, max_width: float):
    runtest = item.runtest

    def run_and_check():
        parent = item.parent
        messages: list[dict] = []
        receive = parent.get_kernel_message

        def recording(*args, **kwargs):
            msg = receive(*args, **kwargs)
            messages.append(msg)
            return msg

        parent.get_kernel_message = recording
        try:
            runtest()
        finally:
            del parent.get_kernel_message  # back to the class's method
        outputs = [dict(o) for o in (item.test_outputs or [])]
        problems = cell_problems(outputs, messages, item.cell.metadata.get("tags", []), max_width)
        if problems:
            pytest.fail(f"cell {item.cell_num} of {item.parent.name}, as the book shows it:\n  " + "\n  ".join(problems))

    return run_and_check


def pytest_collection_modifyitems(session, config, items):
    from nbval.plugin import IPyNbCell

    cells = [item for item in items if isinstance(item, IPyNbCell)]
    if cells:
        max_width = _book_max_width()
        for item in cells:
            item.runtest = _checked(item, max_width)
