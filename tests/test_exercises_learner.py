"""The learner's notebooks: generated from the solved chapters, committed, and never stale."""

import json
import re
from pathlib import Path

import pytest

from attncircuits.course.exercises import make_learner
from attncircuits.course.exercises.make_learner import LIVE_RUN, STUB, generate, learner_notebook, stale, strip_solution
from attncircuits.course.exercises.run_once import RUN_ONCE, check_skippable

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_learner_notebooks_are_fresh():
    problems = stale(ROOT)
    assert not problems, "; ".join(problems) + ". Run: python -m attncircuits.course.exercises.make_learner"


def test_every_chapter_with_exercises_has_a_learner_notebook_without_solutions():
    generated = generate(ROOT)
    assert len(generated) >= 4
    for path, text in generated.items():
        nb = json.loads(text)
        assert (ROOT / "notebooks" / path.name).is_file()
        sources = ["".join(c["source"]) for c in nb["cells"]]
        assert not any("BEGIN SOLUTION" in s or "END SOLUTION" in s for s in sources), path
        assert not any(line.startswith("assert check_") for s in sources for line in s.splitlines()), path
        stubs = [c for c in nb["cells"] if "solution" in c["metadata"].get("tags", [])]
        assert stubs and all("hide-input" not in c["metadata"]["tags"] for c in stubs)
        assert all(STUB in "".join(c["source"]) for c in stubs)
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")


def test_stubs_keep_the_signature_docstring_and_indent():
    src = 'def f(x):\n    """Doc."""\n    # BEGIN SOLUTION\n    y = x + 1\n    return y\n    # END SOLUTION\n'
    assert strip_solution(src, "here") == f'def f(x):\n    """Doc."""\n    {STUB}\n'
    nested = "class A:\n    def f(self):\n        # BEGIN SOLUTION\n        return 1\n        # END SOLUTION\n"
    assert strip_solution(nested, "here") == f"class A:\n    def f(self):\n        {STUB}\n"


@pytest.mark.parametrize(
    "src, message",
    [
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n", "without '# END SOLUTION'"),
        ("def f():\n    return 1\n    # END SOLUTION\n", "without '# BEGIN SOLUTION'"),
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n# END SOLUTION\n", "indented differently"),
    ],
)
def test_broken_markers_name_the_notebook_and_cell(src, message):
    with pytest.raises(ValueError, match=message):
        strip_solution(src, "notebooks/09_x.ipynb, cell abc")


def test_a_solution_cell_without_markers_is_refused():
    nb = {"cells": [{"cell_type": "code", "id": "s1", "metadata": {"tags": ["solution"]}, "source": ["x = 1\n"], "outputs": []}]}
    with pytest.raises(ValueError, match="cell s1 is tagged 'solution' but has no"):
        learner_notebook(nb, "notebooks/09_x.ipynb")


def test_check_mode_reports_a_stale_notebook(tmp_path, capsys):
    (tmp_path / "notebooks").mkdir()
    solved = {
        "cells": [
            {"cell_type": "markdown", "id": "m", "metadata": {}, "source": ["[Open the exercises in Colab](https://colab.research.google.com/github/o/r/blob/main/x)\n"]},
            {"cell_type": "code", "id": "s", "execution_count": 3, "metadata": {"tags": ["solution", "hide-input"]},
             "outputs": [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}],
             "source": ["def f():\n", "    # BEGIN SOLUTION\n", "    return 1\n", "    # END SOLUTION\n"]},
            {"cell_type": "code", "id": "c", "execution_count": 4, "metadata": {}, "outputs": [], "source": ["assert check_f(f)"]},
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }
    (tmp_path / "notebooks" / "09_x.ipynb").write_text(json.dumps(solved))
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: notebooks/09_x\n")
    assert make_learner.main(["--root", str(tmp_path), "--check"]) == 1
    assert "notebooks/exercises/09_x.ipynb is missing" in capsys.readouterr().out
    assert make_learner.main(["--root", str(tmp_path)]) == 0
    assert make_learner.main(["--root", str(tmp_path), "--check"]) == 0
    learner = json.loads((tmp_path / "notebooks" / "exercises" / "09_x.ipynb").read_text())
    banner, stub, check = learner["cells"]
    assert "exercises version" in "".join(banner["source"])
    assert stub["metadata"]["tags"] == ["solution"] and stub["outputs"] == [] and stub["execution_count"] is None
    assert "".join(check["source"]) == "check_f(f);"  # one line of output: no `True` under it
    (tmp_path / "notebooks" / "09_x.ipynb").write_text(json.dumps(solved).replace("return 1", "return 2"))
    assert make_learner.main(["--root", str(tmp_path), "--check"]) == 0  # only the hidden solution changed
    solved["cells"][0]["source"] = ["A new first cell.\n"]
    (tmp_path / "notebooks" / "09_x.ipynb").write_text(json.dumps(solved))
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: notebooks/09_x\n")
    assert make_learner.main(["--root", str(tmp_path), "--check"]) == 1
    assert "09_x.ipynb is stale" in capsys.readouterr().out


def test_the_live_run_is_tested_once_in_the_solved_chapter():
    """Chapter 7's live training runs under nbval in the solved notebook only; the learner's copy
    carries nbval-skip on exactly those cells, and nowhere else."""
    name = "07_why_two_layers.ipynb"
    solved = json.loads((ROOT / "notebooks" / name).read_text())
    live = {c["id"] for c in solved["cells"] if LIVE_RUN in c["metadata"].get("tags", [])}
    assert len(live) >= 5 and not any("nbval-skip" in c["metadata"].get("tags", []) for c in solved["cells"])
    once = {c["id"] for c in solved["cells"] if RUN_ONCE in c["metadata"].get("tags", [])}
    learner = learner_notebook(solved, name)
    skipped = {c["id"] for c in learner["cells"] if "nbval-skip" in c["metadata"].get("tags", [])}
    assert skipped == live | once and not live & once


def test_every_chapter_skips_in_the_learners_copy_exactly_its_run_once_cells():
    """In every chapter the learner's copy skips under test exactly the cells tagged live-run or
    run-once (each proven safe by make_learner), and chapters 1, 5, 7, 10 and 11's slow cells among them."""
    seen = set()
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        solved = json.loads(path.read_text())
        tagged = {c["id"] for c in solved["cells"] if {LIVE_RUN, RUN_ONCE} & set(c["metadata"].get("tags", []))}
        learner = learner_notebook(solved, path.name)
        skipped = {c["id"] for c in learner["cells"] if "nbval-skip" in c["metadata"].get("tags", [])}
        assert skipped == tagged, path.name
        seen |= {path.name[:2] for c in solved["cells"] if RUN_ONCE in c["metadata"].get("tags", [])}
    assert {"01", "05", "07", "10", "11"} <= seen, seen


def _cells(*cells):
    """``(where, source, is_solution, skipped)`` rows from ``(source, kind)``: kind '' runs, 's' is a
    solution, 'x' is skipped, 'sx' both."""
    return [(f"cell {i}", src, "s" in kind, "x" in kind) for i, (src, kind) in enumerate(cells)]


@pytest.mark.parametrize("cells, message", [
    # the tagged cell reads the learner's function, directly or through an earlier cell's result
    ([("def f(x):\n    raise NotImplementedError", "s"), ("y = f(2)", "x")], "cell 1 is tagged to run once but reads 'f'"),
    ([("def f(x):\n    raise NotImplementedError", "s"), ("y = f(2)", ""), ("z = y + 1", "x")],
     "cell 2 is tagged to run once but reads 'y'"),
    ([("def f(x):\n    return x", "sx")], "cell 0 is tagged to run once but is an exercise"),
    # a cell that still runs reads what the skipped cell bound
    ([("table = slow()", "x"), ("print(table)", "")], "cell 1, which runs in the learner's copy, reads 'table'"),
    ([("import numpy as np", "x"), ("np.zeros(3)", "")], "reads 'np'"),
    ([("def g():\n    pass", "x"), ("g()", "")], "reads 'g'"),
    ([("for k in range(3):\n    pass", "x"), ("print(k)", "")], "reads 'k'"),
    ([("x = 1", ""), ("x = slow()", "x"), ("assert x", "")], "reads 'x'"),
    ([("def (", "x")], "cell 0 is not Python"),
])
def test_a_run_once_tag_that_is_not_safe_is_refused_naming_cell_and_name(cells, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_skippable(_cells(*cells))


@pytest.mark.parametrize("cells", [
    [("table = slow()", "x"), ("print(table)", "x")],  # its reader skipped too
    [("x = slow()", "x"), ("x = 2", ""), ("print(x)", "")],  # bound again by a cell that runs
    [("p = slow()", "x"), ("for p in range(3):\n    print(p)", "")],  # the reader's own loop variable
    [("%time t = slow()", "x"), ("!ls", ""), ("print(1)", "")],  # magics are not Python
    [("def f():\n    raise NotImplementedError", "s"), ("check_f(f)", ""), ("y = slow()", "x")],
])
def test_a_safe_run_once_tag_is_accepted(cells):
    check_skippable(_cells(*cells))


_HINT = "<details><summary>Hint"


def _exercise_blocks(nb: dict) -> list[list[dict]]:
    """The cells of each exercise: from its "### Exercise" heading to the next heading."""
    blocks: list[list[dict]] = []
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.startswith("#"):
            blocks.append([cell] if text.startswith("### Exercise") else [])
        elif blocks and blocks[-1]:
            blocks[-1].append(cell)
    return [b for b in blocks if b]


@pytest.mark.parametrize("path", make_learner.chapters(ROOT), ids=lambda p: p.stem[:2])
def test_each_exercise_reads_task_hints_solution_check(path):
    """Hints sit between the task and the solution, labelled "Hint" alone or "Hint 1", "Hint 2", ...;
    the check cell asserts, so the solved chapter fails when a solution stops passing (the learner's
    copy drops the ``assert``)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for block in _exercise_blocks(nb):
        title = "".join(block[0]["source"]).splitlines()[0]
        kinds = []
        for cell in block[1:]:
            text = "".join(cell["source"])
            tags = cell["metadata"].get("tags", [])
            if "solution" in tags:
                kinds.append("solution")
            elif cell["cell_type"] == "markdown" and text.startswith(_HINT):
                kinds.append(text.split("</summary>")[0].removeprefix("<details><summary>"))
            elif cell["cell_type"] == "code" and "check_" in text:
                kinds.append("check")
                calls = [ln for ln in text.splitlines() if ln.lstrip().startswith(("check_", "assert check_"))]
                assert calls and all(ln.startswith("assert check_") for ln in calls), (title, calls)
        assert "solution" in kinds and "check" in kinds, (title, kinds)
        hints = [k for k in kinds if k.startswith("Hint")]
        assert kinds[: len(hints)] == hints, f"{title}: hints after the solution ({kinds})"
        assert hints == (["Hint"] if len(hints) == 1 else [f"Hint {i}" for i in range(1, len(hints) + 1)]), (title, hints)


def test_relative_links_of_the_learner_notebooks_resolve():
    """A learner's copy sits one folder below its chapter, so its links to the book's pages
    (``../book/...`` in the chapter) gain one ``../`` and still name a file."""
    import re

    for path in sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                for target in re.findall(r"\]\((\.\.?/[^)#\s]+)", "".join(cell["source"])):
                    assert (path.parent / target).resolve().is_file(), f"{path.name}: {target}"
