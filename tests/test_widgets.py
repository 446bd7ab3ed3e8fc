"""widgets.py: the first state is always a static output; controls appear only with a kernel and
ipywidgets, and redraw that same output in place."""

import os
import sys

import matplotlib

matplotlib.use("Agg")

import nbformat  # noqa: E402
import pytest  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

from attncircuits.widgets import STATIC_ENV, Explorer, interactive_available  # noqa: E402


def _draw(layer, head, scale=1.0):
    return {"layer": layer, "head": head, "scale": scale}


def test_explorer_first_state_and_redraw_without_a_kernel(capsys):
    ex = Explorer(_draw, {"layer": [0, 1], "head": range(8), "scale": [("x1", 1.0), ("x2", 2.0)]}, initial={"head": 3})
    assert ex.render() == {"layer": 0, "head": 3, "scale": 1.0}
    assert not interactive_available()  # plain pytest: no kernel
    ex.show()  # outside IPython: prints, never errors
    assert ex.widget is None
    ex.redraw(layer=1)
    assert ex.values == {"layer": 1, "head": 3, "scale": 1.0}


def test_explorer_bad_input_names_the_options():
    with pytest.raises(ValueError, match=r"options: \[0, 1\]"):
        Explorer(_draw, {"layer": [0, 1], "head": range(8)}, initial={"layer": 2})
    ex = Explorer(_draw, {"layer": [0, 1], "head": range(8)})
    with pytest.raises(ValueError, match="not an option of control 'head'"):
        ex.render(head=8)
    with pytest.raises(KeyError, match="controls"):
        ex.render(heads=1)
    with pytest.raises(TypeError, match="a range"):
        Explorer(_draw, {"layer": 3})


CELL = """
import matplotlib.pyplot as plt
from attncircuits.widgets import explorer

def draw(head, label):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_title(f"head {head} {label}")
    return fig

ex = explorer(draw, {"head": range(4), "label": ["a", "b"]})
"""


def _run_in_kernel(prelude: str, env: dict | None = None) -> list:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(prelude + CELL), nbformat.v4.new_code_cell("ex.redraw(head=2); ex")]
    nb.cells += [nbformat.v4.new_code_cell(f"display(draw({h}, 'a')); plt.close('all')") for h in (0, 2)]
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb.cells


@pytest.mark.skipif(sys.platform == "win32", reason="kernel start-up is slow there")
def test_in_a_kernel_controls_appear_and_redraw_replaces_the_static_figure():
    cells = _run_in_kernel("")
    outs = cells[0].outputs
    assert [o.output_type for o in outs] == ["display_data", "display_data"], outs
    assert "application/vnd.jupyter.widget-view+json" in outs[0].data  # the controls
    assert "image/png" in outs[1].data  # the static first state, kept by the book
    # ex.redraw(head=2) replaced the figure output in place (same display_id): it now holds the
    # head-2 drawing, not the head-0 first state; the trailing `ex` displayed nothing more.
    assert cells[1].outputs == []
    first, second = (c.outputs[0].data["image/png"] for c in cells[2:])
    assert first != second and outs[1].data["image/png"] == second


def test_without_ipywidgets_or_with_the_static_switch_only_the_figure_appears():
    blocked = _run_in_kernel("import sys; sys.modules['ipywidgets'] = None\n")
    static = _run_in_kernel("", env={STATIC_ENV: "1"})
    for cells in (blocked, static):
        outs = cells[0].outputs
        assert len(outs) == 1 and "image/png" in outs[0].data, outs
        assert not any(o.output_type == "error" for c in cells for o in c.outputs)
