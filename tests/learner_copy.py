"""The package's function written again, as a learner would: checks withhold the package's own
answer to an exercise (the function object, wherever it is reached), not the same code."""

from __future__ import annotations

import inspect
import types


def learner_copy(f):
    """A new function with ``f``'s code (a decorated ``f``: its own code, unwrapped)."""
    f = inspect.unwrap(f)
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    return g
