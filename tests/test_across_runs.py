"""The reproduces page's runs side by side: each finding read from each run's headline numbers,
with its spread; a run that has not trained a model shows "-" there."""

import json

from attncircuits.analysis.quantities import LOSS_WINDOWS, sample_name
from attncircuits.train.replicate import ACROSS_RUNS, PROBE_NAME, across_runs, committed_results

LOSS = f"validation loss on {sample_name(LOSS_WINDOWS)}"


def _two_layer(prev, ind, k_writer_is_prev, loss):
    return {"val_loss": loss, "prev_token_head": prev, "prev_token_score": 0.9, "induction_heads": ind,
            "prefix_matching_max_per_layer": [0.01, max(ind.values(), default=0.0)],
            "repeated_loss_second": 0.3, "icl_score": -0.5,
            "top_k_composition": {"writer": prev, "reader": "1.3", "score": 0.17, "z": 30.0},
            "k_writer_is_prev_token_head": k_writer_is_prev}


def test_rows_compare_runs_and_leave_out_what_a_run_lacks():
    runs = {"shipped": {"attn-only-2l": _two_layer("0.2", {"1.0": 0.9, "1.3": 0.8}, True, 2.96),
                        "attn-only-0l": {"val_loss": 3.92}},
            "seed 1": {"attn-only-2l": _two_layer("0.1", {"1.1": 0.92, "1.3": 0.9}, False, 3.06)}}
    rows = {r[0]: r[1:] for r in across_runs(runs)}
    assert len(rows) == len(ACROSS_RUNS)
    assert rows[f"{LOSS}, 2 layers"] == ("2.96", "3.06", "0.10")  # one precision per row
    assert rows[f"{LOSS}, 0 layers"] == ("3.92", "-", "-")
    assert rows["2L: previous-token head"] == ("0.2", "0.1", "2 different")
    assert rows["2L: how many"] == ("2", "2", "same in all 2")
    assert rows[f"2L: induction heads (prefix matching > 0.3 on {PROBE_NAME})"] == ("1.0, 1.3", "1.1, 1.3", "2 different")
    assert rows["2L: the K-writer is the previous-token head"] == ("yes", "no", "2 different")
    assert rows["1L: copying heads (of 4)"] == ("-", "-", "-")


def test_committed_results_are_read_by_seed(tmp_path):
    for seed in (10, 2):
        (tmp_path / f"seed-{seed}").mkdir()
        (tmp_path / f"seed-{seed}" / "results.json").write_text(json.dumps({"seed": seed, "models": {"x": seed}}))
    (tmp_path / "mine").mkdir()
    assert committed_results(tmp_path) == {"seed 2": {"x": 2}, "seed 10": {"x": 10}}


def test_the_committed_replicates_have_every_finding():
    runs = committed_results()
    assert {"seed 1", "seed 2"} <= set(runs)
    for row in across_runs(runs):
        assert "-" not in row[1:3], row  # both seeds trained all three models


def test_a_replicate_in_use_is_shown_once(tmp_path, monkeypatch):
    from attncircuits.checkpoints import modelset
    from attncircuits.train import replicate

    seen = []
    monkeypatch.setattr(replicate, "headline_numbers", lambda d: seen.append(d) or {"models": {"dir": str(d)}})
    monkeypatch.delenv(modelset.ENV, raising=False)
    for seed in (1, 2):
        (tmp_path / f"seed-{seed}").mkdir()
        (tmp_path / f"seed-{seed}" / "results.json").write_text(json.dumps({"seed": seed, "models": {}}))
    assert list(replicate.runs_to_compare(tmp_path)) == ["shipped", "seed 1", "seed 2"]
    assert seen == [modelset.SHIPPED_DIR]
    (tmp_path / "seed-1" / modelset.SET_FILE).write_text(json.dumps({"kind": "replicate", "seed": 1}))
    monkeypatch.setattr(modelset, "current_dir", lambda: tmp_path / "seed-1")
    assert list(replicate.runs_to_compare(tmp_path)) == ["in use: seed-1", "seed 2"]


def test_a_row_and_its_spread_share_one_precision():
    """No spread column mixing precisions (0.27 beside 0.326): a row's values and its spread are
    written with the same number of decimals."""
    for row in across_runs(committed_results()):
        numbers = [c for c in row[1:] if c.replace(".", "", 1).lstrip("-").isdigit()]
        decimals = {len(c.partition(".")[2]) for c in numbers}
        assert len(decimals) <= 1, row
