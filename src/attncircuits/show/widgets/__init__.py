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

:func:`attention_view` is the other kind: one HTML output with its own few lines of JavaScript and
the patterns inside it, so hovering a token works in a notebook and in the built book alike.

Modules: :mod:`~.explorer` (the generic :class:`Explorer`), :mod:`~.static` (the precomputed
states' HTML), :mod:`~.chapters` (the chapters' explorers) and :mod:`~.attention` (the attention
view). Every name is re-exported here.
"""

from attncircuits.show.widgets.attention import attention_view
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
    "attention_view",
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
