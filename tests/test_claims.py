"""A claim asserts on the shipped models and, on another set, says in one line that it did not hold
and lets the chapter run on; the summary counts both."""

import json

import numpy as np
import pytest
import torch

from attncircuits.checkpoints.modelset import ENV
from attncircuits.course import claims


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(claims.LOG_ENV, raising=False)
    claims.reset()
    yield
    claims.reset()


def test_on_the_shipped_models_a_claim_that_fails_is_an_assertion(capsys):
    assert claims.claim("a previous-token head", torch.tensor(0.8) > 0.5, 0.8) is True
    with pytest.raises(AssertionError, match=r"^claim not held: three induction heads \(measured: \[0.9123, 0.2\]\)$"):
        claims.claim("three induction heads", False, torch.tensor([0.91234, 0.2]))
    assert [c.held for c in claims.results()] == [True, False]  # recorded before raising
    assert capsys.readouterr().out == ""


def test_on_another_set_a_claim_that_fails_prints_one_line_and_the_chapter_runs_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV, str(tmp_path / "seed-1"))
    assert claims.claim("head 0.2 is the previous-token head", np.bool_(False), {"head": "0.1", "score": 0.8277}) is False
    assert claims.claim("the second copy is easier", np.float64(0.7) < 8.6, (8.6, 0.7)) is True
    out = capsys.readouterr().out
    assert out == ("claim not held: head 0.2 is the previous-token head (measured: {head: 0.1,\n"
                   "    score: 0.8277})\n")  # folded to the book's 79 columns
    text = claims.summary()
    assert text.splitlines() == [
        f"1 of 2 claims held on the models in {tmp_path / 'seed-1'}",
        "  not held: head 0.2 is the previous-token head (measured: {head: 0.1, score:",
        "      0.8277})",
    ]
    assert max(len(line) for line in text.splitlines()[1:]) <= claims.WIDTH
    assert capsys.readouterr().out == text + "\n"


def test_the_summary_on_the_shipped_models_and_after_reset(capsys):
    claims.claim("one", True)
    assert claims.summary() == "1 of 1 claims held on the shipped models"
    claims.reset()
    assert claims.summary() == "0 of 0 claims held on the shipped models" and claims.results() == []


def test_claims_are_logged_as_json_lines_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv(claims.LOG_ENV, str(log))
    monkeypatch.setenv(ENV, str(tmp_path))
    claims.claim("held", True, 1.0)
    claims.claim("not held", False, 2.5)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["text"], r["held"], r["measured"], r["models"]) for r in rows] == [
        ("held", True, "1", str(tmp_path)), ("not held", False, "2.5", str(tmp_path))]


@pytest.mark.parametrize("ok, why", [
    (None, "comparison's result"), ("yes", "comparison's result"), (1, "comparison's result"),
    (float("nan"), "comparison's result"), (torch.tensor([True, False]), "one truth value, got 2"),
    (np.array([True, True]), "reduce it with .all()"), (torch.tensor(0.5), "comparison's result"),
])
def test_a_claim_that_cannot_be_true_or_false_is_refused(ok, why):
    with pytest.raises(TypeError, match=why):
        claims.claim("something", ok)
    assert claims.results() == []


@pytest.mark.parametrize("text", ["", "   ", None, 3])
def test_a_claim_must_say_what_it_claims(text):
    with pytest.raises(TypeError, match="text must say what is claimed"):
        claims.claim(text, True)
