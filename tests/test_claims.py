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


def _held_on(count, folder) -> list[str]:
    """The summary's first line(s) on the set in ``folder``: the folder whole where the line fits."""
    line = f"{count} claims held on the models in {folder}"
    if len(line) <= claims.WIDTH:
        return [line]
    return [f"{count} claims held on the models in", "  " + claims.fit_path(str(folder), claims.WIDTH - 2)]


def test_on_another_set_a_claim_that_fails_prints_one_line_and_the_chapter_runs_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV, str(tmp_path / "seed-1"))
    assert claims.claim("head 0.2 is the previous-token head", np.bool_(False), {"head": "0.1", "score": 0.8277}) is False
    assert claims.claim("the second copy is easier", np.float64(0.7) < 8.6, (8.6, 0.7)) is True
    out = capsys.readouterr().out
    assert out == ("claim not held: head 0.2 is the previous-token head (measured: {head: 0.1,\n"
                   "    score: 0.8277})\n")  # folded to the book's 79 columns
    text = claims.summary()
    assert text.splitlines() == _held_on("1 of 2", tmp_path / "seed-1") + [
        "  not held: head 0.2 is the previous-token head (measured: {head: 0.1, score:",
        "      0.8277})",
    ]
    assert max(len(line) for line in text.splitlines()) <= claims.WIDTH
    assert capsys.readouterr().out == text + "\n"


@pytest.mark.parametrize("folder", ["/sets/code", "/work/main/benchmarks/.mine-kinds/sets/code",
                                    "/" + "/".join(["a-rather-long-folder-name"] * 6) + "/seed-1",
                                    "/" + "x" * 120])
def test_the_summary_fits_the_column_whatever_the_folder(folder, monkeypatch):
    monkeypatch.setenv(ENV, folder)
    claims.claim("one", True)
    lines = claims.summary().splitlines()
    assert max(len(line) for line in lines) <= claims.WIDTH, lines
    shown = " ".join(lines)
    assert folder in shown or folder.endswith(shown.split("...")[1].lstrip("/")), lines


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


def test_a_claim_about_the_corpus_says_so_and_is_counted_apart(tmp_path, monkeypatch, capsys):
    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv(claims.LOG_ENV, str(log))
    with pytest.raises(AssertionError, match=r"^claim about the corpus not held: ·self is one token \(measured: 3\)$"):
        claims.claim("·self is one token", False, 3, about="corpus")  # on the shipped models: an assertion
    claims.reset()
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert claims.claim("·return is one token", False, [False], about="corpus") is False
    assert claims.claim("each layer helps", True, 0.1) is True
    assert claims.claim("an induction head", False, 0.2) is False
    assert capsys.readouterr().out == ("claim about the corpus not held: ·return is one token (measured: [False])\n"
                                       "claim not held: an induction head (measured: 0.2)\n")
    assert claims.summary().splitlines() == _held_on("1 of 2", tmp_path / "mine") + [
        "  not held: an induction head (measured: 0.2)",
        "and 0 of 1 claims about the corpus and tokenizer",
        "  not held: ·return is one token (measured: [False])",
    ]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["about"] for r in rows] == ["corpus", "corpus", "recipe", "recipe"]
    with pytest.raises(ValueError, match=r"about must be one of \('recipe', 'corpus'\), got 'text'"):
        claims.claim("x", True, about="text")


def test_the_models_notice_says_what_train_mine_found_not_trained_enough(tmp_path, monkeypatch, capsys):
    assert claims.models_notice() == "" and capsys.readouterr().out == ""  # the shipped models
    s = tmp_path / "a-set-with-a-long-name"
    s.mkdir()
    monkeypatch.setenv(ENV, str(s))
    assert claims.models_notice() == ""  # no set.json (a replicate made by hand)
    (s / "set.json").write_text(json.dumps({"kind": "own corpus", "failed": []}))
    assert claims.models_notice() == ""  # every check held
    command = f"make train-mine CORPUS='/data/books/**/*.txt' OUT={s} STEPS=10000"
    (s / "set.json").write_text(json.dumps({"failed": [
        "the 2-layer model beats the 1-layer one by over 0.05 nats (measured: 0.007)",
        "the 2-layer model's validation loss stopped falling (measured: 0.100)"], "train_further": command}))
    text = claims.models_notice()
    assert capsys.readouterr().out == text + "\n"
    lines = text.splitlines()
    assert lines[0].startswith("These models are not trained enough for what the chapters test")
    assert "beats the 1-layer one by over 0.05 nats (measured: 0.007)" in " ".join(line.strip() for line in lines)
    at = lines.index("Train further with:")
    shell = "\n".join(lines[at + 1 :])
    assert shell == claims.shell_lines(command) and shell.count(" \\\n") == len(lines) - at - 2 >= 1
    assert shell.replace(" \\\n    ", " ") == command  # what the shell reads
    # within the column, but for a word longer than it (here the test's long OUT path), never cut
    assert all(len(line) <= claims.WIDTH or len(line.removesuffix(" \\").split()) == 1 for line in lines)
    assert claims.shell_lines("make train-mine OUT=x STEPS=8") == "make train-mine OUT=x STEPS=8"
    (s / "set.json").write_text("{not json")
    assert claims.models_notice() == ""
