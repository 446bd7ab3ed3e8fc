"""The chapters, one list: the notebooks/ entries of ``_toc.yml`` (read by
``make_learner.chapters``) drive these tests, the learner-notebook generator and the README's
chapter table. Every chapter opens with objectives, asks questions, has as many checks as
exercises; its own solutions pass its checks and the learner's stubs are "not attempted yet".

The solutions are read from the solved notebooks (the cells tagged ``solution``), so what the
book shows is what is tested; the stubs from their generated learner's versions.
"""

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
import torch

from attncircuits import loss_fn
from attncircuits.analysis import losses
from attncircuits.analysis import scores as S
from attncircuits.course.exercises.make_learner import chapters, learner_notebook
from attncircuits.models import handbuilt as hb

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = chapters(ROOT)
IDS = [p.stem[:2] for p in CHAPTERS]


def _nb(path: Path) -> dict:
    return json.loads(path.read_text())


def _code(nb) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def _cells(nb, tag=None, startswith=None):
    out = []
    for c in nb["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] != "code":
            continue
        if tag and tag in c["metadata"].get("tags", []):
            out.append(src)
        elif startswith and any(line.startswith(startswith) for line in src.splitlines()):
            out.append(src)
    return out


def _run_exercises(nb) -> list[tuple[str, object]]:
    """Define every solution (or stub) of a notebook in one namespace, then run every check cell;
    returns (printed text, the check's return value) per check."""
    ns = {"math": math, "torch": torch, "S": S, "losses": losses, "hb": hb, "loss_fn": loss_fn}
    for src in _cells(nb, tag="solution"):
        exec(compile(src, "<solution>", "exec"), ns)
    results = []
    for src in _cells(nb, startswith=("assert check_", "check_")):
        src = src.replace("assert check_", "check_")
        *setup, last = [line for line in src.splitlines() if line.strip()]
        exec("\n".join(setup), ns)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            value = eval(last.rstrip().removesuffix(";"), ns)  # the learner's check line ends in ';'
        results.append((buf.getvalue(), value))
    return results


def _optional_extra_chapter(nb) -> str | None:
    """A chapter on TransformerLens (an optional extra) runs its checks under nbval only."""
    if "transformer_lens" in _code(nb):
        return "the TransformerLens chapter's checks run in its notebook (nbval), with the optional extra"
    return None


def test_the_chapter_list_is_the_books_and_every_chapter_notebook_is_on_it():
    assert CHAPTERS and all(p.is_file() for p in CHAPTERS), CHAPTERS
    on_disk = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(CHAPTERS) == on_disk, "a chapter notebook is missing from _toc.yml, or _toc.yml names a missing one"
    # numbered in reading order; a number may wait for a chapter written at the same time (11, while
    # chapter 12 is on its branch), but never repeats or goes back
    assert IDS == sorted(set(IDS)) and IDS[0] == "01", IDS


def test_the_readme_table_lists_the_chapters_in_order():
    rows = re.findall(r"^\| *(\d+) *\| *`(\d\d_[a-z0-9_]+)` *\|", (ROOT / "README.md").read_text(), re.M)
    assert [name for _, name in rows] == [p.stem for p in CHAPTERS], rows
    assert [int(n) for n, _ in rows] == [int(i) for i in IDS], rows


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_the_chapters_open_with_objectives_and_ask_questions(path):
    nb = _nb(path)
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    assert cells[1].startswith("**Learning objectives.**") and 3 <= cells[1].count("\n- ") <= 5, cells[1]
    assert sum(s.startswith("**Check yourself.**") and "<summary>Answer</summary>" in s for s in cells) >= 2
    assert any(f"notebooks/exercises/{path.name})" in s for s in cells)
    exercises = sum(s.startswith("### Exercise") for s in cells)
    checks = len(_cells(nb, startswith=("assert check_", "check_")))
    solutions = len(_cells(nb, tag="solution"))
    assert exercises >= 2 and exercises == checks == solutions, (exercises, checks, solutions)


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_the_notebooks_solutions_pass_their_checks(path):
    nb = _nb(path)
    if reason := _optional_extra_chapter(nb):
        pytest.skip(reason)
    results = _run_exercises(nb)
    assert len(results) == len(_cells(nb, tag="solution")) >= 2, f"{path.name} has {len(results)} checks"
    for out, value in results:
        assert value is True and out.startswith("✓") and "correct on" in out, out
        assert len(out.splitlines()) == 1 and len(out.rstrip("\n")) <= 79, out


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_the_learners_stubs_are_not_attempted_yet(path):
    nb = _nb(path)
    if reason := _optional_extra_chapter(nb):
        pytest.skip(reason)
    results = _run_exercises(learner_notebook(nb, path.name))
    assert results
    for out, value in results:
        assert value is False and "not attempted yet" in out and out.count("\n") <= 2, out
