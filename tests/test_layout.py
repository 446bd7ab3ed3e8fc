"""The package's layout rule holds: imports point down the rooms of ``tests/layout.py`` only, no circle,
no
star import, no private name used outside its module, no function-local import of a package module,
no module over 400 lines. ``python tests/layout.py`` prints the layers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import layout  # noqa: E402


@pytest.fixture(scope="module")
def mods():
    return layout.read_modules()


def test_the_package_keeps_its_layout(mods):
    found = layout.problems(mods)
    assert not found, "\n".join(found)


def test_every_module_has_a_room_and_none_imports_back_up(mods):
    picture = layout.picture(mods)
    assert "imports back up: 0" in picture and "circles: 0" in picture
    rank = layout.ranks(mods)
    assert set(rank) == set(mods)


def test_the_package_docstring_names_every_room():
    import attncircuits

    doc = attncircuits.__doc__
    missing = [r for r, _ in layout.ROOMS if r != "__init__" and f"``{r}" not in doc]
    assert not missing, f"the package docstring does not describe the rooms {missing}"


def _problems_of(tmp_path, monkeypatch, files: dict[str, str]) -> list[str]:
    """The problems of a made-up package laid out like this one."""
    pkg = tmp_path / "attncircuits"
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    monkeypatch.setattr(layout, "SRC", pkg)
    return layout.problems()


BASE = {"__init__.py": "", "core/__init__.py": "", "core/heads.py": "", "core/validate.py": "from .heads import x\n",
        "models/__init__.py": "", "models/transformer.py": "from ..core import validate\n"}


@pytest.mark.parametrize(
    "files, expected",
    [
        ({}, None),
        ({"core/heads.py": "from ..models.transformer import M\n"}, "core/heads imports models/transformer, which is above it"),
        ({"core/validate.py": "from ..models import transformer\n"}, "core/validate imports models/transformer, which is above"),
        ({"core/heads.py": "from .validate import check\n"}, "a circle of imports: core/heads -> core/validate -> core/heads"),
        ({"models/transformer.py": "from ..core.validate import *\n"}, "star-imports core/validate"),
        ({"models/transformer.py": "from ..core.validate import _range\n"}, "private name _range from core/validate"),
        ({"models/transformer.py": "def f():\n    from ..core import validate\n"}, "imports core/validate inside a function"),
        ({"models/transformer.py": "def f():\n    import attncircuits.core.heads\n"}, "imports core/heads inside a function"),
        ({"models/transformer.py": "x = 1\n" * 401}, "models/transformer has 401 lines"),
        ({"scores2.py": "from .models import attn_only\n"}, "scores2: in no room"),
        ({"analysis/__init__.py": "", "analysis/circuits/__init__.py": "", "analysis/circuits/paths.py": "from ...train import s\n",
          "train/__init__.py": ""}, "analysis/circuits/paths imports train/__init__, which is above it"),
        ({"course/__init__.py": "", "course/exercises/__init__.py": "", "course/exercises/ch10.py": "from .ch11 import c\n",
          "course/exercises/ch11.py": "from .ch10 import check\n"}, "a circle of imports: course/exercises/ch10"),
        ({"course/__init__.py": "", "course/exercises/__init__.py": "", "course/exercises/_run.py": "", "show/__init__.py": "",
          "show/base.py": "from ..course.exercises._run import call\n"}, "private module course/exercises/_run"),
    ],
)
def test_the_rule_catches_each_kind_of_defect(tmp_path, monkeypatch, files, expected):
    found = _problems_of(tmp_path, monkeypatch, {**BASE, **files})
    if expected is None:
        assert found == []
    else:
        assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    "files",
    [
        {"models/transformer.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..analysis.scores import S\n",
         "analysis/__init__.py": "", "analysis/scores.py": ""},
        {"course/__init__.py": "", "course/exercises/__init__.py": "", "course/exercises/_run.py": "",
         "course/exercises/_core.py": "from ._run import _call\n"},
        {"models/transformer.py": "def f():\n    import math\n"},
    ],
)
def test_what_the_rule_allows(tmp_path, monkeypatch, files):
    """Type-only imports, a private module's names used by its siblings, local imports of the
    standard library."""
    assert _problems_of(tmp_path, monkeypatch, {**BASE, **files}) == []
