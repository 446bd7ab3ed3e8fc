"""The package's own answer to an exercise, withheld while the learner's function runs: a check
names the functions (or ``(class, method)`` pairs) that are the exercise's answer, and a learner's
function that calls one is told so, by name, instead of passing on the package's work."""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Callable


class Withheld(BaseException):
    """Raised inside the learner's call when it calls the package's own answer to the exercise (a
    BaseException, so that a learner's ``except Exception`` does not hide it)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _held(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None


def _set(owner, attr: str, value) -> None:
    if isinstance(owner, dict):
        owner[attr] = value
    else:
        setattr(owner, attr, value)


@contextlib.contextmanager
def withhold(answers, fn: Callable):
    """While the learner's function runs, each of ``answers`` (the package's functions that answer
    the exercise, or ``(class, method or property name)`` pairs) raises :class:`Withheld` wherever a learner
    reaches it: as an attribute of any of the package's modules, a name in the learner's own
    globals (``from ... import it``), or the class's method."""
    own = inspect.unwrap(fn)
    named = [(f"{a[0].__name__}.{a[1]}", vars(a[0])[a[1]]) if isinstance(a, tuple) else (a.__name__, a) for a in answers]
    for label, target in named:  # the package's function passed as the learner's (``copy_ov = hb.copy_ov``)
        if any(x is target or x is inspect.unwrap(target) for x in (fn, own, getattr(own, "__func__", own))):
            raise Withheld(label)  # a decorated answer (torch.no_grad) unwraps to its inner function
    spaces = [vars(m) for n, m in list(sys.modules.items()) if n.split(".")[0] == "attncircuits" and m is not None]
    spaces.append(getattr(own, "__globals__", {}))  # ``from ... import it`` in the notebook
    swaps = []
    for answer, (label, target) in zip(answers, named):
        if isinstance(answer, tuple):
            places = [(answer[0], answer[1], target)]
        else:
            places = [(space, a, v) for space in spaces for a, v in list(space.items()) if v is target]
            places += [(cell, "cell_contents", target) for cell in getattr(own, "__closure__", None) or ()
                       if _held(cell) is target]

        def blocked(*args, _label=label, **kwargs):
            raise Withheld(_label)

        for owner, attr, value in places:  # a property (``mystery.ground_truth``) raises when read
            _set(owner, attr, property(blocked) if isinstance(value, property) else blocked)
            swaps.append((owner, attr, value))
    try:
        yield
    finally:
        for owner, attr, value in reversed(swaps):
            _set(owner, attr, value)
