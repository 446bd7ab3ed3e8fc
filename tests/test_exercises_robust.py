"""A check never raises and never leaves the notebook worse: after each of these, the next correct
answer still passes (and the torch state is as the learner left it)."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time

import torch

from attncircuits.course.exercises import _core, ch01, ch02, ch04, ch06, ch08, shipped
from attncircuits.course.exercises._run import _LIVE


def attention_pattern(q, k):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    return s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")).softmax(-1)


def bigram_counts(tokens, d_vocab):
    return torch.bincount(tokens[:-1] * d_vocab + tokens[1:], minlength=d_vocab * d_vocab).view(d_vocab, d_vocab)


def one_line(out: str) -> str:
    text = " ".join(out.split())
    assert out.startswith(("✓", "✗", "○")) and "Traceback" not in out, out
    return text


def still_passes(capsys):
    assert ch01.check_attention_pattern(attention_pattern) is True, capsys.readouterr().out
    assert ch02.check_bigram_counts(bigram_counts) is True, capsys.readouterr().out
    capsys.readouterr()


#: CPU seconds (every thread of this process) the 58 checks take on the references, before the cases
#: below: a worker left running after a time-out spends this process's CPU time, while another
#: process on the machine (a pytest-xdist worker beside this one) changes the wall time only
_ALONE: dict[str, float] = {}


def _every_check_on_the_references() -> float:
    from exercise_table import outcome, reference_rows

    rows = reference_rows()
    t = time.process_time()
    results = {row.check: outcome(row) for row in rows}
    seconds = time.process_time() - t
    assert len(rows) == 58 and all(cls == "ok" for cls, _ in results.values()), {
        k: v for k, v in results.items() if v[0] != "ok"}
    return seconds


def test_every_check_passes_on_the_references_before_the_cases_below():
    """...and every identity a check states holds on every case it ran (read from the second pass:
    one pass serves the time and the identities)."""
    from exercise_table import reference_rows

    _every_check_on_the_references()  # loads the shipped models and the solutions
    _ALONE["s"] = _every_check_on_the_references()
    stated = [(name, cases, ids) for name, (cases, ids) in _core.CASES_RUN.items() if ids]
    assert {name for name, _, _ in stated} >= {
        "ch10.check_frozen_ln", "ch06.check_previous_token_score", "ch06.check_prefix_matching_score",
        "ch07.check_copy_losses", "ch07.check_smear_scores", "ch08.check_copy_ov", "ch09.check_induction_stripe_scores"}
    assert {r.check for r in reference_rows()} <= set(_core.CASES_RUN), "a check's cases were not recorded"
    for name, cases, ids in stated:
        for case in cases:
            for identity in ids:
                assert identity.holds(*case.args), f"{name}: {case.label}: not {identity.text}"


def test_outputs_no_comparison_expected_are_one_line(capsys):
    for fn in (lambda q, k: attention_pattern(q, k).to("meta"), lambda q, k: 10**400,
               lambda q, k: object(), lambda q, k: [attention_pattern(q, k)] * 2):
        assert ch01.check_attention_pattern(fn) is False
        one_line(capsys.readouterr().out)
    assert ch04.check_copying_score(lambda m, h: 10**400) is False
    assert "✗" in one_line(capsys.readouterr().out)
    still_passes(capsys)


def test_bad_models_and_objects_without_cfg_are_one_line(capsys):
    from attncircuits.models import handbuilt as hb

    assert ch08.check_two_back_model(lambda layout: hb.empty_model(hb.Layout(n_ctx=64), 2)) is False
    assert "n_ctx" in one_line(capsys.readouterr().out)
    assert ch08.check_two_back_model(lambda layout: torch.nn.Linear(2, 2)) is False
    one_line(capsys.readouterr().out)
    assert ch06.check_find_induction_heads(lambda m: [("a", "b")]) is False
    one_line(capsys.readouterr().out)
    still_passes(capsys)


def test_a_learners_default_dtype_does_not_fail_later_checks(capsys):
    torch.set_default_dtype(torch.float64)
    try:
        still_passes(capsys)
        assert torch.get_default_dtype() == torch.float64  # the learner's choice is kept
    finally:
        torch.set_default_dtype(torch.float32)


def test_the_torch_state_is_restored(capsys):
    threads, state = torch.get_num_threads(), torch.random.get_rng_state()
    torch.set_grad_enabled(True)

    def meddles(q, k):
        torch.manual_seed(123)
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(True)
        return attention_pattern(q, k)

    assert ch01.check_attention_pattern(meddles) is True, capsys.readouterr().out
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    assert torch.get_num_threads() == threads and torch.equal(torch.random.get_rng_state(), state)


def test_editing_the_shipped_models_does_not_fail_later_checks(capsys):
    model = shipped("attn-only-2l").model
    with torch.no_grad():
        model.W_E.mul_(0)
        model.blocks[0].W_Q.add_(1)
    model.cfg.n_ctx = 3
    still_passes(capsys)
    assert ch06.check_previous_token_score(lambda p: p.diagonal(-1, -2, -1).mean((0, 2))) is True
    assert float(shipped("attn-only-2l").model.W_E.abs().max()) > 0


def test_a_stub_called_inside_a_finished_function_is_named(capsys):
    def attention_pattern(q, k):
        raise NotImplementedError("your solution here")

    def head_output(resid, W_pos, W_Q, W_K, W_V, W_O):
        x = resid + W_pos[: resid.shape[1]]
        return attention_pattern(x @ W_Q, x @ W_K) @ (resid @ W_V) @ W_O

    assert ch01.check_head_output(head_output) is False
    out = one_line(capsys.readouterr().out)
    assert out.startswith("✗") and "`attention_pattern`, which is not done yet" in out, out
    assert ch01.check_attention_pattern(attention_pattern) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_a_timed_out_loop_with_a_bare_except_is_stopped(capsys, monkeypatch):
    monkeypatch.setattr(_core, "DEFAULT_TIME_LIMIT", 0.5)
    monkeypatch.setattr(_core.run_check, "__kwdefaults__", {**_core.run_check.__kwdefaults__, "time_limit": 0.5})

    def stubborn(q, k):
        while True:
            try:
                sum(range(1000))
            except:  # noqa: E722 - the learner's bare except must not keep the loop alive
                pass

    before = threading.active_count()
    assert ch01.check_attention_pattern(stubborn) is False
    assert "too slow" in capsys.readouterr().out
    deadline = time.time() + 5
    while time.time() < deadline and (threading.active_count() > before or any(w.is_alive() for w in _LIVE)):
        time.sleep(0.05)
    assert threading.active_count() <= before and not any(w.is_alive() for w in _LIVE)
    t = time.perf_counter()
    still_passes(capsys)
    assert time.perf_counter() - t < 30


def test_the_interpreter_exits_cleanly_after_a_time_out(tmp_path):
    script = tmp_path / "t.py"
    script.write_text(
        "import torch\n"
        "from attncircuits.course.exercises import _core, ch01\n"
        "def slow(q, k):\n"
        "    x = torch.randn(1500, 1500)\n"
        "    for _ in range(400):\n"
        "        x = torch.linalg.eigvals(x).real.diag() + x\n"
        "    return x\n"
        "ch01.check_attention_pattern.__wrapped__.__globals__['run_check'].__kwdefaults__['time_limit'] = 0.3\n"
        "print(ch01.check_attention_pattern(slow))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr and "False" in done.stdout, (done.stdout, done.stderr)


def test_every_check_still_passes_after_all_of_the_above_in_about_the_same_time():
    """Run last in this file: every case above ran in this process first (time-outs, a learner's
    default dtype, edited shipped models, ...); the 58 checks still pass on the references, and
    take about as long as before them (a worker left running after a time-out made them 4x slower)."""
    alone = _ALONE.get("s") or _every_check_on_the_references()
    after = _every_check_on_the_references()
    assert after < 2 * alone + 1, f"the 58 checks took {after:.1f} CPU s after the cases, {alone:.1f} before"
    assert not any(w.is_alive() for w in _LIVE)
