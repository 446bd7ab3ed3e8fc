"""The study-time table of book/setup.md follows the chapters: its exercise counts and minutes are
the sums of each chapter's exercise headers ("about N minutes"), its reading time is the chapter's
length at the rate the page states, and its totals add up."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "book" / "setup.md"
ROW = re.compile(r"^\| (\d+) [^|]+\| (\d+) min \| (\d+), about (\d+) min \| (?:(\d+) h ?)?(\d+)?(?: min)? \|$")
WORDS_PER_MIN, CODE_LINES_PER_MIN = 120, 10  # the rates setup.md states


def _rows() -> dict[int, tuple[int, int, int, int]]:
    rows = {}
    for line in SETUP.read_text(encoding="utf-8").splitlines():
        if m := ROW.match(line):
            n, read, n_ex, ex, h, mins = m.groups()
            rows[int(n)] = (int(read), int(n_ex), int(ex), int(h or 0) * 60 + int(mins or 0))
    return rows


def _chapter(n: int) -> dict:
    (path,) = (ROOT / "notebooks").glob(f"{n:02d}_*.ipynb")
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_chapter_has_a_row():
    assert sorted(_rows()) == sorted(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("n", sorted(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
def test_a_row_follows_its_chapter(n):
    read, n_ex, ex, together = _rows()[n]
    cells = _chapter(n)["cells"]
    headers = ["".join(c["source"]) for c in cells
               if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("### Exercise")]
    minutes = [int(m.group(2) or m.group(1)) for h in headers
               if (m := re.search(r"about (\d+)(?:[-–](\d+))? minutes", h))]
    assert (n_ex, ex) == (len(headers), sum(minutes)), f"chapter {n}: {len(headers)} exercises, {sum(minutes)} min"
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    shown = {"solution", "remove-input", "remove-cell"}
    code = sum(len("".join(c["source"]).splitlines()) for c in cells
               if c["cell_type"] == "code" and not shown & set(c["metadata"].get("tags", [])))
    estimate = words / WORDS_PER_MIN + code / CODE_LINES_PER_MIN
    assert abs(read - estimate) <= 7.5, f"chapter {n}: reading about {estimate:.0f} min, the table says {read}"
    assert together == read + ex
