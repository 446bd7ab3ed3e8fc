"""Draws what it is given and computes nothing: ``plotting/`` (figures, token-highlight HTML) and
``widgets/`` (the explorers, with their static no-kernel form)."""
