"""One measure per quantity (attncircuits.analysis.quantities): each value is the mean of its rows
with their standard error, every printed line names its windows and is recorded, and the notebook
run's checks (tests/notebook_pages.py) catch two values of one quantity and a quantity printed
without its windows."""

from __future__ import annotations

import json
import math

import notebook_pages as pages
import pytest
import torch

from attncircuits.analysis import losses
from attncircuits.analysis import quantities as Q
from attncircuits.analysis.scores import prefix_matching_scores


def _text(model, n=12):
    g = torch.Generator().manual_seed(1)
    return Q.Windows(f"{n} made-up windows", torch.randint(0, model.cfg.d_vocab, (n, model.cfg.n_ctx), generator=g))


def test_icl_score_and_loss_are_the_means_of_their_rows(tiny_model):
    w = _text(tiny_model)
    nll = losses.per_token_loss(tiny_model, w.tokens)
    rows = losses.icl_scores_per_row(nll, tiny_model.cfg.n_ctx)
    icl = Q.measure("ICL score", tiny_model, "tiny", w)
    assert icl.value == pytest.approx(rows.mean().item(), abs=1e-6)
    assert icl.se == pytest.approx(rows.std().item() / math.sqrt(len(rows)), rel=1e-5)
    loss = Q.measure("validation loss", tiny_model, "tiny", w)
    assert loss.value == pytest.approx(nll.mean().item(), abs=1e-6)


def test_copy_losses_and_prefix_matching_match_the_losses_and_scores_modules(tiny_model):
    w = Q.repeated_tokens(tiny_model, 6, 2, batch_size=8, seed=3)
    curve = losses.repeated_loss_curve(tiny_model, 6, 2, batch_size=8, seed=3)
    first, second = curve.copy_means()
    assert Q.measure("first-copy loss", tiny_model, "tiny", w).value == pytest.approx(first, abs=1e-5)
    assert Q.measure("second-copy loss", tiny_model, "tiny", w).value == pytest.approx(second, abs=1e-5)
    w4 = Q.repeated_tokens(tiny_model, 3, 4, batch_size=8, seed=3)
    pm = prefix_matching_scores(tiny_model, 3, 4, tokens=w4.tokens)
    got = Q.measure("prefix matching", tiny_model, "tiny", w4, head=(1, 2))
    assert got.value == pytest.approx(pm[1, 2].item(), abs=1e-5) and got.model == "tiny 1.2"


def test_a_printed_line_names_quantity_model_windows_and_is_logged(tiny_model, tmp_path, monkeypatch):
    log = tmp_path / "q.jsonl"
    monkeypatch.setenv(Q.LOG_ENV, str(log))
    w = _text(tiny_model)
    m = Q.measure("ICL score", tiny_model, "tiny", w, condition="head 1.0 ablated",
                  **losses.zero_ablation(tiny_model, (1, 0)))
    line = str(m)
    assert line.startswith("ICL score of tiny (head 1.0 ablated) on 12 made-up windows: ")
    assert line.endswith(f"{m.value:+.2f} ± {m.se:.2f} nats") and max(map(len, line.splitlines())) <= Q.WIDTH
    assert json.loads(log.read_text().splitlines()[-1])["value"] == m.value
    assert f"{m:.3f}" == f"{m.value:.3f}"  # a format spec formats the value alone


def test_a_changed_model_must_say_how_and_a_quantity_must_be_known(tiny_model):
    w = _text(tiny_model)
    with pytest.raises(ValueError, match="condition"):
        Q.measure("ICL score", tiny_model, "tiny", w, ablate=[(1, 0)])
    with pytest.raises(ValueError, match="unknown quantity"):
        Q.measure("loss", tiny_model, "tiny", w)
    with pytest.raises(ValueError, match="head="):
        Q.measure("prefix matching", tiny_model, "tiny", Q.repeated_tokens(tiny_model, 3, 4))


def test_the_history_values_name_their_windows_and_have_no_se():
    h = {"step": [0, 100], "val_loss": [7.0, 4.5], "icl_score": [0.0, -0.3]}
    m = Q.from_history("ICL score", h, "tiny")
    assert (m.value, m.se) == (-0.3, None) and Q.HISTORY_WINDOWS in m.windows and "step 100" in str(m)


def _stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def _record(value, windows="128 spread validation windows", model="attn-only-2l", digits=2):
    m = Q.Measured("validation loss", model, windows, value, 0.1, "", digits)
    return {**m.__dict__, "text": str(m)}


def test_two_values_of_one_quantity_on_one_windows_fail_and_other_windows_do_not():
    seen = {}
    assert pages.quantity_conflicts(seen, [_record(2.961)], "ch1") == []
    assert pages.quantity_conflicts(seen, [_record(2.964, digits=3)], "ch10") == []  # same to 2 digits
    bad = pages.quantity_conflicts(seen, [_record(3.58)], "ch10")
    assert len(bad) == 1 and "3.58 here, 2.96 in ch1" in bad[0]
    assert pages.quantity_conflicts(seen, [_record(3.58, windows="8 spread validation windows")], "ch10") == []
    assert pages.quantity_conflicts(seen, [_record(3.58, model="ln-mlp-4l")], "ch10") == []


def test_a_quantity_printed_without_its_windows_fails():
    r = _record(2.96)
    names = {r["windows"]}
    assert pages.unnamed_quantities([_stream(r["text"] + "\n")], [r], names) == []
    assert pages.unnamed_quantities([_stream("val loss 2.96 on 128 spread validation windows\n")], [], names) == []
    assert pages.unnamed_quantities([_stream("step 50: val loss 3.1 (the training history's evaluations)")],
                                    [], set()) == []
    for line in ("attn-only-2l val loss 3.58", "ICL score -0.74", "second copy 0.33 nats",
                 "best layer-1 prefix matching: 0.91", "in-context-learning score -0.5"):
        assert len(pages.unnamed_quantities([_stream(line)], [], names)) == 1, line
    html = {"output_type": "display_data", "data": {"text/html": "<table><tr><td>2L: ICL score</td><td>-0.565</td>"
                                                                 "</tr></table>", "text/plain": "<HTML>"}}
    assert len(pages.unnamed_quantities([html], [], names)) == 1
    table = "before and after, in the training history's evaluations:\nICL score -0.3 -0.5\n\nICL score -0.3"
    assert len(pages.unnamed_quantities([_stream(table)], [], set())) == 1  # the header ends at a blank line
    esc = {"output_type": "display_data", "data": {"text/html": "<tr><td>ICL score in the training history&#x27;s "
                                                                "evaluations</td></tr>", "text/plain": "<HTML>"}}
    assert pages.unnamed_quantities([esc], [], set()) == []  # HTML entities are read as the reader reads them
    # a reported line with an unreported mention beside it still fails
    assert len(pages.unnamed_quantities([_stream(r["text"] + "; ICL score -0.7")], [r], set())) == 1


def test_a_claim_that_did_not_hold_quotes_its_chapter_and_is_not_a_report():
    """On another set a claim that fails prints its text, folded (course.claims); the chapter names
    the windows beside the claim, so neither the line nor its continuation is a quantity report, and
    a report after it is still checked."""
    for text in ("claim not held: without it the induction head's prefix matching halves (measured:\n"
                 "    [0.8, 0.5])\n",
                 "claim not held: the top prediction is correct at 70% of the second\n"
                 "    copy (measured: 0.61)\n",
                 "claim about the corpus not held: the ICL score is low (measured: 1)\n",
                 "3 of 5 claims held on the models in /sets/code\n"
                 "  not held: every other layer-1 head has a prefix-matching score above\n"
                 "      0.3 (measured: [0.1])\n"):
        assert pages.unnamed_quantities([_stream(text)], [], set()) == [], text
        assert len(pages.unnamed_quantities([_stream(text + "ICL score -0.7\n")], [], set())) == 1, text


def test_the_across_runs_rows_name_the_windows_their_numbers_are_measured_on():
    from attncircuits import ModelConfig, Transformer
    from attncircuits.train import replicate

    model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=300, n_ctx=128))
    assert Q.repeated_tokens(model).name == replicate.REPEATED_NAME
    assert Q.default_windows("prefix matching", model).name == replicate.PROBE_NAME
    labels = [row[0] for row in replicate.ACROSS_RUNS]
    for label in labels:
        named = Q.mentions(label)
        assert not named or any(n in label for n in (replicate.REPEATED_NAME, replicate.PROBE_NAME,
                                                     Q.sample_name(Q.LOSS_WINDOWS),
                                                     Q.sample_name(Q.ICL_WINDOWS))), label
