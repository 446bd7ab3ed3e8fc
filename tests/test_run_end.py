"""The end of a training run and where two runs meet: whatever stops a run (Ctrl-C, SIGTERM, a kill,
a full disk, a diverging loss), the finished model is in place or kept, and the one line printed
says which; a second run into the same --out is refused while the first lives."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attncircuits import load_checkpoint
from attncircuits.core.manifest import sha256
from attncircuits.train import run_folder
from attncircuits.train.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
# a second-long run: the tiny preset on a small local corpus, one evaluation in the middle
FAST = ["--preset", "tiny", "--steps", "4", "--eval-every", "2", "--eval-batches", "1", "--batch-size", "4",
        "--threads", "1"]
STAGES = ["write", "written", "committed", "old moved", "placed"]


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    for i in range(10):
        (folder / f"{i}.txt").write_text(f"File {i}. " + f"all work and no play makes model {i} dull. " * 30)
    return sorted(map(str, folder.iterdir()))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, docs):
    """The uninterrupted run every interrupted one must end equal to."""
    out = tmp_path_factory.mktemp("ref") / "whole"
    assert _main(*FAST, "--corpus-files", *docs, "--out", out) == 0
    return out


def _main(*argv):
    try:
        main([str(a) for a in argv])
    except SystemExit as stop:
        return stop.code
    return 0


def cli(capsys, *argv):
    code = _main(*argv)
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    return code, [line for line in lines if line.strip() and not line.startswith("1L:")]


def listing(folder):
    return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*"))


def same_model(a, b):
    """Bit-identical weights and the same history (wall-clock times aside)."""
    ha, hb = (json.loads((Path(d) / "history.json").read_text()) for d in (a, b))
    for h in (ha, hb):
        del h["wall_s"], h["tokens_per_s"]
    return ha == hb and sha256(Path(a) / "model.safetensors") == sha256(Path(b) / "model.safetensors")


def _signal_at(monkeypatch, stage, *signals):
    def hook(step):
        if step == stage:
            for s in signals:
                signal.raise_signal(s)

    monkeypatch.setattr(run_folder, "hook", hook)


# ---- 1. a symbolic link as --out ------------------------------------------------------------------
def test_a_symlinked_out_is_resolved_or_refused_before_the_first_step(tmp_path, docs, capsys, reference):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", loop)
    assert code == 2 and len(err) == 1 and "symbolic link that does not resolve" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "target")
    assert cli(capsys, *FAST, "--corpus-files", *docs, "--out", dangling)[0] == 0
    assert same_model(tmp_path / "target", reference) and same_model(dangling, reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "loop", "target"]
    code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", dangling, "--overwrite", "--seed", "1")
    assert code == 0 and dangling.is_symlink() and load_checkpoint(dangling).config["train"]["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "loop", "target"]


# ---- 2, 3. Ctrl-C and SIGTERM at each step of the final save ----------------------------------------
@pytest.mark.parametrize("stage", STAGES)
def test_a_signal_during_the_save_waits_for_the_model_to_be_in_place(tmp_path, docs, capsys, monkeypatch, reference, stage):
    out = tmp_path / "m"
    shutil.copytree(reference, out)  # --overwrite: an old model to replace
    _signal_at(monkeypatch, stage, signal.SIGTERM if stage == "written" else signal.SIGINT)
    code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", out, "--overwrite", "--seed", "1")
    assert code == 0 and load_checkpoint(out).config["train"]["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    if stage != "placed":  # after the swap signals are ignored: the model is already in place
        assert err == [f"python -m attncircuits.train: {'SIGTERM' if stage == 'written' else 'SIGINT'} during the save "
                       "was held until the model was in place"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_second_ctrl_c_during_the_save_keeps_the_model_and_says_where(tmp_path, docs, capsys, monkeypatch, reference, stage):
    out = tmp_path / "m"
    shutil.copytree(reference, out)
    old = sha256(out / "model.safetensors")
    _signal_at(monkeypatch, stage, signal.SIGINT, signal.SIGINT)
    argv = [*FAST, "--corpus-files", *docs, "--out", out, "--overwrite"]
    code, err = cli(capsys, *argv, "--seed", "1")
    if stage == "placed":  # ignored: the new model is in place and the folder tidied
        assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["m"]
        return
    assert code == 130 and len(err) == 1 and "interrupted while saving the model" in err[0], err
    assert sha256(out / "model.safetensors") == old  # the old model is still (or again) in place
    partial = tmp_path / "m.partial"
    if stage == "write":  # nothing of the new model written yet: the last evaluation's state is kept
        assert f"the progress up to step 2 of 4 is kept in {partial}" in err[0] and (partial / "resume").is_dir()
    else:
        assert f"the finished model is kept in {partial / 'final'}" in err[0]
        assert load_checkpoint(partial / "final").config["train"]["seed"] == 1
    monkeypatch.setattr(run_folder, "hook", lambda step: None)
    assert cli(capsys, *argv, "--seed", "1", "--resume")[0] == 0
    assert load_checkpoint(out).config["train"]["seed"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_kill_at_any_step_of_the_save_is_completed_by_resume(tmp_path, docs, capsys, monkeypatch, reference):
    """SIGKILL runs no handler: the folders as they were at each step (copied there) must let
    --resume end with the model of an uninterrupted run."""
    out, partial = tmp_path / "m", tmp_path / "m.partial"
    shutil.copytree(reference, out)
    frozen = {}

    def copy_at(step):
        frozen[step] = tmp_path / f"at {step}"
        for src in (out, partial):
            if src.exists():
                shutil.copytree(src, frozen[step] / src.name)

    monkeypatch.setattr(run_folder, "hook", copy_at)
    argv = [*FAST, "--corpus-files", *docs, "--out", out, "--overwrite"]
    assert cli(capsys, *argv)[0] == 0
    monkeypatch.setattr(run_folder, "hook", lambda step: None)
    assert sorted(frozen) == sorted(STAGES)
    for step, copy in frozen.items():
        shutil.rmtree(out)
        for p in copy.iterdir():
            shutil.copytree(p, tmp_path / p.name)
        code, err = cli(capsys, *argv, "--resume")
        assert code == 0 and same_model(out, reference) and not partial.exists(), (step, err)


# ---- 4. killed inside a state save ------------------------------------------------------------
def test_a_state_left_as_resume_new_is_continued(tmp_path, docs, capsys, monkeypatch, reference):
    from attncircuits.train import loop as T

    calls, make_batch = [], T.make_batch_checked

    def ctrl_c_at_step_3(*args):
        calls.append(1)
        if len(calls) == 4:
            signal.raise_signal(signal.SIGINT)
        return make_batch(*args)

    monkeypatch.setattr(T, "make_batch_checked", ctrl_c_at_step_3)
    out, partial = tmp_path / "m", tmp_path / "m.partial"
    argv = [*FAST, "--corpus-files", *docs, "--out", out]
    assert cli(capsys, *argv)[0] == 130
    monkeypatch.undo()
    (partial / "resume").rename(partial / "resume.new")  # killed between the two renames
    (partial / "resume.old").mkdir()  # and an older, incomplete one
    code, err = cli(capsys, *argv, "--resume")
    assert code == 0, err
    assert same_model(out, reference) and not partial.exists()


# ---- 5. a full disk -----------------------------------------------------------------------------
def _run_child(argv, fsize):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "attncircuits.train", *map(str, argv)], capture_output=True,
                          text=True, env=env, preexec_fn=limit, timeout=600)


def _err_lines(text):
    lines = text.replace("\r", "\n").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("1L:")]


def test_a_full_disk_in_a_child_process_is_one_line(tmp_path, docs):
    """ulimit -f 30: the resume state at the first evaluation does not fit."""
    child = _run_child([*FAST, "--corpus-files", *docs, "--out", tmp_path / "m"], 30 * 1024)
    err = _err_lines(child.stderr)
    assert child.returncode == 1 and err == [
        f"python -m attncircuits.train: error: cannot write {tmp_path / 'm.partial' / 'resume.new' / 'state.safetensors'} "
        "(File too large) during training; nothing was kept"], child.stderr
    assert not any(tmp_path.iterdir())


def test_a_full_disk_while_writing_the_tokenizer_is_one_line(tmp_path, docs, capsys):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # this process ignores SIGXFSZ, as Python does
    try:
        code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", tmp_path / "m")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 1 and err == [f"python -m attncircuits.train: error: cannot write {tmp_path / 'm.partial' / 'corpus' / 'tokenizer.json'} "
                                 "(File too large) before training started; nothing was kept"]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("errno", [28, 30, 13])  # ENOSPC, EROFS, EACCES
def test_an_io_error_writing_the_model_keeps_the_progress(tmp_path, docs, capsys, monkeypatch, errno):
    """A disk error on the model's weights: the half-written model is removed (freeing its space),
    the state of the last evaluation kept, and the line names both."""
    from attncircuits.checkpoints import pretrained

    real = pretrained.save_weights

    def failing(tensors, path):
        if path.name == "model.safetensors" and "final.new" in str(path):
            raise OSError(errno, os.strerror(errno), str(path))
        real(tensors, path)

    monkeypatch.setattr(pretrained, "save_weights", failing)
    out, partial = tmp_path / "m", tmp_path / "m.partial"
    argv = [*FAST, "--corpus-files", *docs, "--out", out]
    code, err = cli(capsys, *argv)
    assert code == 1 and err == [f"python -m attncircuits.train: error: cannot write {partial / 'final.new' / 'model.safetensors'} "
                                 f"({os.strerror(errno)}) while saving the model; the progress up to step 2 of 4 is kept "
                                 f"in {partial}: run the same command with --resume to continue"]
    assert not out.exists() and sorted(p.name for p in partial.iterdir()) == ["corpus", "in-progress.json", "resume",
                                                                              "run.json"]
    monkeypatch.undo()
    assert cli(capsys, *argv, "--resume")[0] == 0 and load_checkpoint(out)


# ---- 6. a user's files ----------------------------------------------------------------------------
def test_overwrite_never_deletes_a_users_files(tmp_path, docs, capsys, reference):
    out = tmp_path / "m"
    shutil.copytree(reference, out)
    (out / "my plots").mkdir()  # an empty folder of the user's in the model folder
    code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", out, "--overwrite")
    assert code == 2 and "files this program did not write" in err[0] and (out / "my plots").is_dir()
    (out / "my plots").rmdir()
    partial = tmp_path / "m.partial"  # a marked staging folder left by a killed run, with a user's file
    partial.mkdir()
    (partial / "in-progress.json").write_text("{}")
    (partial / "notes.txt").write_text("mine")
    code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", out, "--overwrite", "--seed", "1")
    assert code == 0 and load_checkpoint(out).config["train"]["seed"] == 1
    assert listing(partial) == ["notes.txt"] and (partial / "notes.txt").read_text() == "mine"
    assert err == [f"{partial} is kept: it holds files this program did not write (notes.txt)"]


# ---- 7. two runs into one --out ---------------------------------------------------------------------
def test_a_second_run_into_the_same_out_is_refused_while_the_first_lives(tmp_path, docs, capsys):
    out, partial = tmp_path / "m", tmp_path / "m.partial"
    first = subprocess.Popen([sys.executable, "-m", "attncircuits.train", *FAST, "--steps", "100000", "--eval-every",
                              "100000", "--corpus-files", *docs[:5], "--out", str(out)],
                             env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if (partial / "corpus" / "tokenizer.json").is_file():
                break
            time.sleep(0.1)
        code, err = cli(capsys, *FAST, "--corpus-files", *docs[5:], "--out", out)
        assert code == 2 and len(err) == 1 and f"another training run is writing {partial} (pid {first.pid}" in err[0]
        for extra in (["--resume"], ["--overwrite"]):
            assert f"(pid {first.pid}" in cli(capsys, *FAST, "--corpus-files", *docs[5:], "--out", out, *extra)[1][0]
        assert first.poll() is None and (partial / "corpus" / "tokenizer.json").is_file()  # the first run is untouched
    finally:
        first.kill()
        first.wait()
    code, err = cli(capsys, *FAST, "--corpus-files", *docs[5:], "--out", out)  # the lock died with it
    assert code == 0, err
    ck = load_checkpoint(out)
    assert ck.config["tokenizer_sha256"] == sha256(out / "tokenizer.json") and not partial.exists()


# ---- 8. the run id covers the corpus's contents ----------------------------------------------------
def test_resume_after_the_corpus_was_edited_is_refused(tmp_path, docs, capsys, monkeypatch):
    copies = tmp_path / "docs"
    shutil.copytree(Path(docs[0]).parent, copies)
    files = sorted(copies.iterdir())
    out = tmp_path / "m"
    argv = [*FAST, "--corpus-files", *files, "--out", out]
    _signal_at(monkeypatch, "write", signal.SIGINT, signal.SIGINT)
    assert cli(capsys, *argv)[0] == 130
    files[3].write_text(files[3].read_text().replace("dull", "bright"))
    code, err = cli(capsys, *argv, "--resume")
    assert code == 2 and len(err) == 1 and "started with other settings or files (corpus_sha256)" in err[0]


# ---- 9. a diverging run ----------------------------------------------------------------------------
def test_a_diverging_loss_stops_the_run_and_keeps_the_last_finite_state(tmp_path, docs, capsys, monkeypatch):
    from attncircuits.train import loop as T

    out, partial = tmp_path / "m", tmp_path / "m.partial"
    code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", out, "--lr", "1e30", "--warmup-steps", "0",
                    "--min-lr-frac", "1")
    assert code == 1 and len(err) == 1 and "training diverged at step 1: the loss is nan at learning rate 1e+30" in err[0], err
    assert err[0].endswith("nothing was kept; run again with a lower --lr than 1e+30") and not any(tmp_path.iterdir())
    calls, loss_fn = [], T.loss_fn

    def nan_from_step_5(logits, *args, **kwargs):  # a training loss NaN at step 5, after the state of step 4
        calls.append(logits.requires_grad)  # (an evaluation's runs without gradients)
        loss = loss_fn(logits, *args, **kwargs)
        return loss * float("nan") if logits.requires_grad and sum(calls) == 6 else loss

    monkeypatch.setattr(T, "loss_fn", nan_from_step_5)
    code, err = cli(capsys, *FAST, "--steps", "8", "--corpus-files", *docs, "--out", out)
    lr = T.lr_at(5, T.TrainConfig(steps=8))
    assert code == 1 and err == [f"python -m attncircuits.train: error: training diverged at step 5: the loss is nan at learning rate "
                                 f"{lr:.3g}; the last finite state (step 4) is kept in {partial}; delete it and run again with a "
                                 "lower --lr"]
    state = load_file(partial / "resume" / "state.safetensors")
    assert not out.exists() and all(torch.isfinite(v).all() for k, v in state.items() if k.startswith("model/"))


# ---- 12. a damaged resume state ---------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "forged", "weights"])
def test_a_damaged_resume_state_is_refused_in_one_line(tmp_path, docs, capsys, monkeypatch, damage):
    from attncircuits.core.manifest import write_manifest

    out, partial = tmp_path / "m", tmp_path / "m.partial"
    argv = [*FAST, "--corpus-files", *docs, "--out", out]
    _signal_at(monkeypatch, "write", signal.SIGINT, signal.SIGINT)
    assert cli(capsys, *argv)[0] == 130
    state = partial / "resume"
    if damage == "truncated":
        (state / "state.json").write_text((state / "state.json").read_text()[:40])
    elif damage == "forged":
        (state / "state.json").write_text(json.dumps({"step": 3}))
    else:
        (state / "state.safetensors").write_bytes(b"\0" * 100)
    if damage != "weights":
        write_manifest(state)
    code, err = cli(capsys, *argv, "--resume")
    assert code == 2 and len(err) == 1 and f"delete {partial} to start over" in err[0], err
    assert "git checkout" not in err[0] and "damaged" in err[0] and partial.is_dir()
    code, err = cli(capsys, *argv)  # without --resume: never a loop of advice between the two
    assert code == 2 and len(err) == 1 and ("--resume" in err[0] if damage == "forged" else f"delete {partial}" in err[0])


# ---- 13. a batch that cannot fit in memory ---------------------------------------------------------
def test_a_batch_too_big_for_memory_is_refused_before_anything_is_written(tmp_path, docs, capsys):
    code, err = cli(capsys, *FAST, "--corpus-files", *docs, "--out", tmp_path / "m", "--batch-size", "100000000")
    assert code == 2 and len(err) == 1 and "--batch-size 100000000 needs about" in err[0] and "GiB" in err[0]
    assert not any(tmp_path.iterdir())
