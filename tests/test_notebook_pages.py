"""The checks that ``make test`` applies to every notebook cell (tests/notebook_pages.py) catch
what they claim to, on made-up outputs, and the Makefile loads them into the nbval run."""

from __future__ import annotations

import base64
import re
import struct
import zlib
from pathlib import Path

import notebook_pages as pages

REPO = Path(__file__).resolve().parents[1]


def _png(width: int, height: int = 2) -> str:
    """A real (tiny content) PNG header of the given size, base64 as a notebook stores it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    raw = b"".join(b"\x00" + b"\x00" * width for _ in range(height))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def image(b64, **meta):
    return {"output_type": "display_data", "data": {"image/png": b64, "text/plain": "<Figure>"}, "metadata": meta}


def test_the_makefile_runs_the_checks_with_nbval():
    nbval_lines = [line for line in (REPO / "Makefile").read_text().splitlines() if "--nbval" in line]
    assert nbval_lines and all("-p tests.notebook_pages" in line for line in nbval_lines), nbval_lines


def test_the_line_limit_fits_the_column_and_matches_ruff():
    assert 79 <= pages.LINE_LIMIT <= pages.COLUMN_CHARS
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(rf"^max-line-length = {pages.LINE_LIMIT}$", pyproject, re.M), "ruff's notebook limit differs"


def test_long_printed_lines_are_found():
    ok = "x" * pages.LINE_LIMIT
    assert pages.long_lines([stream(ok + "\n" + ok)]) == []
    assert len(pages.long_lines([stream(["short\n", ok + "y\n"])])) == 1
    assert len(pages.long_lines([stream("0%\r" + ok + "yy", "stderr")])) == 1  # what the \r leaves
    assert pages.long_lines([stream("0%" + "z" * 90 + "\rdone")]) == []
    assert pages.display_width("漢字") == 4
    assert len(pages.long_lines([stream("漢" * 40)])) == 1
    result = {"output_type": "execute_result", "data": {"text/plain": "t" * 100}}
    assert len(pages.long_lines([result])) == 1
    shown_as_html = {"output_type": "execute_result", "data": {"text/plain": "t" * 100, "text/html": "<b>t</b>"}}
    assert pages.long_lines([shown_as_html]) == []


def test_a_figure_shown_twice_is_found():
    a, b = _png(300), _png(301)
    assert pages.repeated_figures([image(a), image(b)]) == []
    assert len(pages.repeated_figures([image(a), stream("x"), image(a)])) == 1


def test_figures_too_wide_for_their_text_are_found():
    # 8 pt at 100 dpi is 11.1 px; shown at >= 11 px it may be scaled down at most to 736/743 of its size
    limit = pages.max_legible_width(736, 11.0, 8.0, 100)
    assert 742 < limit < 744
    assert pages.png_width(_png(700)) == 700
    assert pages.too_wide_figures([image(_png(700))], limit) == []
    assert len(pages.too_wide_figures([image(_png(2010))], limit)) == 1
    assert pages.too_wide_figures([image(_png(2010), **{"image/png": {"width": 700}})], limit) == []


def _bar_messages(value, total, style=""):
    state = {"_model_name": "FloatProgressModel", "value": 0, "max": total, "bar_style": ""}
    return [
        {"msg_type": "comm_open", "content": {"comm_id": "b", "data": {"state": state}}},
        {"msg_type": "comm_msg", "content": {"comm_id": "b", "data": {"method": "update", "state": {"value": value}}}},
        {"msg_type": "comm_msg", "content": {"comm_id": "b", "data": {"method": "update", "state": {"bar_style": style}}}},
    ]


def test_failed_looking_progress_bars_are_found():
    assert pages.failed_progress_bars([], _bar_messages(301, 301, "success")) == []
    assert len(pages.failed_progress_bars([], _bar_messages(300, 301))) == 1  # stopped short
    assert len(pages.failed_progress_bars([], _bar_messages(301, 301, "danger"))) == 1  # red
    assert pages.failed_progress_bars([], _bar_messages(5, 1, "info")) == []  # no total known
    text_ok = stream("  0%|          | 0/301 [00:00<?, ?it/s]\r100%|##########| 301/301 [00:39<00:00]", "stderr")
    text_short = stream("  0%|          | 0/301 [00:00<?, ?it/s]\r100%|#########9| 300/301 [00:39<00:00]", "stderr")
    assert pages.failed_progress_bars([text_ok], []) == []
    assert len(pages.failed_progress_bars([text_short], [])) == 1


def test_removed_outputs_are_not_checked():
    bad = [stream("x" * 200)]
    assert pages.cell_problems(bad, [], ["remove-output"], 743) == []
    assert len(pages.cell_problems(bad, [], ["hide-input"], 743)) == 1


def test_pages_run_by_different_workers_are_compared_on_the_controller(monkeypatch):
    """Under pytest-xdist each worker sends the quantities its pages printed; the controller finds
    a quantity two workers' pages printed with two values and fails the run, naming both pages."""
    from types import SimpleNamespace

    for name in ("_SEEN", "_PAGES"):
        monkeypatch.setattr(pages, name, {})
    monkeypatch.setattr(pages, "_ACROSS_WORKERS", [])
    key = ("ICL score", "attn-only-2l", "chapter 7's 1024 validation windows", "")
    worker = SimpleNamespace(workeroutput={})
    pages._SEEN[key] = (-0.51, 2, "07_why_two_layers.ipynb")  # what one worker's page printed
    pages.pytest_sessionfinish(SimpleNamespace(config=worker))
    rows = worker.workeroutput["quantities"]
    pages._SEEN.clear()
    pages._PAGES.clear()
    pages.pytest_testnodedown(SimpleNamespace(workeroutput={"quantities": rows}), None)
    assert not pages._ACROSS_WORKERS  # one worker: nothing to compare
    other = [[*key, -0.514, 3, "reproduces.ipynb", ["reproduces.ipynb"]]]  # rounds to -0.51: agrees
    pages.pytest_testnodedown(SimpleNamespace(workeroutput={"quantities": other}), None)
    assert not pages._ACROSS_WORKERS
    third = [[*key, -0.48, 2, "exercises/07_why_two_layers.ipynb", []]]
    pages.pytest_testnodedown(SimpleNamespace(workeroutput={"quantities": third}), None)
    assert pages._ACROSS_WORKERS == [
        "ICL score of attn-only-2l on chapter 7's 1024 validation windows: -0.48 here, -0.51 in 07_why_two_layers.ipynb"]
    assert pages._PAGES[key] == {"07_why_two_layers.ipynb", "reproduces.ipynb", "exercises/07_why_two_layers.ipynb"}
    controller = SimpleNamespace(config=SimpleNamespace(), exitstatus=0)
    pages.pytest_sessionfinish(controller)
    assert controller.exitstatus == 1


def test_a_line_names_windows_its_own_page_reported():
    """Which pages a worker ran before is chance under pytest-xdist: a printed quantity must name
    windows reported on its own page (or the training history's), never another page's."""
    line = [stream("ICL score: -0.51\n")]
    assert pages.unnamed_quantities(line, [], set())
    assert not pages.unnamed_quantities([stream("ICL score on my windows: -0.51\n")], [], {"my windows"})


def test_the_makefile_runs_tests_and_notebooks_on_every_core():
    text = (REPO / "Makefile").read_text()
    assert "TEST_WORKERS ?= auto" in text and "--dist loadfile" in text
    runs = [line for line in text.splitlines() if "-m pytest" in line and line.strip().startswith("stage ")]
    assert len(runs) == 1 and "$(XDIST)" in runs[0] and "--nbval-lax" in runs[0], runs
    # one session, every notebook and every test module in it, the long files first
    order = re.search(r"^TEST_ORDER = (.*?)(?<!\\)$", text, re.M | re.S).group(1).replace("\\\n", " ").split()
    assert "$(TEST_ORDER)" in runs[0] and order[-2:] == ["notebooks", "tests"], order
    assert all((REPO / p).exists() for p in order) and "book/reproduces.ipynb" in order, order
    assert "pytest-xdist==" in (REPO / "requirements.txt").read_text()
