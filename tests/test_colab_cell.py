"""The Colab first cell of every notebook: identical everywhere, and its three branches behave.

The cell runs before the package can be imported, so it is plain standard-library code. The
canonical copy is the first cell of chapter 1; every other notebook must carry the same text.
Each branch is run in a fresh interpreter: ``python -S`` (no site-packages) stands for a Python
without the package, and a stub ``pip`` placed first on ``PYTHONPATH`` records the command the
cell would run on Colab and "installs" a stand-in package.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from attncircuits.models import hooked

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "notebooks" / "01_attention_only_transformer.ipynb"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def first_cell(path: Path):
    return nbformat.read(path, as_version=4).cells[0]


CELL = first_cell(CANONICAL).source
REPOSITORY = re.search(r'^REPOSITORY = "(.+)"', CELL, re.M).group(1)
BRANCH = re.search(r'^BRANCH = "(.+)"', CELL, re.M).group(1)
SOURCE = f"git+{REPOSITORY}@{BRANCH}"  # what pip must be given

STUB_PIP = """
import json, os, pathlib, sys
pathlib.Path(os.environ["STUB_PIP_RECORD"]).write_text(json.dumps(sys.argv[1:]))
if os.environ.get("STUB_PIP_FAIL"):
    sys.exit(1)
pkg = pathlib.Path(__file__).resolve().parents[1] / "attncircuits"
pkg.mkdir()
(pkg / "__init__.py").write_text("STAND_IN = True\\n")
"""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_starts_with_the_colab_cell(path):
    cell = first_cell(path)
    assert cell.cell_type == "code" and "remove-cell" in cell.metadata.get("tags", []), (
        f"{path.name}: the first cell must be the Colab cell, tagged remove-cell"
    )
    assert cell.source == CELL, f"{path.name}: copy the first cell of {CANONICAL.name} verbatim"


def test_cell_installs_from_the_repository_named_in_config():
    yaml = pytest.importorskip("yaml")
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    assert (REPOSITORY, BRANCH) == (repo["url"], repo["branch"]), "keep the cell and _config.yml's repository in step"


def run_cell(tmp_path, *, site: bool, colab: str | None = None, pip_fails: bool = False, cell: str = CELL):
    """Run the cell in a fresh interpreter; return (process, recorded pip argv or None)."""
    stub = tmp_path / "stub"
    (stub / "pip").mkdir(parents=True)
    (stub / "pip" / "__init__.py").write_text("")
    (stub / "pip" / "__main__.py").write_text(STUB_PIP)
    (stub / "google" / "colab").mkdir(parents=True)
    (stub / "google" / "__init__.py").write_text("")
    (stub / "google" / "colab" / "__init__.py").write_text("")
    (tmp_path / "cell.py").write_text(cell)
    record = tmp_path / "pip.json"
    env = {k: v for k, v in os.environ.items() if k not in ("COLAB_RELEASE_TAG", "PYTHONPATH")}
    env.update(PYTHONPATH=str(stub), STUB_PIP_RECORD=str(record))
    if colab == "env":
        env["COLAB_RELEASE_TAG"] = "release-colab-test"
    if pip_fails:
        env["STUB_PIP_FAIL"] = "1"
    prelude = "import google.colab\n" if colab == "module" else ""
    code = prelude + (
        "exec(compile(open('cell.py').read(), 'colab-cell', 'exec'), {})\n"
        "import attncircuits\n"
        "print('IMPORTED', getattr(attncircuits, 'STAND_IN', False))\n"
    )
    args = [sys.executable] + (["-S"] if not site else []) + ["-c", code]
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return proc, json.loads(record.read_text()) if record.exists() else None


@pytest.mark.parametrize("colab", [None, "env"])
def test_importable_is_a_no_op(tmp_path, colab):
    proc, pip = run_cell(tmp_path, site=True, colab=colab)
    assert proc.returncode == 0, proc.stderr
    assert pip is None  # no install, not even on Colab
    assert "IMPORTED False" in proc.stdout  # the real package, untouched


def test_not_importable_off_colab_says_make_venv(tmp_path):
    proc, pip = run_cell(tmp_path, site=False)
    assert proc.returncode != 0 and pip is None
    assert "ModuleNotFoundError" in proc.stderr and "`make venv`" in proc.stderr, proc.stderr


@pytest.mark.parametrize("colab", ["env", "module"])
def test_on_colab_installs_from_the_repository_and_keeps_torch(tmp_path, colab):
    proc, pip = run_cell(tmp_path, site=False, colab=colab)
    assert proc.returncode == 0, proc.stderr
    assert "IMPORTED True" in proc.stdout  # imported right after the install, same process
    assert pip[0] == "install"
    targets = [a for a in pip[1:] if not a.startswith("-")]
    assert targets == [SOURCE]
    assert not any("torch" in a for a in pip)
    assert not set(pip) & {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I", "--no-deps"}
    assert not any(a.startswith("--upgrade-strategy") for a in pip)


def test_on_colab_a_failed_install_says_what_to_run(tmp_path):
    proc, pip = run_cell(tmp_path, site=False, colab="env", pip_fails=True)
    assert proc.returncode != 0 and pip is not None
    assert f"!pip install {SOURCE}" in proc.stderr


LEARNER = sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb"))
BLOCK_PACKAGE = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "attncircuits" or name.startswith("attncircuits."):
            raise ModuleNotFoundError("No module named 'attncircuits'", name="attncircuits")
sys.meta_path.insert(0, Block())
"""


@pytest.fixture(scope="module")
def learner_cell_runs(tmp_path_factory):
    """The three runs of a learner's first cell (no torch, no package; torch but no package; on
    Colab), once for each different cell: the generator writes the same set-up into every copy,
    and what a cell's code does depends on its code alone."""
    done = {}

    def runs(cell: str):
        if cell not in done:
            tmp = tmp_path_factory.mktemp("learner-cell")
            for sub in ("bare", "with-torch", "colab"):  # a folder named torch would be importable
                (tmp / sub).mkdir()
            done[cell] = (run_cell(tmp / "bare", site=False, cell=cell),  # no torch either
                          run_cell(tmp / "with-torch", site=True, cell=BLOCK_PACKAGE + cell),  # no package
                          run_cell(tmp / "colab", site=False, colab="env", cell=cell))
        return done[cell]

    return runs


@pytest.mark.parametrize("path", LEARNER, ids=lambda p: p.name)
def test_a_downloaded_learner_notebook_says_the_one_command_off_colab(path, learner_cell_runs):
    """A learner's notebook may be opened with no clone around it: off Colab its first cell stops
    with the one ``%pip install`` that installs the package from the repository; on Colab it
    installs it as the solved chapters' cell does."""
    bare, with_torch, colab = learner_cell_runs(first_cell(path).source)
    proc, pip = bare
    assert proc.returncode != 0 and pip is None
    assert f'%pip install "{SOURCE}"' in proc.stderr, proc.stderr
    # without torch, its CPU build first: pip would otherwise bring the CUDA build (gigabytes)
    cpu = "%pip install torch --index-url https://download.pytorch.org/whl/cpu"
    assert cpu in proc.stderr and proc.stderr.index(cpu) < proc.stderr.index(SOURCE), proc.stderr
    proc, pip = with_torch
    assert proc.returncode != 0 and pip is None
    assert f'%pip install "{SOURCE}"' in proc.stderr and "install torch" not in proc.stderr, proc.stderr
    proc, pip = colab
    assert proc.returncode == 0, proc.stderr
    assert [a for a in pip[1:] if not a.startswith("-")] == [SOURCE]


# ---- the TransformerLens set-up cell of the chapters that need TransformerLens -----------------
def tl_cells() -> dict[Path, str]:
    """The second cell of every notebook (solved and learner) whose set-up installs TransformerLens."""
    out = {}
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        if len(cells) > 1 and cells[1].source.startswith("# Colab set-up for this chapter"):
            out[path] = cells[1].source
    return out


def test_the_transformer_lens_cell_is_one_cell_everywhere():
    cells = tl_cells()
    names = sorted(p.relative_to(ROOT).as_posix() for p in cells)
    assert {"notebooks/09_transformer_lens.ipynb", "notebooks/10_deeper_model.ipynb"} <= set(names), names
    assert len(set(cells.values())) == 1, f"the TransformerLens set-up differs between {names}"
    for path in cells:
        assert "remove-cell" in nbformat.read(path, as_version=4).cells[1].metadata.get("tags", []), path


def test_the_transformer_lens_cell_off_colab_names_the_install_command(monkeypatch):
    """Without TransformerLens (and off Colab) the cell stops with the one command to run; with it,
    it does nothing. Run in this process (chapter 9's nbval run imports the real package; here
    a stand-in module saves its import)."""
    import importlib.metadata
    import types

    cell = compile(next(iter(tl_cells().values())), "<chapter 9's set-up cell>", "exec")
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setitem(sys.modules, "transformer_lens", None)  # `import transformer_lens` fails
    with pytest.raises(ModuleNotFoundError) as blocked:
        exec(cell, {})
    assert "`pip install -e '.[tl]'`" in str(blocked.value), blocked.value
    assert '`%pip install "transformer-lens>=4.3,<5"`' in str(blocked.value), blocked.value  # no clone needed
    # a version outside the range (3.x, whose HookedTransformer 4.0 removed) stops it too, in one line
    real_version = importlib.metadata.version
    for version, words in (("3.9.0", "is too old"), ("5.0.0", "is newer than the course was checked with")):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=version: v)
        with pytest.raises(ModuleNotFoundError) as stale:
            exec(cell, {})
        text = str(stale.value)
        assert "\n" not in text and f"TransformerLens {version} {words}" in text, text
        assert "pip install -e '.[tl]'" in text, text
    monkeypatch.setattr(importlib.metadata, "version", real_version)
    try:
        hooked.transformer_lens_version()  # the installed one is in the range
    except ImportError:
        pytest.skip("TransformerLens is not installed here (the `tl` extra)")
    monkeypatch.setitem(sys.modules, "transformer_lens", types.ModuleType("transformer_lens"))
    exec(cell, {})  # does nothing
