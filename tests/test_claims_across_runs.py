"""The reproduces page's table of claims across runs: every claim a replicate recorded as not held
is mapped, in replicates/claims-now.json, to a claim its chapter states now; a claim marked as the
shipped run's says so in its text, and a restated one does not."""

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from attncircuits.course.claims import (SHIPPED_PREFIX, counts_across_runs, not_held_across_runs, not_held_table,
                                       readable_value, split_recorded)

ROOT = Path(__file__).resolve().parents[1]
NOW = json.loads((ROOT / "replicates" / "claims-now.json").read_text(encoding="utf-8"))["claims"]
RECORDED = {
    p.parent.name: json.loads(p.read_text(encoding="utf-8"))["chapters"]
    for p in sorted((ROOT / "replicates").glob("*seed-*/results.json"))  # and family-seed-n
}


def _claims_of(chapter: str) -> set[str]:
    """The claim texts a chapter states (an f-string's ``{name}`` as the 2-layer model's name)."""
    path = ROOT / "book" / "reproduces.ipynb" if chapter == "reproduces" else ROOT / "notebooks" / f"{chapter}.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    texts = set()
    for m in re.finditer(r'claim\(\s*f?((?:"[^"]*"\s*)+),', code):
        text = "".join(re.findall(r'"([^"]*)"', m.group(1)))
        texts.add(text.replace("{name}", "attn-only-2l"))
    return texts


def test_every_recorded_failure_is_mapped():
    rows = not_held_across_runs(RECORDED, NOW)  # raises KeyError naming an unmapped wording
    assert rows and all(len(r) == 3 + len(RECORDED) for r in rows)


@pytest.mark.parametrize("chapter", sorted(NOW))
def test_each_mapped_claim_is_stated_by_its_chapter(chapter):
    stated = _claims_of(chapter)
    for recorded, (now, kind) in NOW[chapter].items():
        assert now in stated, f"{chapter}: {now!r} (for {recorded!r}) is not a claim of the chapter"
        assert kind in ("shipped", "restated", "stands")
        assert now.startswith(SHIPPED_PREFIX) == (kind == "shipped"), (chapter, now, kind)
        assert kind != "stands" or now == recorded, (chapter, now, recorded)  # kept in its words


def test_split_and_counts():
    assert split_recorded("in the shipped run: a > b (measured: (1, 2))") == ("a > b", "(1, 2)")
    with pytest.raises(ValueError):
        split_recorded("no value here")
    counts = counts_across_runs({"a": {"ch": {"claims": 3, "claims_held": 2}}, "b": {}})
    assert counts == [("ch", "2 of 3", "-")]


@pytest.mark.parametrize("recorded, text", [
    ("[0.2222, 0.4444, 0.05556, 0.6111]", "0.222, 0.444, 0.0556, 0.611"),
    ("([], [2])", "none; 2"),
    ("{0.2: 0.5379, 0.0: 0.751}", "0.2: 0.538, 0.0: 0.751"),
    ("(30.16, k)", "30.2, k"),
    ("{K writer: 0.2, previous-token head: 0.1}", "K writer 0.2, previous-token head 0.1"),
    ("{0.3: [1.1, 1.2], 0.0: [1.1]}", "0.3: 1.1, 1.2; 0.0: 1.1"),
    ("([1.0, 1.1], [1.0, 1.1, 1.2])", "1.0, 1.1; 1.0, 1.1, 1.2"),
    ("(1750, 4000, 1250)", "1750, 4000, 1250"),  # ints as they are
    ("[1.0, 1.1, 1.2]", "1.0, 1.1, 1.2"),  # head names: no more digits than written
    ("{1.2: 1.896}", "1.2: 1.90"),
    ("0.7875", "0.788"),
    ("-0.3929", "-0.393"),
    ("0.02271", "0.0227"),
    ("(0.8125, 0)", "0.812, 0"),
    ("True", "yes"),
    ("[]", "none"),
    ("nan", "nan"),
])
def test_a_recorded_value_reads_as_text(recorded, text):
    assert readable_value(recorded) == text


def test_every_committed_value_reads_as_text():
    for row in not_held_table(RECORDED, NOW):
        assert not re.search(r"[\[\]{}()'\"]", row[3]), row
        floats = re.findall(r"\d+\.\d+", row[3])
        assert all(len(Decimal(x).as_tuple().digits) <= 3 for x in floats), row  # 3 significant digits


def test_the_table_has_a_row_per_run_not_held():
    recorded = {"seed 1": {"ch": {"claims_not_held": ["a (measured: [0.12345, 2])", "b (measured: 3)"]}},
                "seed 2": {"ch": {"claims_not_held": ["a (measured: (1, 2.5))"]}},
                "seed 3": {"ch": {}}}
    recorded["seed 3"]["ch"]["claims_not_held"] = ["c (measured: {x: 0.5})", "d (measured: 1)"]
    now = {"ch": {"a": ["in the shipped run: a", "shipped"], "b": ["b now", "restated"], "c": ["c", "restated"],
                  "d": ["d", "stands"]}}
    assert not_held_table(recorded, now) == [
        ("ch", "b now (restated; the runs recorded it as: b)", "seed 1", "3"),
        ("ch", "c (restated with the claim before it, in the same words)", "seed 3", "x 0.5"),
        ("ch", "d (as stated, not held on a run trained after its wording)", "seed 3", "1"),
        ("ch", "in the shipped run: a", "seed 1", "0.123, 2"),
        ("", "", "seed 2", "1, 2.5"),
    ]
