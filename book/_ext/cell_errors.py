"""Name the notebook and the cell when a chapter fails to execute during the book build.

myst-nb reports a failing notebook with nbclient's traceback, which shows the cell's code but not
where the cell is. After the sources are read, this extension adds one warning per failed notebook:
``notebooks/06_induction_heads.ipynb: cell 14 (code cell 9) raised AssertionError: ...``, so the
fix starts at the right place. With ``-W`` (``make book``) the build fails either way.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# nbclient's CellExecutionError text: "...executing the following cell:\n------------------\n<source>\n------------------"
_SOURCE = re.compile(r"executing the following cell:\n-{5,}\n(.*?)\n-{5,}\n", re.DOTALL)


def failing_cell(notebook: nbformat.NotebookNode, traceback: str) -> tuple[int, int, str] | None:
    """(cell index, code-cell index, last traceback line) of the cell a traceback came from, or None."""
    text = _ANSI.sub("", traceback or "")
    match = _SOURCE.search(text)
    if match is None:
        return None
    source = match.group(1).strip()
    lines = [line for line in text.strip().splitlines() if line.strip()]
    error = lines[-1].strip() if lines else ""
    n_code = -1
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        n_code += 1
        if cell.source.strip() == source:
            return i, n_code, error
    return None


def _report(app: Sphinx, env) -> None:
    for docname, data in sorted(getattr(env, "nb_metadata", {}).items()):
        exec_data = data.get("exec_data") or {}
        if exec_data.get("succeeded", True):
            continue
        path = Path(env.doc2path(docname))
        try:
            where = failing_cell(nbformat.read(path, as_version=4), exec_data.get("traceback") or "")
        except Exception:  # an unreadable notebook is reported by myst-nb itself
            where = None
        try:
            shown = path.relative_to(app.srcdir)
        except ValueError:
            shown = path
        if where is None:
            logger.warning(f"{shown}: execution failed ({exec_data.get('error')}); see the traceback above")
        else:
            index, code_index, error = where
            logger.warning(f"{shown}: cell {index} (code cell {code_index}, counting from 0) raised {error}")


def setup(app: Sphinx) -> dict:
    app.connect("env-updated", _report)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
