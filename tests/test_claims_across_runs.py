"""The reproduces page's table of claims across runs: every claim a replicate recorded as not held
is mapped, in replicates/claims-now.json, to a claim its chapter states now; a claim marked as the
shipped run's says so in its text, and a restated one does not."""

import json
import re
from pathlib import Path

import pytest

from attncircuits.course.claims import SHIPPED_PREFIX, counts_across_runs, not_held_across_runs, split_recorded

ROOT = Path(__file__).resolve().parents[1]
NOW = json.loads((ROOT / "replicates" / "claims-now.json").read_text(encoding="utf-8"))["claims"]
RECORDED = {
    p.parent.name: json.loads(p.read_text(encoding="utf-8"))["chapters"]
    for p in sorted((ROOT / "replicates").glob("seed-*/results.json"))
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
        assert kind in ("shipped", "restated")
        assert now.startswith(SHIPPED_PREFIX) == (kind == "shipped"), (chapter, now, kind)


def test_split_and_counts():
    assert split_recorded("in the shipped run: a > b (measured: (1, 2))") == ("a > b", "(1, 2)")
    with pytest.raises(ValueError):
        split_recorded("no value here")
    counts = counts_across_runs({"a": {"ch": {"claims": 3, "claims_held": 2}}, "b": {}})
    assert counts == [("ch", "2 of 3", "-")]
