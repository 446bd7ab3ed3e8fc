"""The table of answers to every exercise check (tests/exercise_table.py): each wrong answer gets a
✗ whose message names the mistake or its symptom in the words the table gives; each right answer
written another way gets a ✓; no check raises."""

from __future__ import annotations

import pytest
from exercise_table import ROWS, outcome

CHECKS = sorted({r.check for r in ROWS})


def test_the_table_covers_every_check_with_five_wrong_and_two_right_answers():
    from attncircuits.course.exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11, ch12, ch13, ch14

    modules = (ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11, ch12, ch13, ch14)
    names = {f"{m.__name__.rsplit('.', 1)[1]}.{n}" for m in modules for n in m.__all__ if n.startswith("check_")}
    assert set(CHECKS) == names and len(names) == 58
    for check in CHECKS:
        rows = [r for r in ROWS if r.check == check]
        assert sum(r.expect != "pass" for r in rows) >= 5, check
        assert sum(r.expect == "pass" for r in rows) >= 2, check
    kinds = {r.label.split()[0] for r in ROWS}
    assert {"zeros", "NaN", "negated", "another", "transposed", "shifted"} <= kinds


@pytest.mark.parametrize("check", CHECKS)
def test_every_answer_gets_its_message(check):
    bad = []
    for row in (r for r in ROWS if r.check == check):
        cls, text = outcome(row)
        want = "ok" if row.expect == "pass" else row.expect
        if cls != want:
            bad.append(f"{row.label}: {cls}: {text}")
    assert not bad, "\n".join(bad)
