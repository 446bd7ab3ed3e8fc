"""make family's machinery on tiny budgets: members trained and written, a second run trains
nothing, a results folder of another recipe is refused, an interrupted member resumes."""

import json

import numpy as np
import pytest

from attncircuits.train import family, family_cli, family_files


STREAMS = tuple(np.random.default_rng(i).integers(0, 256, n).astype(np.uint16) for i, n in ((0, 20_000), (1, 4_000)))


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(family, "RECIPE", {"steps": 50, "eval_every": 25, "eval_batches": 1})
    monkeypatch.setattr(family, "N_WINDOWS", 2)
    monkeypatch.setattr(family, "N_ICL_WINDOWS", 4)


def test_members_are_trained_written_and_not_trained_again(tiny, tmp_path, capsys):
    out = family.run(seed=0, processes=1, members=["attn-1l", "ln-mlp-1l"], out=tmp_path / "seed-0", streams=STREAMS)
    res = family.load(out)
    assert sorted(res) == ["attn-1l", "ln-mlp-1l"]
    for r in res.values():
        assert r["history"]["step"] == [0, 25, 50]
        assert r["per_token"].shape == (3, 2 * 4)  # every evaluation, every fixed (window, position)
        # the ICL score on its own fixed windows every second evaluation and at the end, each window kept
        assert len(r["history"]["icl"]) == 3  # each evaluation's on the fixed windows of the PCA
        assert r["history"]["icl_steps"] == [0, 50] and r["icl_rows"].shape == (2, 4)
        assert r["final_icl"]["windows"] == 4 and r["final_icl"]["mean"] == pytest.approx(r["icl_rows"][-1].mean(), abs=2e-3)
        assert set(r["final_scores"]) >= {"previous_token", "prefix_matching", "duplicate_token", "copying"}
    assert not list(out.glob("*.partial"))
    assert "ln-mlp-1l" in capsys.readouterr().out
    family.run(seed=0, processes=1, members=["attn-1l", "ln-mlp-1l"], out=out, streams=STREAMS)
    assert "2 of 2 members done, training 0" in capsys.readouterr().out


def test_a_folder_of_another_recipe_is_refused(tiny, tmp_path, monkeypatch):
    out = tmp_path / "seed-0"
    family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=STREAMS)
    monkeypatch.setattr(family, "RECIPE", {"steps": 75, "eval_every": 25, "eval_batches": 1})
    with pytest.raises(SystemExit, match="written by another recipe"):
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=STREAMS)


def test_an_interrupted_member_resumes_from_its_last_evaluation(tiny, tmp_path, monkeypatch):
    from attncircuits.train import loop

    out = tmp_path / "seed-0"
    out.mkdir()
    real = loop.evaluate
    calls = {"n": 0}

    def stop_after_two(model, val_batches):
        calls["n"] += 1
        if calls["n"] == 3:  # at step 50: Ctrl-C after two evaluations were saved
            raise loop.TrainingInterrupted(50)
        return real(model, val_batches)

    monkeypatch.setattr(loop, "evaluate", stop_after_two)
    with pytest.raises(loop.TrainingInterrupted):
        family.train_member("attn-1l", 0, out, STREAMS)
    assert (family_files.state_dir(out, "attn-1l") / "resume" / "state.pt").is_file()
    monkeypatch.setattr(loop, "evaluate", real)
    r = family.train_member("attn-1l", 0, out, STREAMS)
    assert r["history"]["step"] == [0, 25, 50]
    assert json.loads((out / "attn-1l.json").read_text())["history"]["step"] == [0, 25, 50]
    assert not family_files.state_dir(out, "attn-1l").exists()


def test_a_worker_whose_make_family_is_gone_stops_at_its_saved_state_and_resumes(tiny, tmp_path, monkeypatch, capsys):
    """A killed `make family` (SIGTERM, not Ctrl-C) leaves its pool workers orphaned: each stops at
    its next evaluation, whose state is saved, instead of racing a rerun for the same files."""
    import multiprocessing

    out = tmp_path / "seed-0"
    out.mkdir()

    class Gone:
        def is_alive(self):
            return False

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(multiprocessing, "parent_process", lambda: Gone())
    monkeypatch.setattr(family.os, "_exit", exit_)
    with pytest.raises(SystemExit):
        family.train_member("attn-1l", 0, out, STREAMS)
    assert "its make family is gone; stopping at step 0" in capsys.readouterr().out
    assert not (out / "attn-1l.json").exists()
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)  # the rerun's own process
    r = family.train_member("attn-1l", 0, out, STREAMS)
    assert r["history"]["step"] == [0, 25, 50]


def test_an_unknown_member_is_refused_in_one_line():
    with pytest.raises(ValueError, match="no family member 'attn-9l'; the members are attn-1l"):
        family.member_configs("attn-9l")


@pytest.mark.parametrize("argv, said", [
    (["--seed", "-1"], "--seed: '-1': give a whole number from 0"),
    (["--seed", "1.5"], "--seed: '1.5': give a whole number from 0"),
    (["--seed", "99999999999999999999"], "--seed: '99999999999999999999': give a whole number"),
    (["--processes", "0"], "--processes: '0': give a whole number from 1 to 64"),
    (["--members", "attn-9l"], "invalid choice: 'attn-9l'"),
])
def test_the_command_refuses_a_bad_seed_count_or_member_in_one_line(argv, said, capsys, monkeypatch):
    monkeypatch.setattr(family, "run", lambda *a, **k: pytest.fail("ran with a bad argument"))
    with pytest.raises(SystemExit) as stop:
        family_cli.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and said in err and "Traceback" not in err, err


def test_results_that_are_missing_half_written_foreign_or_corrupt_are_refused_in_one_line(tiny, tmp_path, monkeypatch):
    out = tmp_path / "seed-0"
    with pytest.raises(FileNotFoundError, match=r"no family results in .* run `make family SEED=n`"):
        family.load_results(out)
    monkeypatch.setattr(family, "MEMBERS", {n: family.MEMBERS[n] for n in ("attn-1l", "attn-2l")})
    family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=STREAMS)
    with pytest.raises(FileNotFoundError, match=r"half-written: 1 members not finished \(attn-2l\); run `make family SEED=0` again"):
        family.load_results(out)
    family.run(seed=0, processes=1, out=out, streams=STREAMS)
    assert list(family.load_results(out)) == ["attn-1l", "attn-2l"]
    (out / "attn-1l.npz").write_bytes(b"not an npz")
    with pytest.raises(ValueError, match=r"attn-1l.npz does not match its SHA-256 .* delete .*attn-1l.json and "
                                         r"attn-1l.npz and run `make family SEED=0` to train attn-1l again"):
        family.load_results(out)
    monkeypatch.setattr(family, "RECIPE", {"steps": 75, "eval_every": 25, "eval_batches": 1})
    with pytest.raises(ValueError, match=r"written by another recipe .* `make family SEED=0`"):
        family.load_results(out)
    (out / "recipe.json").write_text("{")
    with pytest.raises(ValueError, match="does not read"):
        family.load_results(out)


def test_the_chapter_reads_the_folder_the_environment_names(monkeypatch, tmp_path):
    from attncircuits.course import claims

    monkeypatch.delenv(family.RESULTS_ENV, raising=False)
    assert family.results_dir() == family.RESULTS / "seed-0"
    monkeypatch.setenv(family.RESULTS_ENV, str(tmp_path))
    assert family.results_dir() == tmp_path
    assert claims.models_in_use() == str(tmp_path)  # its claims print instead of failing


class Killed(BaseException):
    """A SIGKILL at one point of a member's last writes: nothing after it runs."""


@pytest.mark.parametrize("point", ["losses", "results", "listing", "tidying"])
def test_a_kill_at_any_point_of_a_members_last_writes_is_completed_by_a_rerun(tiny, tmp_path, point):
    """The losses (.npz), the results (.json), then both listed in the folder's manifest, which
    marks the member done, then the saved state removed: killed before any of the four, a rerun
    gives the results of a run never killed."""
    (tmp_path / "whole").mkdir()
    whole = family.train_member("attn-1l", 0, tmp_path / "whole", STREAMS)
    out = tmp_path / "seed-0"
    out.mkdir()
    (out / "recipe.json").write_text(json.dumps(family.recipe_id(0)))  # as make family writes it first
    replace, write_text, remove = family.os.replace, family.durable.write_text, family.durable.remove

    def killed(*_):
        raise Killed(point)

    with pytest.MonkeyPatch.context() as mp:
        if point == "losses":  # the .npz.new written, not yet in place
            mp.setattr(family.os, "replace", lambda a, b: killed() if str(b).endswith(".npz") else replace(a, b))
        elif point in ("results", "listing"):
            file = "attn-1l.json" if point == "results" else family_files.MANIFEST
            mp.setattr(family.durable, "write_text", lambda f, t: killed() if f.name == file else write_text(f, t))
        else:
            mp.setattr(family.durable, "remove", lambda f: killed() if f.suffix == ".partial" else remove(f))
        with pytest.raises(Killed):
            family.train_member("attn-1l", 0, out, STREAMS)
    done = "attn-1l.json" in family_files.entries(out)
    assert done == (point == "tidying")  # done only once its results are written, whole, and listed
    assert (family_files.state_dir(out, "attn-1l") / "resume").is_dir()  # the last saved state, for the rerun
    if done:  # a rerun of make family tidies it away
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=STREAMS)
        assert not family_files.state_dir(out, "attn-1l").exists()
    else:
        family.train_member("attn-1l", 0, out, STREAMS)
    again = family.load(out)["attn-1l"]
    assert again["history"] == whole["history"] and again["final_scores"] == whole["final_scores"]
    assert np.array_equal(again["per_token"], np.load(tmp_path / "whole" / "attn-1l.npz")["per_token"])


def test_a_saved_state_that_does_not_read_stops_make_family_in_one_line_before_training(tiny, tmp_path, monkeypatch):
    out = tmp_path / "seed-0"
    out.mkdir()
    resume = family_files.state_dir(out, "attn-1l") / "resume"
    resume.mkdir(parents=True)
    (resume / "state.pt").write_bytes(b"half a file")
    monkeypatch.setattr(family, "train_member", lambda *a, **k: pytest.fail("trained with a bad saved state"))
    with pytest.raises(SystemExit, match=r"saved state in .*attn-1l.partial is incomplete or does not read; delete "
                                         r".*attn-1l.partial to train attn-1l from the start"):
        family.run(seed=0, processes=1, members=["ln-mlp-1l", "attn-1l"], out=out, streams=STREAMS)
    (out / "recipe.json").write_text("{")
    family.durable.remove(resume.parent)
    with pytest.raises(SystemExit, match=r"recipe.json does not read; move .* away"):
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=STREAMS)


def test_record_runs_chapter_11_on_the_seed_and_writes_its_counts(tiny, tmp_path, monkeypatch, capsys):
    from attncircuits.train import replicate

    monkeypatch.setattr(family, "MEMBERS", {n: family.MEMBERS[n] for n in ("attn-1l",)})
    out = family.run(seed=3, processes=1, out=tmp_path / "seed-3", streams=STREAMS)
    seen = {}

    def run_chapters(models_dir, paths, env_name):
        seen.update(models_dir=models_dir, paths=[p.name for p in paths], env_name=env_name)
        return {family.CHAPTER: {"cells": 36, "cells_passed": 36, "claims": 31, "claims_held": 30}}

    monkeypatch.setattr(replicate, "run_chapters", run_chapters)
    path = family.record(3, out, records=tmp_path / "replicates")
    assert seen == {"models_dir": out, "paths": ["11_model_family.ipynb"], "env_name": "ATTNCIRCUITS_FAMILY"}
    assert path == tmp_path / "replicates" / "family-seed-3" / "results.json"
    body = json.loads(path.read_text())
    assert body["seed"] == 3 and body["command"] == "make family SEED=3" and body["chapters"][family.CHAPTER]["claims_held"] == 30
    (out / "attn-1l.json").unlink()  # a seed not finished is not recorded: one line naming the command
    with pytest.raises(FileNotFoundError, match=r"run `make family SEED=3` again"):
        family.record(3, out, records=tmp_path / "replicates")


def test_members_train_on_the_device_chosen_and_say_which(tiny, tmp_path):
    out = family.run(seed=0, processes=1, members=["attn-1l"], out=tmp_path / "seed-0", streams=STREAMS, device="cpu")
    assert family.load(out)["attn-1l"]["device"] == "cpu"


def test_a_gpu_is_used_where_torch_finds_one_and_every_member_is_sent_there(tmp_path, monkeypatch, capsys):
    """No GPU here: torch is told it has one, and the members' device is read where they would train."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a test GPU")
    assert family.family_device() == torch.device("cuda")
    assert family.family_device("cpu") == torch.device("cpu")  # asked for: the CPU, GPU or not
    sent = []
    monkeypatch.setattr(family, "train_member",
                        lambda name, seed, out, streams, device: sent.append((name, device)) or {"wall_s": 0})
    monkeypatch.setattr(family, "table", lambda out: "")
    family.run(seed=0, processes=1, members=["attn-1l", "attn-2l"], out=tmp_path / "seed-0", streams=STREAMS)
    assert sorted(sent) == [("attn-1l", "cuda"), ("attn-2l", "cuda")]
    assert "training 2 on cuda (a test GPU)" in capsys.readouterr().out


@pytest.mark.parametrize("device, said", [
    ("tpu", "--device 'tpu' is not a device; use one of cpu"),
    ("cuda:99", "--device 'cuda:99'"),
    ("mps", "--device 'mps'"),
])
def test_a_device_this_machine_lacks_is_refused_in_one_line_before_anything_is_written(device, said, tmp_path, monkeypatch):
    import torch

    if device == "mps" and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    monkeypatch.setattr(family, "train_member", lambda *a, **k: pytest.fail("trained on a device it lacks"))
    with pytest.raises(SystemExit, match=said.replace("(", r"\(")) as stop:
        family_cli.main(["--device", device, "--members", "attn-1l"])
    assert "\n" not in str(stop.value)
    out = tmp_path / "seed-0"
    with pytest.raises(SystemExit):
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=STREAMS, device=device)
    assert not out.exists()


def test_the_icl_change_is_each_windows_own_change_with_its_standard_error():
    """Across a phase change the ICL score's change is read window by window (the same text before
    and after), so its standard error is the change's spread, not the text's: a fall of 0.1 nats
    under 3 nats of per-window noise is found."""
    from attncircuits.analysis.phase import Rise, icl_change

    rng = np.random.default_rng(0)
    text = rng.normal(0, 3, 1024)  # each window's own level: the same at every evaluation
    steps = np.arange(0, 1100, 100)
    rows = np.stack([text + rng.normal(0, 0.3, 1024) - (0.1 if s >= 600 else 0.0) for s in steps])
    window = Rise(4, 6, 400, 600, 0.05, 0.9)
    c = icl_change(steps, rows, window)  # evaluations at 300, 400 before; 600, 700 after
    assert c.change == pytest.approx(-0.1, abs=0.04) and c.windows == 1024
    assert c.se == pytest.approx(0.3 / np.sqrt(1024), rel=0.1) and c.falls()
    assert c.before == pytest.approx(rows[3:5].mean(), abs=1e-9) and c.after == pytest.approx(rows[6:8].mean(), abs=1e-9)
    flat = icl_change(steps, rows[:, :] * 0 + text, None)  # nothing changes: no fall
    assert flat.change == pytest.approx(0, abs=1e-12) and not flat.falls()
    # unpaired, the same fall would be lost in the text's noise (3 / sqrt(1024) = 0.09 per mean)
    assert abs(c.change) < 3 * np.sqrt(2) * text.std() / np.sqrt(1024)
    with pytest.raises(ValueError, match="no ICL evaluation before step 400"):
        icl_change(steps[6:], rows[6:], window)
    with pytest.raises(ValueError, match="rows must be"):
        icl_change(steps, rows[:, :1], window)


def test_the_family_table_keeps_each_number_in_its_own_column():
    """The closing table (chapter 11 prints it): every line fits the book's column, each head and its
    score sit under their own header words, and the ICL change has a standard error exactly when the
    results keep each window's score."""
    from attncircuits.analysis import phase

    rows = [phase.summarize(n, r) for n, r in family.load(family.RESULTS / "seed-0").items()]
    text = phase.table(rows)
    lines = text.split("\n")
    assert len(lines) == 2 + len(rows) + 1 and lines[-1] == f"a step is {rows[0].tokens_per_step:,} tokens"
    assert max(map(len, lines)) <= 79
    header = lines[1]
    for line, r in zip(lines[2:-1], rows):
        ind, prev = f"{r.phase.head[0]}.{r.phase.head[1]}", f"{r.prev_head[0]}.{r.prev_head[1]}"
        i, p = header.index("head"), header.rindex("head")  # each name starts under its "head"
        assert line[i:i + len(ind)] == ind and line[p:p + len(prev)] == prev, line
        for word, shown in (("score", f"{r.phase.best:.2f}"), ("before", f"{r.icl_before:+.2f}"),
                            ("after", f"{r.icl_after:+.2f}")):  # numbers end under their word
            end = header.index(word) + len(word)
            assert line[:end].split()[-1] == shown, (word, line)
        assert line[header.rindex("score") + 5 - 4:header.rindex("score") + 5] == f"{r.prev_score:.2f}", line
        se_end = header.index("s.e.") + 4
        assert (line[se_end - 4:se_end].strip() != "") == (r.icl is not None), line
    with_rows = rows[0].__class__(**{**vars(rows[0]), "icl": phase.ICLChange(-0.2, -0.5, -0.3, 0.04, 1024)})
    assert "-0.30 0.04" in with_rows.row()
