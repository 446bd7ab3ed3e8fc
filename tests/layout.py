"""The package's layers, read from its source: ``python tests/layout.py`` prints them.

Every module of ``src/attncircuits`` has a place in :data:`LAYERS` (lowest first); an import may
only point to a module of a lower layer, or to an earlier module of the same layer. That one
rule forbids an import back up and a circle. :func:`problems` also lists star imports, private
names (``_x``) imported from another module (a private module such as ``exercises/_run`` is its
package's inside: its siblings may use its names, nothing outside the package may import it),
function-local imports of a package module, and
modules over :data:`MAX_LINES` lines. Imports under ``if TYPE_CHECKING:`` are type-only and left
out. ``tests/test_layout.py`` asserts that the list of problems is empty.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "attncircuits"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE
MAX_LINES = 400

#: the layers, lowest first; within a layer, a module may import the ones listed before it.
#: A name ending in ``/`` stands for every module of that folder not listed by name (a new chapter's
#: checks, ``exercises/ch10``, finds its place without an edit here); those may not import each other.
LAYERS: list[tuple[str, list[str]]] = [
    ("ground floor: head names, checks of inputs, durable file writes", ["heads", "validate", "durable"]),
    ("the models: attention-only, and chapter 10's TransformerLens model", ["model", "hooked"]),
    ("text: corpus, tokenizer, batches", ["data"]),
    ("figures: draw, compute nothing (plotting/)",
     ["plotting/base", "plotting/html", "plotting/bars", "plotting/curves", "plotting/heatmaps", "plotting/scatter",
      "plotting/__init__"]),
    ("shipped checkpoints: the set in use, loading, the claims checked on it", ["manifest", "modelset", "pretrained", "claims"]),
    ("weights (circuits/)",
     ["circuits/factored_matrix", "circuits/factored", "circuits/bigrams", "circuits/paths", "circuits/skip_trigrams",
      "circuits/copying", "circuits/composition", "circuits/two_layer_paths", "circuits/induction", "circuits/__init__"]),
    ("losses and ablations", ["losses"]),
    ("attention patterns and scores", ["scores"]),
    ("training and its command line", ["train/presets", "train/__init__", "run_folder", "train_cli", "train/__main__", "trainset", "replicate", "mine"]),
    ("models built or changed by hand", ["smeared", "handbuilt", "live"]),
    ("TransformerLens", ["interop", "deeper"]),
    ("explorers (widgets/)", ["widgets/static", "widgets/explorer", "widgets/chapters", "widgets/__init__"]),
    ("checks (exercises/)",
     ["exercises/_run", "exercises/_compare", "exercises/_contract", "exercises/_judge", "exercises/_inputs",
      "exercises/_core", "exercises/ch01", "exercises/ch02", "exercises/ch03",
      "exercises/ch04", "exercises/ch05", "exercises/ch06", "exercises/ch07", "exercises/ch08", "exercises/ch09",
      "exercises/", "exercises/make_learner", "exercises/__init__"]),
    ("the package", ["__init__"]),
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


def ranks(mods: dict[str, Module]) -> dict[str, tuple[int, int]]:
    """(layer, position in the layer) of every module; folder entries (``x/``) take the rest of x."""
    out: dict[str, tuple[int, int]] = {}
    for li, (_, entries) in enumerate(LAYERS):
        for pi, e in enumerate(entries):
            if e.endswith("/"):
                continue
            if e in mods:
                out[e] = (li, pi)
    for li, (_, entries) in enumerate(LAYERS):
        for pi, e in enumerate(entries):
            if e.endswith("/"):
                for name in mods:
                    if name.startswith(e) and name not in out:
                        out[name] = (li, pi)
    return out


def problems(mods: dict[str, Module] | None = None) -> list[str]:
    mods = read_modules() if mods is None else mods
    rank = ranks(mods)
    out = []
    for name, m in sorted(mods.items()):
        if name not in rank:
            out.append(f"{name}: in no layer of tests/layout.py LAYERS; give it a place")
            continue
        for t in m.imports:
            if t == name or t not in rank:
                continue
            if rank[t] >= rank[name]:  # above it, or beside it (two modules of one "x/" entry)
                out.append(f"{name} imports {t}, which is above it ({LAYERS[rank[t][0]][0]})")
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
    for li, (title, _) in reversed(list(enumerate(LAYERS))):
        members = sorted((n for n in mods if rank.get(n, (None,))[0] == li), key=lambda n: rank[n])
        if not members:
            continue
        lines.append(f"[{li:>2}] {title}")
        for n in members:
            m = mods[n]
            ups = [t for t in m.imports if t in rank and t != n and rank[t] >= rank[n]]
            back += len(ups)
            imps = ", ".join(sorted(m.imports, key=lambda t: rank.get(t, (99, 0)))) or "-"
            lines.append(f"     {n:<28} {m.lines:>4}  <- {imps}")
    lines.append(f"imports back up: {back}")
    return "\n".join(lines)


if __name__ == "__main__":
    mods = read_modules()
    print(picture(mods))
    found = problems(mods)
    print(f"problems: {len(found)}")
    for p in found:
        print("  " + p)
    sys.exit(1 if found else 0)
