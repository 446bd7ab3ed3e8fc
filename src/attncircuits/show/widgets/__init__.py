"""Explorers: a drawing function and its controls, shown live in a notebook and as precomputed
states in the built book, so every control a reader sees does something.

The pattern, used by every chapter::

    def draw(layer, head):                  # returns a matplotlib Figure (or any displayable,
        return attention_heatmap(...)       # e.g. plotting.tokens_html(...))

    explorer(draw, {"layer": [0, 1], "head": range(8)})

Controls are plain data, so a chapter states them once whether or not ipywidgets is installed:
a list (or ``(label, value)`` pairs) becomes a dropdown, a ``range`` an integer slider, a bool a
checkbox. The first option (the range's start) is the first state unless ``initial`` says otherwise.

With a kernel and ipywidgets, the controls appear above one figure output that every change
redraws in place. Without them, or with the environment variable ``ATTNCIRCUITS_STATIC=1`` (set it
when building the book), :func:`explorer` draws the states in advance (up to a dozen options per
control) and shows them with buttons that switch between them in plain HTML and CSS: no kernel, no
script, nothing fetched.

Modules: :mod:`~.explorer` (the generic :class:`Explorer`), :mod:`~.static` (the precomputed
states' HTML) and :mod:`~.chapters` (the chapters' explorers). Every name is re-exported here.
"""

from attncircuits.show.widgets.chapters import (
    NextTokenExplorer,
    head_explorer,
    next_token_explorer,
    snapshot_explorer,
    snapshot_steps_control,
)
from attncircuits.show.widgets.explorer import STATIC_ENV, Explorer, displayable, explorer, interactive_available

__all__ = [
    "STATIC_ENV",
    "Explorer",
    "NextTokenExplorer",
    "displayable",
    "explorer",
    "head_explorer",
    "interactive_available",
    "next_token_explorer",
    "snapshot_explorer",
    "snapshot_steps_control",
]
