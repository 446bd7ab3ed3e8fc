"""widgets: live controls redraw one output in a kernel; without one (or in the book build) the
explorer shows precomputed states whose buttons work in plain HTML and CSS, with no script."""

import os
import re
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

from attncircuits.show.widgets import STATIC_ENV, Explorer, interactive_available  # noqa: E402
from attncircuits.show.widgets.static import limit_states, pick  # noqa: E402


def _draw(layer, head, scale=1.0):
    return {"layer": layer, "head": head, "scale": scale}


def _figure(head, label="a"):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_title(f"head {head} {label}")
    return fig


def test_explorer_first_state_and_redraw_without_a_kernel(capsys):
    ex = Explorer(_draw, {"layer": [0, 1], "head": range(8), "scale": [("x1", 1.0), ("x2", 2.0)]}, initial={"head": 3})
    assert ex.render() == {"layer": 0, "head": 3, "scale": 1.0}
    assert not interactive_available()  # plain pytest: no kernel
    ex.show()  # outside IPython: the static explorer is printed, nothing errors
    assert ex.widget is None and ex.shown
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
    with pytest.raises(KeyError, match="unknown control 'heads'"):
        Explorer(_draw, {"layer": [0, 1], "head": range(8)}, static_options={"heads": [0]})
    with pytest.raises(ValueError, match="not an option"):
        Explorer(_draw, {"layer": [0, 1], "head": range(8)}, static_options={"head": [9]})


def test_static_options_are_evenly_spaced_keep_the_first_state_and_are_capped():
    assert pick(range(8), 3, 12) == list(range(8))
    chosen = pick(range(64), 37, 12)
    assert len(chosen) == 12 and 37 in chosen and chosen[0] == 0 and chosen[-1] == 63
    assert chosen == sorted(chosen)
    out = limit_states({"layer": [0, 1], "head": list(range(8)), "query": list(range(64))}, {"layer": 1, "head": 2, "query": 5})
    assert len(out["layer"]) * len(out["head"]) * len(out["query"]) <= 96
    assert 1 in out["layer"] and 2 in out["head"] and 5 in out["query"]


def test_static_explorer_is_script_free_html_with_one_state_per_combination():
    calls, open_before = [], set(plt.get_fignums())  # another module's figures may be open in this worker

    def draw(head, label):
        calls.append((head, label))
        return _figure(head, label)

    ex = Explorer(draw, {"head": range(4), "label": [("first", "a"), ("second", "b")]}, initial={"head": 2},
                  title="Heads <and> labels")
    page = ex.static_html()
    assert sorted(calls) == [(h, lab) for h in range(4) for lab in "ab"]  # every state drawn once
    assert set(plt.get_fignums()) == open_before  # and released: nothing for the inline backend to show again
    assert "<script" not in page.lower() and not re.search(r"\son\w+\s*=", page) and "http" not in page
    assert page.count('type="radio"') == 4 + 2 and page.count("data:image/png;base64,") == 8
    assert "Heads &lt;and&gt; labels" in page and ">first</label>" in page and ">second</label>" in page
    checked = re.findall(r'class="(c\d+o\d+)" checked', page)
    assert checked == ["c0o2", "c1o0"]  # the first state: head 2, label "first"
    # one CSS rule per state, shown when its buttons are checked; the explorer's id scopes them
    uid = re.search(r'id="(ac-[0-9a-f]+)"', page).group(1)
    assert f"#{uid}>input.c0o3:checked ~ input.c1o1:checked ~ .ac-states>.s3-1{{display:block}}" in page
    assert ex.static_html() == page  # deterministic: a rebuild gives the same page


def test_static_explorer_honours_static_options():
    ex = Explorer(lambda step: f"step {step}", {"step": range(0, 8000, 1000)}, initial={"step": 7000},
                  static_options={"step": [0, 3000]})
    states = ex.static_states()
    assert [v for _, v in states["step"]] == [7000, 0, 3000]  # the first state is always included
    page = ex.static_html()
    assert page.count("<pre>step ") == 3


CELL = """
import matplotlib.pyplot as plt
from attncircuits.show.widgets import explorer

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
def test_in_a_kernel_controls_appear_and_redraw_replaces_the_figure():
    cells = _run_in_kernel("")
    outs = cells[0].outputs
    assert [o.output_type for o in outs] == ["display_data", "display_data"], outs  # the figure shows once
    assert "application/vnd.jupyter.widget-view+json" in outs[0].data  # the controls
    assert "image/png" in outs[1].data  # the current state
    # ex.redraw(head=2) replaced the figure output in place (same display_id): it now holds the
    # head-2 drawing, not the head-0 first state; the trailing `ex` displayed nothing more.
    assert cells[1].outputs == []
    first, second = (c.outputs[0].data["image/png"] for c in cells[2:])
    assert first != second and outs[1].data["image/png"] == second


@pytest.mark.skipif(sys.platform == "win32", reason="kernel start-up is slow there")
def test_without_ipywidgets_or_with_the_static_switch_the_precomputed_states_appear():
    blocked = _run_in_kernel("import sys; sys.modules['ipywidgets'] = None\n")
    static = _run_in_kernel("", env={STATIC_ENV: "1"})
    for cells in (blocked, static):
        outs = cells[0].outputs
        assert len(outs) == 1 and "text/html" in outs[0].data, outs  # one output, no stray figure
        page = outs[0].data["text/html"]
        assert page.count("data:image/png;base64,") == 8 and page.count('type="radio"') == 6
        assert "application/vnd.jupyter.widget-view+json" not in outs[0].data  # no control that does nothing
        assert cells[1].outputs == []  # `ex` as a later cell's value shows nothing more
        assert not any(o.output_type == "error" for c in cells for o in c.outputs)
