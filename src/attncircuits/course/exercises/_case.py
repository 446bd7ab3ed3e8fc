"""The ground floor of the check machinery: what a check is made of (a :class:`Case` the learner's
function runs on, a :class:`Diagnosis` of a typical mistake, an :class:`Identity` the text states)
and :class:`_Stop`, which ends a check with its message. It imports nothing of the machinery, so
the modules above read bottom-up: ``_case``, ``_withhold``, ``_contract``, ``_compare``, ``_run``,
``_judge``, then ``_core`` (see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Case", "Diagnosis", "Identity"]


class _Stop(Exception):
    """Ends a check early with a message (internal)."""

    def __init__(self, message: str, ok: bool | None = False):
        super().__init__(message)
        self.message, self.ok = message, ok


@dataclass
class Case:
    """One input the learner's function is run on; ``label`` names it in messages."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    kind: str = "shipped"  # "shipped", "random", "hand-built" or "generated"
    expected: Any = None  # the reference's output; computed by run_check when None
    others: Callable[[], list[tuple[str, tuple]]] | None = None  # (label, args) of neighbouring inputs
    grad: bool = False  # run the learner's call with autograd on (to check its gradient)


@dataclass
class Diagnosis:
    """A typical mistake: ``wrong(expected, case)`` is what it produces, ``message`` names it.

    Where a mistake is better recognised by a property of the learner's output than by its exact
    value (e.g. attention on future keys, whatever else is wrong), give ``applies(got, expected,
    case) -> bool`` instead of ``wrong``."""

    message: str
    wrong: Callable[[Any, Case], Any] | None = None
    applies: Callable[[Any, Any, Case], bool] | None = None


@dataclass
class Identity:
    """A fact the exercise's text states about its inputs (``holds(*args)``: e.g. the components
    sum to ``resid``); every case of the check, fixed or generated, must satisfy it (a test
    asserts so for every check)."""

    text: str
    holds: Callable[..., bool]
