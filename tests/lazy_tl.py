"""TransformerLens for a test module, imported when one of its tests first reads it (about 3 s), not
when pytest collects the module: every pytest worker collects every file, and only one runs them.
A module whose tests need it skips, in one line naming the install, where it is not installed."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

REASON = "TransformerLens is not installed: `pip install -e '.[tl]'` (make test installs it)"


class _TransformerLens:
    def __getattr__(self, name):
        if name.startswith("_"):  # pytest's collection asks every module-level object for its marks
            raise AttributeError(name)
        return getattr(importlib.import_module("transformer_lens"), name)


def transformer_lens() -> _TransformerLens:
    """Call at a test module's top level: ``tl = transformer_lens()``; ``tl.X`` is ``transformer_lens.X``."""
    if importlib.util.find_spec("transformer_lens") is None:  # found, not imported
        pytest.skip(REASON, allow_module_level=True)
    return _TransformerLens()
