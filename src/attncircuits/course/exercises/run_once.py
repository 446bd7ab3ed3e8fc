"""Which cells of a learner's notebook ``make test`` may leave to the solved chapter's run.

A learner's notebook repeats every cell of its chapter. A cell whose inputs no exercise touches
computes in the learner's copy exactly what it computes in the solved chapter, which ``make test``
runs too; when it is slow (a live training run, an ablation sweep, a table over every model),
running it twice proves nothing new. Such cells are tagged in the solved chapter (``live-run``
or ``run-once``) and get nbval's ``nbval-skip`` in the learner's copy (in Jupyter and Colab they
run as usual). A tag is honoured only when it is safe, which :func:`check_skippable` proves from
the cells' code, and otherwise the generator refuses it naming the cell and the name:

- the cell reads no name an exercise defines, directly or through earlier cells (a name bound by
  a ``solution`` cell is the learner's; a cell reading one binds the learner's results in turn);
- no cell that still runs after it reads a name it binds, unless a cell that runs has bound the
  name again in between or the reading cell binds it itself (the learner's copy under test would
  otherwise stop with a ``NameError`` that the learner never meets).

Names are read from the code's syntax (assignments, ``def``, ``class``, imports, ``for`` and
``with`` targets bind; every other use of a name reads), so an attribute set on an object another
cell made is not seen: tag only cells that bind their results to names.
"""

from __future__ import annotations

import ast

#: a chapter cell whose work the learner's copy leaves to the solved chapter's run (see the module)
RUN_ONCE = "run-once"


def _code(source: str) -> str:
    # IPython's magics and shell lines are not Python; they bind nothing the chapters read
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def names(source: str, where: str) -> tuple[set[str], set[str]]:
    """``(bound, read)``: the names a cell's code binds at its top level and the names it reads."""
    try:
        tree = ast.parse(_code(source))
    except SyntaxError as err:
        raise ValueError(f"{where} is not Python ({err.msg}, line {err.lineno})") from None
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    return bound, read


def check_skippable(cells: list[tuple[str, str, bool, bool]]) -> None:
    """Raise ``ValueError`` unless every cell marked skipped may be skipped (see the module).

    ``cells``: ``(where, source, is_solution, skipped)`` for each code cell, in order."""
    parsed = [(where, *names(src, where), solution, skipped) for where, src, solution, skipped in cells]
    tainted: set[str] = set()
    for where, bound, read, solution, skipped in parsed:
        learners = read & tainted
        if skipped and (learners or solution):
            what = "is an exercise" if solution else f"reads {sorted(learners)[0]!r}, which an exercise's answer feeds"
            raise ValueError(f"{where} is tagged to run once but {what}: in the learner's copy it computes "
                             "something else, so it must run there; remove its tag")
        if solution or learners:
            tainted |= bound
    owner: dict[str, tuple[str, bool]] = {}  # each name: the cell that bound it last, and whether it is skipped
    for where, bound, read, _, skipped in parsed:
        for name in sorted(read - bound):  # a name the cell binds itself is its own (a loop's variable)
            source, source_skipped = owner.get(name, ("", False))
            if source_skipped and not skipped:
                raise ValueError(f"{source} is tagged to run once, but {where}, which runs in the learner's copy, "
                                 f"reads {name!r} from it: tag that cell too or remove the tag")
        owner |= {name: (where, skipped) for name in bound}
