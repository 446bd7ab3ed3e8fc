"""Claims are tested after they are stated: the registry of when each claim was last worded
(replicates/claim-dates.json) follows the chapters, is computed from git's history, and a run counts
for a claim only when it was trained after the claim's wording and checked that wording."""

import json
import re
import subprocess

import pytest

from attncircuits.course import claim_dates as cd


def _notebook(*sources):
    return {"cells": [{"cell_type": "code", "source": s, "metadata": {}} for s in sources]}


def test_the_registry_holds_every_claim_the_chapters_state():
    """Fails when a claim was reworded (or added, or removed) without `make claim-dates`."""
    registry, now = cd.load(), cd.stated()
    assert sum(map(len, now.values())) > 100
    assert cd.problems(registry, now) == [], "run `make claim-dates` and commit replicates/claim-dates.json"
    for entries in registry.values():
        for e in entries:
            assert len(e["commit"]) == 40 and e["date"][:2] == "20", e


def test_a_wording_is_the_source_of_the_claim():
    nb = _notebook('%time x = 1\nclaim("a plain claim", True)\n'
                   'claims.claim(f"{n} heads ({defs.X}) over {v:.2f}", ok, v)\n',
                   'claim("one " "line",\n      ok)\nclaim(text, ok)\nclaim("a plain claim", ok)',
                   "this cell does not parse (")
    assert cd.wordings(nb) == ["a plain claim", "{n} heads ({defs.X}) over {v}", "one line", "{text}"]
    assert cd.problems({"ch": [{"claim": "old words", "hash": cd.wording_hash("old words")}]},
                       {"ch": ["new words"]}) == [
        "ch: 'new words' is not in the registry (a claim reworded or added)",
        "ch: the registry's 'old words' is stated by no chapter now"]


def test_a_recorded_claim_is_matched_to_its_wording():
    words = ["{n} heads ({defs.X}) over {v}", "{text}", "literal {{braces}} kept"]
    assert cd.matching("3 heads (prefix matching > 0.5) over 0.25", words) == words[0]
    assert cd.matching("literal {braces} kept", words) == words[2]
    assert cd.matching("anything at all", words) == "{text}"  # the least literal, only when nothing else
    assert cd.matching("nothing", words[:1]) is None


def _entry(date, after=False, commit="c" * 40):
    return {"claim": "a {x}", "hash": cd.wording_hash("a {x}"), "commit": commit, "date": date,
            **({"after": True} if after else {})}


def test_a_run_counts_only_when_trained_after_the_wording_by_date():
    e = _entry("2026-12-02T10:00:00+00:00")
    at = lambda d: {"commit": "d" * 40, "date": d, "clean": True}  # noqa: E731
    assert not cd.trained_after(e, None, repo=None)  # a run that recorded no commit counts for nothing
    assert not cd.trained_after(e, at("2026-12-02T09:59:59+00:00"), repo=None)
    assert cd.trained_after(e, at("2026-12-02T10:00:00+00:00"), repo=None)
    assert not cd.trained_after(_entry(e["date"], after=True), at(e["date"]), repo=None)
    records = {"old": {"chapters": {"ch": {"claims_checked": [{"text": "a 1", "held": True}]}}},
               "new": {"trained_at": at("2026-12-03T00:00:00+00:00"),
                       "chapters": {"ch": {"claims_checked": [{"text": "a 1", "held": True},
                                                              {"text": "a 2", "held": False}]}}},
               "new but not run": {"trained_at": at("2026-12-03T00:00:00+00:00"), "chapters": {}}}
    ((chapter, entry, runs, held),) = cd.tested_after(records, {"ch": [e]}, repo=None)
    assert (chapter, runs, held) == ("ch", ["new"], [])  # held only where every instance held


def test_a_run_counts_by_commit_order_in_a_checkout():
    head = cd.gitstate.commit_state(cd.REPO)
    if head is None:
        pytest.skip("not a git checkout")
    root = cd.gitstate.git(cd.REPO, "rev-list", "--max-parents=0", "HEAD").split()[0]
    first = {"commit": root, "date": "2000-01-01T00:00:00+00:00", "clean": True}
    e = _entry("1999-01-01T00:00:00+00:00", commit=head["commit"])
    assert not cd.trained_after(e, first, repo=cd.REPO)  # the first commit is not after HEAD, whatever its date
    assert cd.trained_after(e, head, repo=cd.REPO)
    assert not cd.trained_after({**e, "after": True}, head, repo=cd.REPO)


def _commit(repo, message):
    subprocess.run(["git", "-C", repo, "add", "-A"], check=True)
    subprocess.run(["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message],
                   check=True)
    return cd.gitstate.git(repo, "rev-parse", "HEAD")


def test_the_registry_dates_each_wording_by_its_last_change(tmp_path):
    if cd.gitstate.git(tmp_path, "--version") is None:
        pytest.skip("no git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    nb = tmp_path / "notebooks" / "01_x.ipynb"
    nb.parent.mkdir()
    nb.write_text(json.dumps(_notebook('claim("kept", ok)\nclaim("every run holds it", ok)')))
    one = _commit(tmp_path, "one")
    nb.write_text(json.dumps(_notebook('claim("kept", ok)\nclaim("three of five runs hold it", ok)')))
    two = _commit(tmp_path, "two")
    nb.write_text(json.dumps(_notebook('claim("kept", ok)\nclaim("three of five runs hold it", ok)\n'
                                       'claim("not committed yet", ok)')))
    path = tmp_path / "claim-dates.json"
    assert cd.update(repo=tmp_path, path=path) == ["01_x"]
    got = {e["claim"]: (e["commit"], e.get("after", False)) for e in cd.load(path)["01_x"]}
    assert got == {"kept": (one, False), "three of five runs hold it": (two, False), "not committed yet": (two, True)}
    assert cd.problems(cd.load(path), cd.stated(tmp_path)) == []
    _commit(tmp_path, "three")
    assert cd.update(repo=tmp_path, path=path) == ["01_x"]  # an entry worded "after" is dated again
    assert all("after" not in e for e in cd.load(path)["01_x"])
    assert cd.update(repo=tmp_path, path=path) == []


def test_a_run_keeps_the_commit_its_training_started_at(tmp_path, monkeypatch):
    from attncircuits.train import replicate

    states = iter([{"commit": "a" * 40, "date": "2026-12-05T00:00:00+00:00", "clean": True},
                   {"commit": "b" * 40, "date": "2026-12-06T00:00:00+00:00", "clean": True}])
    monkeypatch.setattr(replicate.gitstate, "commit_state", lambda repo: next(states))
    first = replicate.training_commit(tmp_path / "new", started=False)
    assert first["commit"] == "a" * 40
    assert replicate.training_commit(tmp_path / "new", started=False) == first  # resumed: the first commit
    (tmp_path / "old").mkdir()
    assert replicate.training_commit(tmp_path / "old", started=True) is None  # started before: unknown


def test_records_missing_read_as_none(tmp_path):
    """A pip install ships no replicates/: the reproduces page then says so instead of failing."""
    assert cd.records(tmp_path / "absent") == {}
    (tmp_path / "seed-7").mkdir()
    (tmp_path / "seed-7" / "results.json").write_text(json.dumps({"seed": 7, "chapters": {}}))
    (tmp_path / "family-seed-2").mkdir()
    (tmp_path / "family-seed-2" / "results.json").write_text(json.dumps({"seed": 2, "chapters": {}}))
    assert list(cd.records(tmp_path)) == ["seed 7", "family seed 2"]
    assert "pip install" in cd.RECORDS_MISSING and all(len(x) <= 79 for x in cd.RECORDS_MISSING.splitlines())


def test_by_chapter_counts_the_claims_tested_after():
    e1, e2 = _entry("2026-12-01T00:00:00+00:00"), {**_entry("2026-12-03T00:00:00+00:00"), "claim": "b"}
    rows = cd.by_chapter([("ch", e1, ["seed 5", "seed 6"], ["seed 5"]), ("ch", e2, ["seed 6"], ["seed 6"]),
                          ("other", e1, [], [])])
    assert rows == [("ch", 2, "2026-12-01 to 2026-12-03", "1 to 2", 2, 1), ("other", 1, "2026-12-01", "0", 0, 0)]


def test_a_restated_claim_says_when_and_whether_it_was_tested_since():
    e = {**_entry("2026-12-02T00:00:00+00:00", commit="abcdef1" + "0" * 33), "claim": "{n} of five runs"}
    now = {"ch": {"every run": ["three of five runs", "restated"], "x": ["in the shipped run: x", "shipped"],
                  "gone": ["a claim no chapter states", "restated"]}}
    assert cd.restated([("ch", e, [], [])], now) == [
        ("ch", "three of five runs", "2026-12-02, abcdef1", "not yet tested on a run trained after it"),
        ("ch", "a claim no chapter states", "-", "no chapter states it now")]
    assert cd.restated([("ch", e, ["seed 5", "seed 6"], ["seed 6"])], now)[0][3] == \
        "held on 1 of 2 runs trained after it"


def test_the_reproduces_page_reads_records_only_where_absence_is_handled():
    """Its Colab copy runs on a pip install, which ships no replicates/: the page reads the runs'
    records through claim_dates.records() (empty there), never through the package's parents."""
    cells = json.loads((cd.REPO / "book" / "reproduces.ipynb").read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert not re.search(r"\bREPO\b", code) and "read_text" not in code
    assert "claim_dates.records()" in code and "RECORDS_MISSING" in code
