"""The package's rooms, read from its source: ``python tests/layout.py`` prints them.

Every module of ``src/attncircuits`` lies in one room of :data:`ROOMS` (lowest first): its first
folder (``analysis/circuits/paths`` is in ``analysis``), or its own name for a top-level module
(``data``). An import may point to a module of a lower room, or to one of its own room as long as
the imports inside the room make no circle. That rule forbids an import back up and a circle, and
needs no list of modules: a new module finds its place by the folder it is put in. :func:`problems`
also lists star imports, private names (``_x``) imported from another module (a private module such
as ``course/exercises/_run`` is its package's inside: its siblings may use its names, nothing outside
the package may import it), function-local imports of a package module, and modules over
:data:`MAX_LINES` lines. Imports under ``if TYPE_CHECKING:`` are type-only and left out.
``tests/test_layout.py`` asserts that the list of problems is empty. The rooms are the ones the
package docstring (``src/attncircuits/__init__.py``) describes; a test checks that it names each.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "attncircuits"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE
MAX_LINES = 400

#: the rooms, lowest first, each with what it holds
ROOMS: list[tuple[str, str]] = [
    ("core", "knows no model: head names, checks of inputs, durable writes, manifests"),
    ("data", "text: corpus, tokenizer, batches"),
    ("models", "the models and the TransformerLens bridge"),
    ("checkpoints", "load, save, model sets, the shipped weights"),
    ("analysis", "reads a model, draws nothing: circuits from weights, losses, scores"),
    ("show", "draws, computes nothing: plotting, widgets"),
    ("train", "the loop, presets, command line, run folders, sets, replicates, own text, live run"),
    ("course", "claims, exercise checks, the learner-notebook generator"),
    ("__init__", "the package"),
]


@dataclass
class Module:
    name: str  # "circuits/paths"
    path: Path
    lines: int
    imports: list[str] = field(default_factory=list)  # package modules imported at the top
    local_imports: list[tuple[int, str]] = field(default_factory=list)  # (line, module) inside a function
    star_imports: list[tuple[int, str]] = field(default_factory=list)
    private_imports: list[tuple[int, str, str]] = field(default_factory=list)  # (line, module, name)


def module_name(path: Path) -> str:
    return path.relative_to(SRC).with_suffix("").as_posix()


def _resolve(mod: str, level: int, current: str, names: list[str], known: set[str]) -> list[str]:
    """The package modules that ``from <level dots><mod> import <names>`` (or ``import mod``) reads."""
    if level == 0:
        if mod != PACKAGE and not mod.startswith(PACKAGE + "."):
            return []
        parts = mod.split(".")[1:]
    else:
        base = current.split("/")
        base = base[: len(base) - level]  # the package the relative import starts from
        parts = base + (mod.split(".") if mod else [])
    target = "/".join(parts)
    out = []
    for n in names:  # `from . import scores` imports the module scores
        sub = f"{target}/{n}" if target else n
        if sub in known or f"{sub}/__init__" in known:
            out.append(sub if sub in known else f"{sub}/__init__")
    if not out or len(out) < len(names):
        if target in known:
            out.append(target)
        elif f"{target}/__init__" in known:
            out.append(f"{target}/__init__")
        elif not target:
            out.append("__init__")
    return sorted(set(out))


def _type_only(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def read_modules() -> dict[str, Module]:
    paths = sorted(SRC.rglob("*.py"))
    known = {module_name(p) for p in paths}
    mods: dict[str, Module] = {}
    for p in paths:
        name = module_name(p)
        src = p.read_text()
        m = Module(name, p, src.count("\n"))
        tree = ast.parse(src)

        def visit(node, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_only(child):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if isinstance(child, ast.Import):
                        targets = [t for a in child.names for t in _resolve(a.name, 0, name, [], known)]
                        names = []
                    else:
                        names = [a.name for a in child.names]
                        targets = _resolve(child.module or "", child.level, name, names, known)
                    for t in targets:
                        if in_function:
                            m.local_imports.append((child.lineno, t))
                        elif t not in m.imports:
                            m.imports.append(t)
                    if targets and "*" in names:
                        m.star_imports.append((child.lineno, targets[0]))
                    for n in names:
                        if n.startswith("_") and not n.startswith("__") and targets:
                            m.private_imports.append((child.lineno, targets[0], n))
                    continue
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, inner)

        visit(tree, False)
        mods[name] = m
    return mods


def room(name: str) -> str | None:
    """The room of module ``name`` (``"analysis/circuits/paths"`` -> ``"analysis"``), None if none."""
    first = name.split("/", 1)[0]
    return first if first in dict(ROOMS) else None


def _room_index(name: str) -> int | None:
    r = room(name)
    return None if r is None else [n for n, _ in ROOMS].index(r)


def circles(mods: dict[str, Module]) -> list[list[str]]:
    """The circles of imports inside a room, each as the modules of one circle in import order."""
    graph = {n: [t for t in m.imports if t in mods and t != n and room(t) == room(n)] for n, m in mods.items()}
    out, state, stack = [], {}, []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for t in graph[n]:
            if state.get(t) == 1:
                out.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return out


def ranks(mods: dict[str, Module]) -> dict[str, tuple[int, int]]:
    """(room, depth in the room) of every module that has a room: depth 0 imports nothing of its
    room, depth d imports one of depth d-1 (a module in a circle gets the depth reached first)."""
    out: dict[str, tuple[int, int]] = {}

    def depth(n: str, seen: frozenset) -> int:
        inside = [t for t in mods[n].imports if t in mods and t != n and room(t) == room(n) and t not in seen]
        return 1 + max((depth(t, seen | {n}) for t in inside), default=-1)

    for n in mods:
        ri = _room_index(n)
        if ri is not None:
            out[n] = (ri, depth(n, frozenset()))
    return out


def problems(mods: dict[str, Module] | None = None) -> list[str]:
    mods = read_modules() if mods is None else mods
    rank = ranks(mods)
    out = ["a circle of imports: " + " -> ".join(c) for c in circles(mods)]
    for name, m in sorted(mods.items()):
        if name not in rank:
            out.append(f"{name}: in no room of tests/layout.py ROOMS; put it in one of {[r for r, _ in ROOMS]}")
            continue
        for t in m.imports:
            if t in rank and rank[t][0] > rank[name][0]:
                out.append(f"{name} imports {t}, which is above it (room {room(t)}: {dict(ROOMS)[room(t)]})")
        for line, t in m.local_imports:
            out.append(f"{name}:{line} imports {t} inside a function; import it at the top")
        for line, t in m.star_imports:
            out.append(f"{name}:{line} star-imports {t}; name what it uses")
        for t in m.imports:
            if _private_module(t) and _folder(t) != _folder(name):
                out.append(f"{name} imports the private module {t} from outside its package")
        for line, t, n in m.private_imports:
            if _private_module(t) and _folder(t) == _folder(name):
                continue  # a private module (``_run``) is its package's inside: its siblings use its names
            out.append(f"{name}:{line} imports the private name {n} from {t}; make it public or move it")
        if m.lines > MAX_LINES:
            out.append(f"{name} has {m.lines} lines (> {MAX_LINES}); split it along a line a reader would guess")
    return out


def _folder(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def _private_module(name: str) -> bool:
    leaf = name.rsplit("/", 1)[-1]
    return leaf.startswith("_") and not leaf.startswith("__")


def picture(mods: dict[str, Module] | None = None) -> str:
    mods = read_modules() if mods is None else mods
    rank = ranks(mods)
    lines = []
    back = 0
    for ri, (name, what) in reversed(list(enumerate(ROOMS))):
        members = sorted((n for n in mods if rank.get(n, (None,))[0] == ri), key=lambda n: (rank[n], n))
        if not members:
            continue
        lines.append(f"[{ri}] {name}: {what}")
        for n in members:
            m = mods[n]
            back += sum(1 for t in m.imports if t in rank and rank[t][0] > rank[n][0])
            imps = ", ".join(sorted(m.imports, key=lambda t: (rank.get(t, (99, 0)), t))) or "-"
            lines.append(f"     {n:<34} {m.lines:>4}  <- {imps}")
    lines.append(f"imports back up: {back}")
    lines.append(f"circles: {len(circles(mods))}")
    return "\n".join(lines)


if __name__ == "__main__":
    mods = read_modules()
    print(picture(mods))
    found = problems(mods)
    print(f"problems: {len(found)}")
    for p in found:
        print("  " + p)
    sys.exit(1 if found else 0)
