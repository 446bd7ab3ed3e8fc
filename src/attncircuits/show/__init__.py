"""Draws what it is given and computes nothing: ``plotting/`` (figures, token-highlight HTML) and
``widgets/`` (the explorers, with their static no-kernel form, and the attention view, whose own
small script works in a notebook and in the built book alike)."""
