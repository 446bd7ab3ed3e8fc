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
  width of every PNG a cell shows (:func:`max_legible_width`);
* a quantity the book reports on several pages (:mod:`attncircuits.analysis.quantities`: the
  validation loss, the ICL score, the first- and second-copy loss, prefix matching) named in a
  printed line (or an HTML table's row) that names no windows: a line printed by a
  ``quantities.Measured`` names them, another line must name one of the windows reported so far;
* the same quantity of the same model on the same windows (and under the same condition) printed
  with two values, on this page or an earlier one of the run: the values may differ by no more
  than :data:`QUANTITY_TOLERANCE` times a unit of the last printed digit of the coarser of the two
  (their roundings then agree), so a page that measures on other windows must name them.

Under pytest-xdist (``make test`` runs the notebooks on every core, a notebook's cells in one
kernel of one worker) each worker checks the cells it runs; the quantities each worker saw are sent
to the controller (``workeroutput``), which compares them across workers and fails the run, naming
both pages, when two pages run by different workers print one quantity with two values. A line
must name windows its own page reported (each page runs in a kernel of its own, which constructs
every set of windows it measures on), so no verdict depends on which pages ran before.

Cells whose output the book removes (tags ``remove-output``, ``remove-cell``) are not checked.
The checks are plain functions of the outputs, so ``tests/test_notebook_pages.py`` tests them on
made-up outputs without running a notebook.
"""

from __future__ import annotations

import base64
import html as htmllib
import json
import os
import re
import tempfile
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


#: two printed values of one quantity agree when they differ by at most this many units of the
#: coarser one's last digit (0.5: both round to one value; same inputs give the same value anyway)
QUANTITY_TOLERANCE = 0.5
_TAG = re.compile(r"<[^>]+>")
#: a row of the reproduces page's table of claims across runs: "<chapter file> <claim> <values>"
_CLAIM_ROW = re.compile(r"^(\d\d_[a-z0-9_]+|reproduces) ")


def _printed_lines(outputs: Iterable[dict], keep_indent: bool = False) -> list[str]:
    """What a reader reads: printed lines, plain-text results, and HTML (a table row a line);
    each line's runs of spaces made one, and with ``keep_indent`` its leading spaces kept."""
    lines, merged = [], []
    for out in outputs:  # consecutive prints arrive as several stream outputs: one text
        if merged and out.get("output_type") == "stream" and merged[-1].get("output_type") == "stream":
            text = merged[-1]["text"]
            more = out.get("text", "")
            merged[-1] = {**merged[-1], "text": ("".join(text) if isinstance(text, list) else text)
                          + ("".join(more) if isinstance(more, list) else more)}
        else:
            merged.append(out)
    for out in merged:
        data = out.get("data", {})
        if out.get("output_type") == "stream":
            text = out.get("text", "")
        elif "text/html" in data:
            html = data["text/html"]
            html = "".join(html) if isinstance(html, list) else html
            html = re.sub(r"</(tr|p|div|li|h\d)>|<br\s*/?>", "\n", html, flags=re.I)
            text = htmllib.unescape(_TAG.sub(" ", html))
        elif out.get("output_type") in ("execute_result", "display_data") and not any(k in data for k in _RICH):
            text = data.get("text/plain", "")
        else:
            continue
        text = "".join(text) if isinstance(text, list) else text
        lines += [(line[: len(line) - len(line.lstrip())] if keep_indent else "") + " ".join(line.split())
                  for line in _visible_lines(text)] + [""]
    return lines


#: how a claim that does not hold is printed (course.claims): a line, then its indented continuation
_CLAIM_NOT_HELD = ("claim not held:", "claim about the corpus not held:", "not held:")


def unnamed_quantities(outputs: Iterable[dict], reported: Iterable[dict], window_names: Iterable[str]) -> list[str]:
    """Lines that name a quantity (``quantities.MENTIONS``) but none of ``window_names``, leaving out
    the lines that ``reported`` (``quantities.Measured`` records) printed. A line that names windows
    and ends with ":" heads the lines below it, up to an empty line (a table under its header)."""
    from attncircuits.analysis.quantities import mentions
    own = {" ".join(line.split()) for r in reported for line in r["text"].splitlines()}
    from attncircuits.analysis.quantities import HISTORY_WINDOWS

    names = [n for n in (*window_names, HISTORY_WINDOWS) if n]
    found, header, in_claim = [], False, False
    for raw in _printed_lines(outputs, keep_indent=True):
        line = raw.strip()
        # a claim that did not hold (on another set) quotes the chapter's claim, whose windows the
        # chapter states beside it: the line and its indented continuation are not a report
        in_claim = line.startswith(_CLAIM_NOT_HELD) or (in_claim and raw.startswith(" ") and bool(line))
        if in_claim:
            continue
        rest = line
        for o in own:
            rest = rest.replace(o, " ")
        if _CLAIM_ROW.match(line):
            continue  # a chapter's claim as the claims-across-runs table quotes it: its chapter's windows
        has_name = any(n in line for n in names)
        header = bool(line) and (header or (has_name and line.endswith(":")))
        named = mentions(rest)
        if named and not has_name and not header:
            found.append(f"{', '.join(named)} printed without its windows: {line[:70]!r} (print a "
                         "quantities.measure(...) or name the windows, quantities' docstring)")
    return found


_PAGES: dict = {}  # (quantity, model, windows, condition) -> the pages that printed it


def quantity_conflicts(seen: dict, records: Iterable[dict], page: str) -> list[str]:
    """Records that give a (quantity, model, windows, condition) another value than one printed
    before (in ``seen``, which this updates: key -> (value, digits, page))."""
    found = []
    for r in records:
        key = (r["quantity"], r["model"], r["windows"], r.get("condition", ""))
        digits = r["digits"]
        _PAGES.setdefault(key, set()).add(page)
        if key in seen:
            value, d, where = seen[key]
            tol = QUANTITY_TOLERANCE * 10.0 ** -min(d, digits) + 1e-9
            if abs(value - r["value"]) > tol:
                found.append(f"{key[0]} of {key[1]} on {key[2]}{' (' + key[3] + ')' if key[3] else ''}: "
                             f"{r['value']:.{digits}f} here, {value:.{d}f} in {where}")
        else:
            seen[key] = (r["value"], digits, page)
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


_SEEN: dict = {}  # (quantity, model, windows, condition) -> (value, digits, page), over the run
_WINDOW_NAMES: dict = {}  # page -> the names of the windows it reported
_ACROSS_WORKERS: list = []  # conflicts the controller found between pages that different workers ran


def _new_quantity_records() -> list[dict]:
    from attncircuits.analysis.quantities import LOG_ENV

    path = os.environ.get(LOG_ENV)
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    open(path, "w").close()  # each cell reads its own
    return rows


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
        tags = item.cell.metadata.get("tags", [])
        problems = cell_problems(outputs, messages, tags, max_width)
        records = _new_quantity_records()
        names = _WINDOW_NAMES.setdefault(item.parent.name, set())
        names.update(r.get("windows") or r["windows_name"] for r in records)
        records = [r for r in records if "quantity" in r]
        problems += quantity_conflicts(_SEEN, records, item.parent.name)
        if not _HIDDEN_TAGS & set(tags):
            problems += unnamed_quantities(outputs, records, names)
        if problems:
            pytest.fail(f"cell {item.cell_num} of {item.parent.name}, as the book shows it:\n  " + "\n  ".join(problems))

    return run_and_check


def _seen_rows() -> list[list]:
    """``_SEEN`` and ``_PAGES`` as plain lists, which execnet carries from a worker."""
    return [[*key, value, digits, page, sorted(_PAGES.get(key, ()))]
            for key, (value, digits, page) in _SEEN.items()]


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller compares the pages
        workeroutput["quantities"] = _seen_rows()
    elif _ACROSS_WORKERS and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """On the controller: a worker's quantities against those of the workers that ended before."""
    for quantity, model, windows, condition, value, digits, page, pages in node.workeroutput.get("quantities", []):
        record = {"quantity": quantity, "model": model, "windows": windows, "condition": condition,
                  "value": value, "digits": digits}
        _ACROSS_WORKERS.extend(quantity_conflicts(_SEEN, [record], page))
        _PAGES.setdefault((quantity, model, windows, condition), set()).update(pages)


def pytest_terminal_summary(terminalreporter):
    """Every quantity the pages printed, once, with the pages that printed it (the first value);
    under pytest-xdist, first the quantities two workers' pages printed with two values."""
    if _ACROSS_WORKERS:
        terminalreporter.section("quantities printed with two values (pages run by different workers)", red=True)
        for line in _ACROSS_WORKERS:
            terminalreporter.write_line(line)
    if not _SEEN:
        return
    terminalreporter.section("quantities the pages printed")
    for key, (value, digits, _) in sorted(_SEEN.items()):
        cond = f" ({key[3]})" if key[3] else ""
        pages = ", ".join(sorted(_PAGES.get(key, ())))
        terminalreporter.write_line(f"{key[0]} of {key[1]}{cond} on {key[2]}: {value:.{digits}f}  [{pages}]")


def pytest_configure(config):
    """The kernels nbval starts inherit this environment: every quantity a page prints is logged."""
    from attncircuits.analysis.quantities import LOG_ENV

    fd, path = tempfile.mkstemp(prefix="quantities-", suffix=".jsonl")
    os.close(fd)
    os.environ[LOG_ENV] = path


def pytest_collection_modifyitems(session, config, items):
    from nbval.plugin import IPyNbCell

    cells = [item for item in items if isinstance(item, IPyNbCell)]
    if cells:
        max_width = _book_max_width()
        for item in cells:
            item.runtest = _checked(item, max_width)
