"""The contract every check keeps, found by name so a new chapter's checks are held to it too: each
``check_*`` of each ``chNN`` module is guarded, stops a runaway loop with a bare ``except``,
states every identity of its text on every case, and says the same thing every time."""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import time

import pytest
import torch

import attncircuits.course.exercises as ex
from attncircuits.course.exercises import Case, Identity, _core, run_check
from learner_copy import learner_copy

MODULES = sorted(m.name for m in pkgutil.iter_modules(ex.__path__) if m.name[:2] == "ch" and m.name[2:].isdigit())
CHECKS = [(m, n) for m in MODULES for n in importlib.import_module(f"{ex.__name__}.{m}").__all__
          if n.startswith("check_")]


def _stubborn(*args, **kwargs):
    while True:
        try:
            time.sleep(0.05)
        except:  # noqa: E722 - the learner's bare except must not keep the loop alive
            pass


@pytest.mark.parametrize("module,name", CHECKS)
def test_every_check_stops_a_runaway_loop_with_a_bare_except(module, name, capsys, monkeypatch):
    monkeypatch.setattr(_core.run_check, "__kwdefaults__", {**_core.run_check.__kwdefaults__, "time_limit": 0.5})
    monkeypatch.setattr(_core, "MIN_CALL_LIMIT", 0.3)
    check = getattr(importlib.import_module(f"{ex.__name__}.{module}"), name)
    t = time.perf_counter()
    assert check(_stubborn) is False
    out = capsys.readouterr().out
    assert out.startswith("✗") and "too slow" in out, out
    assert time.perf_counter() - t < 45, f"{name} held a runaway loop {time.perf_counter() - t:.0f} s"


def test_generated_cases_are_the_same_every_time(capsys):
    from attncircuits.course.exercises import ch10

    # loss_bump written again: the check withholds the package's own
    bump = learner_copy(ch10.loss_bump)
    wrong = lambda v: 0.0 if len(v) == 3 else bump(v)  # noqa: E731
    outs = []
    for _ in range(2):
        ch10.check_loss_bump(wrong)
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "generated case" in outs[0], outs


def test_a_changed_input_a_wrong_type_and_an_identity_are_the_machinerys():
    ref = lambda x: float(x.sum())  # noqa: E731
    cases = [Case("three numbers", (torch.tensor([1.0, 2.0, 3.0]),))]
    say = []

    for fn, words in ((lambda x: float(x.mul_(1).add_(1).sum() - 3), "changed `x` in place"),
                      (lambda x: x.sum(), "returns a 0-d tensor; the exercise asks for a float"),
                      (lambda x: int(x.sum()), "returns an int")):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert run_check(fn, cases, ref, name="s", returns=float) is False
        say.append(buf.getvalue())
        assert words in " ".join(buf.getvalue().split()), buf.getvalue()
    gen = run_check(lambda x: float(x.sum()), cases, ref, name="g", returns=float,
                    generate=lambda d: (d.randn(d.int(1, 4)),), identities=[Identity("finite", lambda x: True)])
    cases_run = _core.CASES_RUN["test_exercise_contract.test_a_changed_input_a_wrong_type_and_an_identity_are_the_machinerys"]
    assert gen is True and len(cases_run[0]) == 1 + _core.N_GENERATED


def test_the_stated_identities_can_fail():
    from attncircuits.course.exercises import _draws

    uniform = torch.full((1, 1, 3, 3), 1 / 3)  # attends to later keys
    causal = torch.ones(3, 3).tril() / torch.arange(1, 4)[:, None]
    assert not _draws.causal_rows(uniform) and _draws.causal_rows(causal[None, None])
    tokens = torch.tensor([[0, 5, 6, 5, 6]])
    assert _draws.copies(tokens, 2) and not _draws.copies(tokens, 3)
    assert not _draws.copies(torch.tensor([[0, 5, 6, 5, 7]]), 2)


def _stubs() -> dict[str, list[str]]:
    """``"ch01.check_next_token_loss" -> ["logits", "tokens"]``: the parameters of the stub each
    check is called with in the solved notebooks (``check_...(stub)``)."""
    import ast
    import json
    import re
    from pathlib import Path

    from attncircuits.course.exercises.make_learner import chapters

    out = {}
    for path in chapters(Path(__file__).resolve().parents[1]):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        defs = {n.name: [a.arg for a in n.args.posonlyargs + n.args.args]
                for c in cells if "solution" in c["metadata"].get("tags", [])
                for n in ast.parse("".join(c["source"])).body if isinstance(n, ast.FunctionDef)}
        for c in cells:
            for check, fn in re.findall(r"\b(check_\w+)\((\w+)", "".join(c["source"])):
                if fn in defs:
                    out[f"ch{path.stem[:2]}.{check}"] = defs[fn]
    return out


def test_every_check_names_the_inputs_as_its_stub_does():
    """Messages call an input by the learner's own parameter name, else by the name in the call its
    check's docstring opens with: those must be the stub's, in its order."""
    from attncircuits.course.exercises._contract import text_names

    stubs = _stubs()
    assert {f"{m}.{n}" for m, n in CHECKS} <= set(stubs), "a check not called on a stub in its notebook"
    bad = []
    for module, name in CHECKS:
        stub = stubs[f"{module}.{name}"]
        text = text_names(getattr(importlib.import_module(f"{ex.__name__}.{module}"), name).__doc__)
        if text != stub[: len(text)] or (stub and not text):
            bad.append(f"{module}.{name}: the docstring says {text}, the stub {stub}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name,fn,words", [
    ("check_head_output", lambda *a: a[0].mul_(2), "changed `resid` in place"),
    ("check_next_token_loss", lambda *a: float(a[0].sub_(1).sum()), "changed `logits` in place"),
    ("check_model_logits", lambda *a: a[0].W_U.mul_(2), "changed `model` in place"),
    ("check_model_logits", lambda m, t: m.W_U.mul_(2), "changed `m` in place"),  # the learner's own names first
    ("check_attention_pattern", lambda *a: a[1].mul_(2) * 0 + 1, "changed `k` in place"),
])
def test_chapter_1_messages_use_the_stubs_names(name, fn, words, capsys):
    from attncircuits.course.exercises import ch01

    assert getattr(ch01, name)(fn) is False
    out = " ".join(capsys.readouterr().out.split())
    assert words in out, out


def test_a_generated_case_reads_by_the_stubs_names(capsys):
    from attncircuits.course.exercises import ch01

    def next_token_loss(logits, tokens):
        right = -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).mean()
        return right * (1.5 if logits.shape[1] == 3 else 1)  # wrong at 3 positions only

    assert ch01.check_next_token_loss(next_token_loss) is False
    out = " ".join(capsys.readouterr().out.split())
    assert "(logits: a 1 x 3 x 7 tensor, tokens: [[" in out and "lg" not in out, out
