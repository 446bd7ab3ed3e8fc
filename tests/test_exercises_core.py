"""The shared check machinery: every kind of learner output gives one line and no exception."""

import math
import threading
import time

import pytest
import torch

from attncircuits.course.exercises import Case, Diagnosis, random_model, run_check


def scaled_scores(x: torch.Tensor, d_head: int) -> torch.Tensor:
    """A stand-in reference: x @ x.T / sqrt(d_head)."""
    return x @ x.T / math.sqrt(d_head)


CASES = [
    Case("shipped-like", (torch.arange(12.0).view(3, 4) / 7, 4), kind="shipped"),
    Case("random", (torch.randn(5, 4, generator=torch.Generator().manual_seed(0)), 16), kind="random"),
]
MISSING_SCALE = Diagnosis("scores are not divided by sqrt(d_head)", lambda ref, case: ref * math.sqrt(case.args[1]))


def check(fn, **kwargs):
    return run_check(fn, CASES, scaled_scores, [MISSING_SCALE], name="scores", **kwargs)


def one_line(capsys) -> str:
    out = capsys.readouterr().out
    assert out.endswith("\n")
    lines = out.rstrip("\n").splitlines()
    assert all(len(line) <= 79 for line in lines), lines
    assert all(line.startswith("  ") for line in lines[1:]), "continuation lines are indented"
    return " ".join(line.strip() for line in lines)


def test_correct_answer_passes(capsys):
    assert check(lambda x, d: x @ x.T / d**0.5) is True
    assert one_line(capsys) == "✓ scores: correct on 2 cases"


def test_the_success_line_has_one_form_whatever_the_names_length(capsys):
    ref = lambda x: x * 2  # noqa: E731
    cases = [Case("one", (torch.ones(3),)), Case("two", (torch.ones(2),), kind="random")]
    lines = []
    for name in ("f", "a_function_with_a_rather_long_name_indeed"):
        assert run_check(ref, cases, ref, name=name, generate=lambda d: (d.randn(d.int(1, 4)),)) is True
        lines.append(one_line(capsys))
    assert [line.split(": ", 1)[1] for line in lines] == ["correct on 26 cases (2 fixed, 24 generated)"] * 2, lines


@pytest.mark.parametrize(
    "body",
    ["raise NotImplementedError('write this')", "...", "pass", "'''docstring only'''\n    ...", "return ..."],
)
def test_unattempted_stub(capsys, body):
    namespace = {}
    exec(f"def stub(x, d):\n    {body}\n", namespace)  # a function whose source inspect cannot read
    assert check(namespace["stub"]) is False
    out = one_line(capsys)
    assert out.startswith("○ scores: not attempted yet"), out


def stub_with_docstring(x, d):
    """Return the scaled scores."""
    ...


def forgot_return(x, d):
    x @ x.T


def test_untouched_stub_from_source_and_forgotten_return(capsys):
    assert check(stub_with_docstring) is False
    assert "not attempted yet" in one_line(capsys)
    assert check(forgot_return) is False
    assert one_line(capsys) == "✗ scores: on shipped-like: the output is None: did you forget to `return` the result?"


def test_named_diagnosis(capsys):
    assert check(lambda x, d: x @ x.T) is False
    assert one_line(capsys) == "✗ scores: on shipped-like: scores are not divided by sqrt(d_head)"


def test_a_diagnosis_is_given_only_where_the_cases_tell_it_from_another(capsys):
    """Two mistakes whose answers agree on every case: naming either would not tell the learner
    which was made, so the message says what was measured; a property of the output that fits
    (``applies``) gives way to a mistake's recomputed answer, and is said where none fits."""
    twin = Diagnosis("the scores are summed, not divided", lambda ref, case: ref * math.sqrt(case.args[1]))
    assert run_check(lambda x, d: x @ x.T, CASES, scaled_scores, [MISSING_SCALE, twin], name="scores") is False
    said = one_line(capsys)
    assert "sqrt(d_head)" not in said and "summed" not in said and "times" in said, said
    big = Diagnosis("some scores are above 1", applies=lambda got, e, c: bool((got > 1).any()))
    assert run_check(lambda x, d: x @ x.T, CASES, scaled_scores, [big, MISSING_SCALE], name="scores") is False
    assert one_line(capsys) == "✗ scores: on shipped-like: scores are not divided by sqrt(d_head)"
    assert run_check(lambda x, d: 7 + x @ x.T, CASES, scaled_scores, [big, MISSING_SCALE], name="scores") is False
    assert one_line(capsys) == "✗ scores: on shipped-like: some scores are above 1"


def test_generic_sign_transpose_and_factor(capsys):
    assert check(lambda x, d: -(x @ x.T) / d**0.5) is False
    assert "wrong sign" in one_line(capsys)
    assert check(lambda x, d: 3 * x @ x.T / d**0.5) is False
    assert "your values are the answer times 3" in one_line(capsys)
    tri = [Case("lower", (torch.tril(torch.ones(3, 3)),))]
    assert run_check(lambda m: m.T, tri, lambda m: m, name="t") is False
    assert "transposed" in one_line(capsys)


def test_right_on_shipped_wrong_on_random(capsys):
    assert check(lambda x, d: x @ x.T / 2) is False  # hard-codes d_head = 4
    out = one_line(capsys)
    assert out.startswith("✗ scores: right on the shipped case but wrong on random:"), out


def test_wrong_shape_and_transposed_shape(capsys):
    assert check(lambda x, d: (x @ x.T / d**0.5)[None]) is False
    assert "shape [1, 3, 3], expected [3, 3]: an axis of size 1 is missing or extra" in one_line(capsys)
    rect = [Case("rect", (torch.ones(2, 3),))]
    assert run_check(lambda m: m.T, rect, lambda m: m, name="t") is False
    assert "shape [3, 2], expected [2, 3]: transposed" in one_line(capsys)


def test_bad_outputs_one_line_each(capsys):
    def raises(x, d):
        y = x @ x  # not square: matmul fails on 3x4 @ 3x4
        return y

    assert check(raises) is False
    out = one_line(capsys)
    assert out.startswith("✗ scores: raised RuntimeError at line 2 of raises (`y = x @ x"), out
    assert "Traceback" not in out
    assert check(lambda x, d: (x @ x.T / d**0.5).tolist()) is False
    assert "should be a torch.Tensor of shape [3, 3], got a list of 3" in one_line(capsys)
    assert check(lambda x, d: (x @ x.T / d**0.5).numpy()) is True  # the numbers asked, as numpy: right
    assert one_line(capsys).startswith("✓")
    assert check(lambda x, d: (x @ x.T / d**0.5).numpy().astype(object)) is False  # no numbers numpy can hold
    assert "should be a torch.Tensor of shape [3, 3], got a numpy.ndarray" in one_line(capsys)
    assert check(lambda x, d: (x @ x.T / d**0.5) * (x[0, 0] / x[0, 0])) is False  # 0 / 0 on the first case
    assert "NaN in" in one_line(capsys)
    assert check(lambda x, d: (x @ x.T / d**0.5).double()) is True  # float64 where float32 is asked: right
    assert one_line(capsys).startswith("✓")
    assert check(lambda x, d: (x @ x.T / d**0.5).to("meta")) is False
    assert "on device meta, expected cpu" in one_line(capsys)
    assert check("not a function") is False
    assert "expected a function, got a str" in one_line(capsys)


def test_too_slow_is_stopped_and_reported(capsys):
    def slow(x, d):
        while True:
            pass

    assert check(slow, time_limit=0.3) is False
    out = one_line(capsys)
    assert out.startswith("✗ scores: too slow: stopped waiting after 0.3 s on shipped-like"), out
    assert check(lambda x, d: x @ x.T / d**0.5) is True  # the next check runs normally
    capsys.readouterr()
    time.sleep(0.2)  # the stopped loop ends at its next instruction
    assert not [t for t in threading.enumerate() if t.name == "attncircuits-exercise-check"]


def test_too_slow_off_the_main_thread(capsys):
    results = []
    worker = threading.Thread(target=lambda: results.append(check(lambda x, d: time.sleep(5), time_limit=0.2)))
    worker.start()
    worker.join(10)
    assert results == [False]
    assert "too slow: stopped waiting after 0.2 s" in one_line(capsys)


def test_inputs_are_copied(capsys):
    model = random_model(n_layers=1, seed=3)
    before = model.W_E.clone()

    def edits_in_place(m):
        m.W_E.mul_(0)
        return m.W_E.sum()

    run_check(edits_in_place, [Case("random", (model,), kind="random")], lambda m: m.W_E.sum(), name="e")
    assert torch.equal(model.W_E, before)
    assert "on random" in one_line(capsys)


def test_scalar_outputs(capsys):
    cases = [Case("x", (torch.tensor([1.0, 2.0]),))]
    assert run_check(lambda t: t.sum(), cases, lambda t: float(t.sum()), name="s") is True
    capsys.readouterr()
    assert run_check(lambda t: -float(t.sum()), cases, lambda t: float(t.sum()), name="s") is False
    assert "wrong sign" in one_line(capsys)
    assert run_check(lambda t: "3", cases, lambda t: float(t.sum()), name="s") is False
    assert "should be a number, got a str" in one_line(capsys)


def _doubles(fn):
    """``_doubles(values, scale)``: a docstring that gives the stub's names, as every check's does."""
    return run_check(fn, [Case("three", (torch.tensor([1.0, 2.0, 3.0]), 2.0))], lambda v, s: v * s, name="d",
                     generate=lambda d: (d.randn(2), 3.0))


def test_messages_name_the_inputs_as_the_stub_does(capsys):
    def mine(values, scale):
        values.mul_(1.5)
        return values * scale

    _doubles(mine)
    assert "changed `values` in place" in one_line(capsys)  # the learner's own names
    _doubles(lambda *a: (a[0].mul_(1.5), a[0] * a[1])[1])
    assert "changed `values` in place" in one_line(capsys)  # no names: the docstring's, not the reference's `v`

    def renamed(x, s):
        return x * s if len(x) == 3 else x

    _doubles(renamed)
    out = one_line(capsys)
    assert "on generated case 1 (x: [" in out and ", s: 3.0)" in out, out  # the learner's names, values numpy-style


def test_arg_names_and_text_names():
    from attncircuits.course.exercises._contract import arg_names, describe, text_names

    assert text_names("``previous_token_score(pattern [batch, head, q, k]) -> Tensor [head]``.") == ["pattern"]
    assert text_names("``rise_window(steps, values, lo=0.2, hi=0.8) -> (start, end)``") == [
        "steps", "values", "lo", "hi"]
    assert text_names("``hypothesis_2() -> dict``") == [] and text_names(None) == []
    assert arg_names(lambda lg, t: 0, 2, ["logits", "tokens"]) == ["lg", "t"]
    assert arg_names(lambda *a: 0, 2, ["logits", "tokens"], lambda lg, t: 0) == ["logits", "tokens"]
    assert arg_names(lambda logits, *a: 0, 3, [], lambda lg, t: 0) == ["logits", "t", "argument 3"]
    assert describe((torch.zeros(1, 5, 6), torch.tensor([[4, 1, 3, 0, 5]])), ["logits", "tokens"]) == (
        "logits: a 1 x 5 x 6 tensor, tokens: [[4 1 3 0 5]]")
    assert describe((torch.tensor([0.5, -1.25]),), ["x"], "a note") == "x: [0.5 -1.25]; a note"


def test_the_output_axes_are_named_where_a_message_gives_an_index(capsys):
    from attncircuits.course.exercises._compare import name_axes

    axes = ("batch", "query", "key")
    assert name_axes("values differ by up to 0.1 (at index [0, 4, 3]: got 1", axes) == (
        "values differ by up to 0.1 (at [batch 0, query 4, key 3]: got 1")
    assert name_axes("shifted by one along axis 1 (of size 9): your", axes) == (
        "shifted by one along axis 1 (query, of size 9): your")
    assert name_axes("axes 0 and 2 are swapped", axes) == "axes 0 (batch) and 2 (key) are swapped"
    assert name_axes("at index [0, 4]", axes) == "at index [0, 4]"  # another output's index: left as it is
    cases = [Case("c", (torch.zeros(1, 5, 5),))]

    def bumped(x):
        x = x.clone()
        x[0, 4, 3] = 1.0
        return x

    assert run_check(bumped, cases, lambda x: x, name="p", axes=axes) is False
    assert "at [batch 0, query 4, key 3]" in one_line(capsys)


def test_a_stub_as_it_came_is_not_attempted_before_any_case_is_built(capsys):
    """A learner's notebook runs every check cell before any exercise is done: the stub is said to
    be not attempted before the check builds its cases (models, generated inputs)."""
    from attncircuits.course.exercises._core import guarded

    @guarded
    def check(fn):
        raise AssertionError("built its cases for a stub")

    def attention_pattern(q, k):
        """The stub."""
        raise NotImplementedError("write this function")

    def started(q, k):
        s = q @ k.T
        raise NotImplementedError(s)

    assert check(attention_pattern) is False
    out = capsys.readouterr().out
    assert out.startswith("○ attention_pattern: not attempted yet"), out
    assert check(started) is False  # a body begun: the check runs (and here says what it raised)
    assert "built its" in capsys.readouterr().out
