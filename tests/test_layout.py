"""The package's layout rule holds: imports point down the layers of ``tests/layout.py`` only, no
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


def test_every_module_has_a_layer_and_none_imports_back_up(mods):
    assert "imports back up: 0" in layout.picture(mods)
    rank = layout.ranks(mods)
    assert set(rank) == set(mods)


def _problems_of(tmp_path, monkeypatch, files: dict[str, str]) -> list[str]:
    """The problems of a made-up package laid out like this one."""
    pkg = tmp_path / "attncircuits"
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    monkeypatch.setattr(layout, "SRC", pkg)
    return layout.problems()


BASE = {"__init__.py": "", "heads.py": "", "validate.py": "from .heads import x\n", "model.py": "from . import validate\n"}


@pytest.mark.parametrize(
    "files, expected",
    [
        ({}, None),
        ({"heads.py": "from .model import M\n"}, "heads imports model, which is above it"),
        ({"validate.py": "from . import model\n"}, "validate imports model, which is above it"),
        ({"heads.py": "from .validate import check\n"}, "heads imports validate, which is above it"),  # a circle
        ({"model.py": "from .validate import *\n"}, "star-imports validate"),
        ({"model.py": "from .validate import _range\n"}, "private name _range from validate"),
        ({"model.py": "def f():\n    from . import validate\n"}, "imports validate inside a function"),
        ({"model.py": "def f():\n    import attncircuits.heads\n"}, "imports heads inside a function"),
        ({"model.py": "x = 1\n" * 401}, "model has 401 lines"),
        ({"scores2.py": "from . import model\n"}, "scores2: in no layer"),
        ({"circuits/__init__.py": "", "circuits/paths.py": "from ..scores import s\n", "scores.py": ""},
         "circuits/paths imports scores, which is above it"),
        ({"exercises/__init__.py": "", "exercises/ch10.py": "", "exercises/ch11.py": "from .ch10 import check\n"},
         "exercises/ch11 imports exercises/ch10"),
        ({"exercises/__init__.py": "", "exercises/_run.py": "", "plotting/__init__.py": "",
          "plotting/base.py": "from ..exercises._run import call\n"}, "private module exercises/_run"),
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
        {"model.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .scores import S\n", "scores.py": ""},
        {"exercises/__init__.py": "", "exercises/_run.py": "", "exercises/_core.py": "from ._run import _call\n"},
        {"model.py": "def f():\n    import math\n"},
    ],
)
def test_what_the_rule_allows(tmp_path, monkeypatch, files):
    """Type-only imports, a private module's names used by its siblings, local imports of the
    standard library."""
    assert _problems_of(tmp_path, monkeypatch, {**BASE, **files}) == []
