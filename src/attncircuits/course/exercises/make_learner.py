"""Generate the learner's notebooks from the solved chapters: ``python -m attncircuits.course.exercises.make_learner``.

Every chapter of ``_toc.yml`` (``notebooks/NN_*.ipynb``) with exercises (what the book shows, solutions collapsed) becomes
``notebooks/exercises/NN_*.ipynb`` (what a learner opens in Colab or Jupyter):

- in each code cell tagged ``solution``, the lines from ``# BEGIN SOLUTION`` to ``# END SOLUTION``
  (inclusive) become one ``raise NotImplementedError(...)`` at the markers' indent, and the
  ``hide-input`` tag is dropped, so the stub shows; the function's signature and docstring stay;
- a check written ``assert check_...(...)`` (so that the solved chapter fails its run when a
  solution stops passing) becomes ``check_...(...);``: on a stub the check prints "not attempted
  yet" and returns False, and the notebook runs on; the semicolon keeps Jupyter from printing
  the returned ``True``/``False`` under the check's one line;
- the "Open the exercises in Colab" cell says instead that this is the exercises version and
  links the solved chapter;
- the first cell, the set-up cell every chapter repeats (``tests/test_colab_cell.py``), installs
  the package on Colab as before, and in any other Jupyter stops with the one command that
  installs it (``%pip install "git+<repository>@<branch>"``) instead of the solved chapter's
  ``pip install -e .`` from a clone, since a downloaded learner's notebook may have no clone
  around it;
- relative links (``](../book/...)``) gain one ``../``, as the copy sits one folder deeper;
- cells tagged ``answer`` (an open exercise's worked answer beyond its solution function) are
  left out;
- outputs and execution counts are stripped; hints, questions and every other cell are kept.

``--check`` regenerates in memory and exits 1 naming every learner notebook that is stale,
missing or left over; ``tests/test_exercises_learner.py`` runs the same comparison.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

from attncircuits.course.exercises.run_once import RUN_ONCE, check_skippable

STUB = 'raise NotImplementedError("your solution here")'
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
LEARNER_DIR = "exercises"
_CHECK_ASSERT = re.compile(r"^assert (check_\w+\(.*\))\s*$")
_COLAB_LINK = re.compile(r"^\[Open the exercises in Colab\]\((https://colab\.research\.google\.com/github/[^)]*)\)")


_TOC_CHAPTER = re.compile(r"^\s*-?\s*file:\s*(notebooks/[^\s#]+?)(?:\.ipynb)?\s*(?:#.*)?$")


def chapters(root: Path) -> list[Path]:
    """The solved chapters, ``notebooks/NN_*.ipynb``, in the order of ``root/_toc.yml``: the one list
    of chapters that the book, this generator, the tests and the README's table follow."""
    toc = Path(root) / "_toc.yml"
    if not toc.is_file():
        raise FileNotFoundError(f"{toc} is missing: the chapters are the notebooks/ entries of the book's _toc.yml")
    names = [m.group(1) for line in toc.read_text(encoding="utf-8").splitlines() if (m := _TOC_CHAPTER.match(line))]
    return [Path(root) / f"{name}.ipynb" for name in names]


def _source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _lines(text: str) -> list[str]:
    if not text:
        return []
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def strip_solution(source: str, where: str) -> str:
    """Replace every BEGIN/END SOLUTION block with a stub at the markers' indent."""
    out, inside, indent = [], False, ""
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"{where}: '{BEGIN}' again before '{END}'")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
            out.append(indent + STUB)
        elif stripped == END:
            if not inside:
                raise ValueError(f"{where}: '{END}' without '{BEGIN}'")
            if line[: len(line) - len(line.lstrip())] != indent:
                raise ValueError(f"{where}: '{END}' is indented differently from '{BEGIN}'")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: '{BEGIN}' without '{END}'")
    return "\n".join(out)


#: a tag for the cells of a live training run (chapters 7, 11, 13, 14): ``make test`` runs them once,
#: in the solved notebook, so the learner's copy gets nbval's ``nbval-skip`` on them (the run costs
#: the same and proves nothing new a second time); in Jupyter and Colab they run as usual. Other
#: slow cells that run the same in both copies are tagged ``run-once`` to the same effect; either
#: tag is refused where it is not safe (:mod:`attncircuits.course.exercises.run_once`).
LIVE_RUN = "live-run"
#: a tag for the cells that answer an open exercise beyond its solution function (chapter 12's
#: reading of a mystery's weights): the book collapses them (``hide-cell``), the learner's copy
#: leaves them out, since they would give the answer away before the learner looked
ANSWER = "answer"


def learner_notebook(nb: dict, name: str, solved_url: str | None = None) -> dict:
    """The learner's version of one solved notebook (a new dict; ``nb`` is left alone)."""
    nb = copy.deepcopy(nb)
    nb["cells"] = [c for c in nb["cells"] if ANSWER not in c.get("metadata", {}).get("tags", [])]
    n_solutions = 0
    code_cells = []
    for i, cell in enumerate(nb["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        where = f"{name}, cell {cell.get('id')}"
        if cell["cell_type"] == "code":
            text = _source(cell)
            if "solution" in tags:
                if BEGIN not in text:
                    raise ValueError(f"{where} is tagged 'solution' but has no '{BEGIN}' / '{END}' markers")
                text = strip_solution(text, where)
                cell["metadata"]["tags"] = [t for t in tags if t != "hide-input"]
                n_solutions += 1
            elif BEGIN in text:
                raise ValueError(f"{where} has solution markers but no 'solution' tag")
            once = LIVE_RUN in tags or RUN_ONCE in tags
            if once:  # the same cells run, asserted, in the solved notebook's test
                cell["metadata"]["tags"] = [*cell["metadata"].get("tags", []), "nbval-skip"]
            code_cells.append((where, text, "solution" in tags, once))
            if i == 0 and text.startswith(_SETUP_HEADER):
                text = learner_setup(text, where)
            text = "\n".join(_CHECK_ASSERT.sub(r"\1;", line) for line in text.split("\n"))
            cell["source"] = _lines(text)
            cell["outputs"] = []
            cell["execution_count"] = None
        elif cell["cell_type"] == "markdown":
            if _COLAB_LINK.match(_source(cell)):
                cell["source"] = _lines(_learner_banner(solved_url))
            elif "](../" in _source(cell):  # one folder deeper: links to the book's pages still resolve
                cell["source"] = _lines(_source(cell).replace("](../", "](../../"))
    check_skippable(code_cells)
    return nb


#: the set-up cell's off-Colab branch in the solved chapters, and what the learner's copy says instead
_SETUP_HEADER = (
    "# Colab set-up (hidden in the book): install the course package from its\n"
    "# repository when it is not importable; anywhere else, say how to install it.\n"
)
_SETUP_HEADER_LEARNER = (
    "# Set-up: on Colab this installs the course package from its repository;\n"
    "# in any other Jupyter it stops and prints the command(s) that install it.\n"
)
_SETUP_OFF_COLAB = (
    "        raise ModuleNotFoundError(\n"
    '            "The course package `attncircuits` is not installed for this "\n'
    '            "kernel\'s Python. From the repository root run `make venv` and "\n'
    '            "choose the kernel of .venv (or, torch installed, `pip install "\n'
    '            "-e .` for this kernel), then restart the kernel."\n'
)
# torch first where the kernel has none: pip would otherwise take its CUDA build (gigabytes)
_SETUP_OFF_COLAB_LEARNER = (
    "        try:\n"
    "            import torch  # noqa: F401\n"
    '            first = ""\n'
    "        except ModuleNotFoundError:  # else pip brings torch's CUDA build (GBs)\n"
    '            first = ("%pip install torch --index-url "\n'
    '                     "https://download.pytorch.org/whl/cpu (with an NVIDIA "\n'
    '                     "GPU: %pip install torch), then ")\n'
    "        raise ModuleNotFoundError(\n"
    '            "The course package `attncircuits` is not installed for this "\n'
    '            "kernel\'s Python. Run in a cell, then restart the kernel: "\n'
    '            f\'{first}%pip install "git+{REPOSITORY}@{BRANCH}" (needs git)\'\n'
)


def learner_setup(source: str, where: str) -> str:
    """The set-up cell of a learner's notebook: the solved chapters' cell with its off-Colab branch
    saying the one ``%pip install`` command (a downloaded notebook may have no clone around it)."""
    for old in (_SETUP_HEADER, _SETUP_OFF_COLAB):
        if old not in source:
            raise ValueError(f"{where}: the set-up cell no longer contains {old.strip()!r}; "
                             "update make_learner's learner_setup with it")
    return source.replace(_SETUP_HEADER, _SETUP_HEADER_LEARNER).replace(_SETUP_OFF_COLAB, _SETUP_OFF_COLAB_LEARNER)


def _learner_banner(solved_url: str | None) -> str:
    solved = f"[the solved chapter in Colab]({solved_url})" if solved_url else "the solved chapter in the book"
    return (
        "**This is the exercises version of the chapter.** Each exercise has a function whose body is\n"
        "`raise NotImplementedError(...)`: replace that line with your code and run the check cell\n"
        "under it, which says in a line or two whether your function is right and, if not, what is\n"
        "wrong.\n"
        "Every other cell runs as in the book (it uses the package's own functions, so a skipped\n"
        f"exercise breaks nothing). Stuck? The hints sit between each task and its stub; {solved} has the\n"
        "solutions."
    )


def _solved_url(root: Path, rel: str) -> str | None:
    """The Colab address of a solved notebook, from ``_config.yml``'s repository (None if unknown)."""
    config = root / "_config.yml"
    if not config.is_file():
        return None
    text = config.read_text()
    url = re.search(r"^\s*url:\s*(https://github\.com/\S+)", text, re.M)
    branch = re.search(r"^\s*branch:\s*(\S+)", text, re.M)
    if not url:
        return None
    repo = url.group(1).removeprefix("https://github.com/").rstrip("/")
    return f"https://colab.research.google.com/github/{repo}/blob/{branch.group(1) if branch else 'main'}/{rel}"


def dumps(nb: dict) -> str:
    """A notebook as the project commits it: indent 1, UTF-8 characters kept, final newline."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def generate(root: Path) -> dict[Path, str]:
    """``{learner path: text}`` for every solved chapter under ``root/notebooks``."""
    notebooks = root / "notebooks"
    out = {}
    for path in chapters(root):
        nb = json.loads(path.read_text(encoding="utf-8"))
        if not any("solution" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]):
            continue  # a chapter without exercises has no learner's version
        rel = path.relative_to(root).as_posix()
        out[notebooks / LEARNER_DIR / path.name] = dumps(learner_notebook(nb, rel, _solved_url(root, rel)))
    return out


def stale(root: Path) -> list[str]:
    """Learner notebooks that differ from a fresh generation, are missing, or have no chapter."""
    expected = generate(root)
    problems = [
        f"{p.relative_to(root)} is {'missing' if not p.exists() else 'stale'}"
        for p, text in expected.items()
        if not p.exists() or p.read_text(encoding="utf-8") != text
    ]
    learner_dir = root / "notebooks" / LEARNER_DIR
    for p in sorted(learner_dir.glob("*.ipynb")) if learner_dir.is_dir() else []:
        if p not in expected:
            problems.append(f"{p.relative_to(root)} has no solved chapter in notebooks/")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: here)")
    parser.add_argument("--check", action="store_true", help="only report stale learner notebooks; exit 1 if any")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "notebooks").is_dir():
        print(f"no notebooks/ folder under {root}; run this from the repository root or pass --root", file=sys.stderr)
        return 2
    if args.check:
        problems = stale(root)
        for p in problems:
            print(p)
        if problems:
            print("regenerate them: python -m attncircuits.course.exercises.make_learner", file=sys.stderr)
        return 1 if problems else 0
    outputs = generate(root)
    (root / "notebooks" / LEARNER_DIR).mkdir(exist_ok=True)
    for path, text in outputs.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(root)}")
    for p in stale(root):  # learner notebooks left over from a removed chapter
        print(f"warning: {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
