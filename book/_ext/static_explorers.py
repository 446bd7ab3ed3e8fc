"""Build the chapters' explorers in their static form: precomputed states behind plain HTML
buttons, which work in the built book with no kernel (see :mod:`attncircuits.show.widgets`).

The book's notebooks run in kernels that this build starts, and a kernel inherits the build's
environment, so setting :data:`attncircuits.show.widgets.STATIC_ENV` here is enough. A notebook run
anywhere else (Jupyter, Colab, nbval) keeps its live controls.
"""

from __future__ import annotations

import os

from sphinx.application import Sphinx

from attncircuits.show.widgets import STATIC_ENV


def setup(app: Sphinx) -> dict:
    os.environ[STATIC_ENV] = "1"
    return {"parallel_read_safe": True, "parallel_write_safe": True}
