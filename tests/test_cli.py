"""`python -m attncircuits.train`: bad commands are refused before any work, one line each; a user's
files are never deleted; Ctrl-C keeps a resumable state and --resume finishes the run exactly."""

import json
import signal
import stat

import pytest
import torch

from attncircuits import data, load_checkpoint
from attncircuits.checkpoints.pretrained import CORPUS_DIR
from attncircuits.core.manifest import sha256
from attncircuits.train import loop as T
from attncircuits.train.cli import main

# a seconds-long run: the tiny preset on a small local corpus
FAST = ["--preset", "tiny", "--steps", "6", "--eval-every", "2", "--eval-batches", "1", "--batch-size", "4",
        "--threads", "1"]


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(10):
        (folder / f"{i}.txt").write_text(f"File {i}. " + f"all work and no play makes model {i} dull. " * 30)
    return sorted(map(str, folder.iterdir()))


def cli(capsys, *argv):
    """Exit status and the lines the command wrote to stderr, less the progress bar's."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as stop:
        code = stop.code
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    return code, [line for line in lines if line.strip() and not line.startswith("1L:")]


def listing(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_users_folder_is_never_deleted(tmp_path, docs, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    for extra in ([], ["--overwrite"]):
        code, err = cli(capsys, *FAST, "--out", mine, "--corpus-files", *docs, *extra)
        assert code == 2 and len(err) == 1 and "not a model folder" in err[0], err
    assert (mine / "notes.txt").read_text() == "my notes" and listing(mine) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = cli(capsys, *FAST, "--out", empty, "--corpus-files", *docs, "--overwrite")
    assert code == 2 and "an empty folder, not a model folder" in err[0] and empty.is_dir()
    assert not (tmp_path / "mine.partial").exists() and not (tmp_path / "empty.partial").exists()


def test_overwrite_replaces_only_a_model_this_program_wrote(tmp_path, docs, capsys):
    out = tmp_path / "model"
    assert cli(capsys, *FAST, "--out", out, "--corpus-files", *docs)[0] == 0
    code, err = cli(capsys, *FAST, "--out", out, "--corpus-files", *docs)
    assert code == 2 and "already holds a model; pass --overwrite" in err[0]
    assert cli(capsys, *FAST, "--out", out, "--corpus-files", *docs, "--overwrite")[0] == 0
    (out / "my_analysis.txt").write_text("keep me")
    code, err = cli(capsys, *FAST, "--out", out, "--corpus-files", *docs, "--overwrite")
    assert code == 2 and "files this program did not write" in err[0]
    assert (out / "my_analysis.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "model"]  # no .partial, no .tokenizer.json


@pytest.mark.parametrize("where, expected", [
    ("/proc/attncircuits-model", "cannot write"),
    (".", "not a model folder"),
    ("a_file", "is a file, not a model folder"),
    ("a_file/model", "does not exist; create it first"),
    ("missing/model", "does not exist; create it first"),
])
def test_output_path_is_checked_before_training(tmp_path, docs, capsys, monkeypatch, where, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine")
    before = listing(tmp_path)
    trained = []
    monkeypatch.setattr(data, "train_tokenizer", lambda *a, **k: trained.append(1))  # must not be reached
    code, err = cli(capsys, *FAST, "--out", where, "--corpus-files", *docs)
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not trained and listing(tmp_path) == before and (tmp_path / "a_file").read_text() == "mine"


def _no_cuda_device():
    return "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"


@pytest.mark.parametrize("argv, expected", [
    (["--steps", "-5"], "--steps must be a whole number >= 1 (got -5)"),
    (["--steps", "0"], "--steps must be a whole number >= 1 (got 0)"),
    (["--eval-every", "0"], "--eval-every must be a whole number >= 1 (got 0)"),
    (["--eval-batches", "0"], "--eval-batches must be a whole number >= 1 (got 0)"),
    (["--batch-size", "0"], "--batch-size must be a whole number >= 1 (got 0)"),
    (["--warmup-steps", "-1"], "--warmup-steps must be a whole number >= 0 (got -1)"),
    (["--seed", "-1"], "--seed must be a whole number >= 0 (got -1)"),
    (["--lr", "0"], "--lr must be a number > 0 (got 0.0)"),
    (["--lr", "nan"], "--lr must be a number > 0 (got nan)"),
    (["--grad-clip", "0"], "--grad-clip must be a number > 0 (got 0.0)"),
    (["--weight-decay", "-1"], "--weight-decay must be a number >= 0 (got -1.0)"),
    (["--min-lr-frac", "1.5"], "--min-lr-frac must be between 0 and 1 (got 1.5)"),
    (["--repeat-frac", "2"], "--repeat-frac must be between 0 and 1 (got 2.0)"),
    (["--random-repeat-frac", "-0.1"], "--random-repeat-frac must be between 0 and 1 (got -0.1)"),
    (["--repeat-frac", "1", "--random-repeat-frac", "0.5"], "--repeat-frac plus --random-repeat-frac must be at most 1"),
    (["--snapshot-steps", "0", "99"], "--snapshot-steps must lie between 0 and steps=6 (got [99])"),
    (["--threads", "-1"], "--threads must be a whole number >= 1 (got -1)"),
    (["--threads", "0"], "--threads must be a whole number >= 1 (got 0)"),
    (["--device", "bogus"], "--device 'bogus' is not a device; use one of cpu"),
    (["--device", "meta"], "--device 'meta' is not available here"),
    (["--device", "mps"], "--device 'mps' is not available here"),
    (["--device", _no_cuda_device()], "; use one of cpu"),
    (["--steps", "abc"], "argument --steps: invalid int value: 'abc' (see --help)"),
    (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    (["--prepare-corpus"], "--prepare-corpus and --corpus-files exclude each other"),
])
def test_bad_arguments_are_refused_in_one_line(tmp_path, docs, capsys, argv, expected):
    before = listing(tmp_path)
    code, err = cli(capsys, *FAST, "--out", tmp_path / "m", "--corpus-files", *docs, *argv)
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert err[0].startswith("python -m attncircuits.train: error: ")
    assert listing(tmp_path) == before


def test_every_bad_argument_is_named_at_once(tmp_path, docs, capsys):
    code, err = cli(capsys, *FAST, "--out", tmp_path / "m", "--corpus-files", *docs, "--steps", "-5",
                    "--batch-size", "0", "--threads", "-1")
    assert code == 2 and [line.split(": error: ")[1].split()[0] for line in err] == ["--steps", "--batch-size",
                                                                                     "--threads"]


def test_binary_corpus_files_are_refused(tmp_path, docs, capsys):
    blob = tmp_path / "weights.bin"
    blob.write_bytes(bytes(range(256)) * 40)
    code, err = cli(capsys, *FAST, "--out", tmp_path / "m", "--corpus-files", *docs, blob)
    assert code == 1 and len(err) == 1 and f"corpus file {blob} is not text" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "weights.bin"]


def test_a_failed_run_leaves_nothing_behind(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("too short for a context of 64 tokens")
    code, err = cli(capsys, *FAST, "--out", tmp_path / "m", "--corpus-files", short)
    assert code == 2 and "fewer than the context of 64" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.txt"]  # no m.partial, no m.tokenizer.json


def test_load_corpus_takes_one_path_or_several(tmp_path, docs):
    one = data.load_corpus(docs[0])
    assert one.train == one.validation and one.train[0][0] == docs[0]
    assert data.load_corpus(docs) == data.load_corpus([str(d) for d in reversed(docs)])
    with pytest.raises(FileNotFoundError, match=r"corpus files not found: \['nope.txt'\]"):
        data.load_corpus("nope.txt")
    with pytest.raises(ValueError, match="no corpus files given"):
        data.load_corpus([])
    (tmp_path / "nul.txt").write_bytes(b"text with a \0 byte")
    with pytest.raises(ValueError, match="is not text"):
        data.load_corpus(tmp_path / "nul.txt")


def _interrupt_at(monkeypatch, step):
    """Press Ctrl-C while the batch of training step ``step`` is being drawn."""
    calls, make_batch = [], T.make_batch_checked

    def batch_then_ctrl_c(*args):
        calls.append(1)
        if len(calls) == step + 1:
            signal.raise_signal(signal.SIGINT)
        return make_batch(*args)

    monkeypatch.setattr(T, "make_batch_checked", batch_then_ctrl_c)


def _same_run(a, b):
    ha, hb = (json.loads((d / "history.json").read_text()) for d in (a, b))
    for h in (ha, hb):
        del h["wall_s"], h["tokens_per_s"]
    return ha == hb and {p: sha256(a / p) for p in listing(a) if p.endswith(".safetensors")} == {
        p: sha256(b / p) for p in listing(b) if p.endswith(".safetensors")}


def test_ctrl_c_keeps_a_state_that_resume_finishes_exactly(tmp_path, docs, capsys, monkeypatch):
    run = [*FAST, "--steps", "8", "--snapshot-steps", "0", "3", "6", "--corpus-files", *docs]
    assert cli(capsys, *run, "--out", tmp_path / "whole")[0] == 0
    _interrupt_at(monkeypatch, 5)
    handler = signal.getsignal(signal.SIGINT)
    code, err = cli(capsys, *run, "--out", tmp_path / "cut")
    assert code == 130 and len(err) == 1 and "interrupted before step 6 of 8" in err[0] and "--resume" in err[0]
    assert signal.getsignal(signal.SIGINT) is handler  # the caller's handler is back
    partial = tmp_path / "cut.partial"
    assert not (tmp_path / "cut").exists() and {"in-progress.json", "corpus/tokenizer.json", "resume/manifest.json",
                                                "resume/state.json", "resume/state.safetensors"} <= set(listing(partial))
    assert json.loads((partial / "resume" / "state.json").read_text())["step"] == 6
    monkeypatch.undo()
    code, err = cli(capsys, *run, "--out", tmp_path / "cut")
    assert code == 2 and "holds an interrupted run (stopped before step 6): add --resume" in err[0]
    code, err = cli(capsys, *run, "--steps", "10", "--out", tmp_path / "cut", "--resume")
    assert code == 2 and "started with other settings or files (train)" in err[0] and partial.is_dir()
    assert cli(capsys, *run, "--out", tmp_path / "cut", "--resume")[0] == 0
    assert not partial.exists() and _same_run(tmp_path / "whole", tmp_path / "cut")
    assert load_checkpoint(tmp_path / "cut").snapshot_steps == [0, 3, 6]


def test_resume_needs_an_interrupted_run_and_a_partial_folder_of_this_program(tmp_path, docs, capsys):
    code, err = cli(capsys, *FAST, "--out", tmp_path / "m", "--corpus-files", *docs, "--resume")
    assert code == 2 and "there is no interrupted run to continue" in err[0]
    users = tmp_path / "m.partial"
    users.mkdir()
    (users / "x.txt").write_text("mine")
    code, err = cli(capsys, *FAST, "--out", tmp_path / "m", "--corpus-files", *docs)
    assert code == 2 and "was not written by this program" in err[0] and (users / "x.txt").read_text() == "mine"


def test_prepare_corpus_writes_only_under_out(tmp_path, docs, capsys, monkeypatch):
    stdlib = tmp_path / "docs"  # stands in for the standard library, to keep the test fast
    monkeypatch.setattr(data.sysconfig, "get_paths", lambda: {"stdlib": str(stdlib)})
    shipped = {p: sha256(CORPUS_DIR / p) for p in listing(CORPUS_DIR)}
    out = tmp_path / "elsewhere"
    assert cli(capsys, *FAST, "--prepare-corpus", "--out", out)[0] == 0
    assert {p: sha256(CORPUS_DIR / p) for p in listing(CORPUS_DIR)} == shipped
    assert {"corpus/tokenizer.json", "corpus/val_tokens.safetensors", "corpus/manifest.json"} <= set(listing(out))
    assert sha256(out / "tokenizer.json") == sha256(out / "corpus" / "tokenizer.json")
    modes = {p: stat.S_IMODE((out / p).stat().st_mode) for p in listing(out) if (out / p).is_file()}
    assert set(modes.values()) == {0o644}, modes  # umask 022 here, as in the test run
    assert load_checkpoint(out).model.cfg.d_vocab == load_checkpoint(out).tokenizer.get_vocab_size()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "elsewhere"]


def test_ctrl_c_before_the_first_step_leaves_nothing(tmp_path, docs, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "train_tokenizer", interrupted)
    code, err = cli(capsys, *FAST, "--out", tmp_path / "m", "--corpus-files", *docs)
    assert code == 130 and err == ["python -m attncircuits.train: error: interrupted before training started; "
                                   "nothing was kept"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]
