"""The fuzz of the public analysis API (see ``fuzz_harness.py``): no call may end in a traceback
from torch, numpy or Python internals, and none may return a wrong answer silently.

Bounded and derandomized: a few examples per function, the same ones on every run, a few seconds
in all. ``python benchmarks/fuzz_report.py`` runs the same fuzz longer and prints the totals.
"""

from __future__ import annotations

import pytest
from fuzz_harness import run, targets

TARGETS = targets()
EXAMPLES = 6  # per function; the explorers (which draw a figure) take their own smaller number


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_no_deep_traceback_and_no_silent_wrong_answer(target):
    results = run(target, min(EXAMPLES, target.examples))
    bad = [f"{outcome}: {call} -> {detail}" for outcome, call, detail in results if outcome in ("deep", "silent", "refused")]
    assert not bad, "\n".join(bad)
