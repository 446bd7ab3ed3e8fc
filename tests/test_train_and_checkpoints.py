"""Training lowers the loss and reruns bit for bit; checkpoints round-trip and refuse bad or
tampered files."""

import hashlib
import json
import shutil
import stat

import numpy as np
import pytest
import torch

from attncircuits import ModelConfig, load_checkpoint, load_pretrained
from attncircuits.checkpoints.pretrained import CORPUS_DIR, save_checkpoint
from attncircuits.train import PRESETS, TrainConfig, lr_at, train
from attncircuits.train.cli import main

TOKENIZER = CORPUS_DIR / "tokenizer.json"


def tiny_run():
    rng = np.random.default_rng(0)
    stream = np.tile(rng.integers(1, 2048, 40), 60).astype(np.uint16)  # a short text repeated
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_head=16, n_ctx=32)
    tcfg = TrainConfig(steps=40, batch_size=8, eval_every=20, eval_batches=1, warmup_steps=5, snapshot_steps=[0, 20])
    return train(cfg, tcfg, stream, stream, progress=False)


@pytest.fixture(scope="module")
def trained():
    return tiny_run()


def test_a_rerun_on_the_same_machine_is_bit_identical(trained):
    """What `make train` promises on one machine: the same losses and the same weights, bit for bit
    (across machines, see test_shipped_models.py: equal within a tolerance)."""
    def fingerprint(run):
        model, history, snaps = run
        h = hashlib.sha256()
        for sd in (model.state_dict(), *snaps.values()):
            for k, v in sorted(sd.items()):
                h.update(k.encode() + v.detach().cpu().numpy().tobytes())
        return {k: v for k, v in history.items() if k not in ("wall_s", "tokens_per_s")}, h.hexdigest()

    assert fingerprint(tiny_run()) == fingerprint(trained)


def test_training_lowers_loss(trained):
    _, history, snaps = trained
    assert history["val_loss"][-1] < history["val_loss"][0] - 1.0
    assert sorted(snaps) == [0, 20]
    assert len(history["prefix_matching"][0]) == 1 and len(history["prev_token"][0][0]) == 2


def test_lr_schedule():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr_frac=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(100, cfg) == pytest.approx(0.1)


def test_save_load_round_trip(trained, tmp_path):
    model, history, snaps = trained
    out = save_checkpoint(model, tmp_path / "m", TOKENIZER, meta={"preset": "test"}, history=history, snapshots=snaps)
    ck = load_checkpoint(out)
    tokens = torch.randint(0, 2048, (2, 16))
    with torch.no_grad():  # fp16 storage: equal up to half precision
        torch.testing.assert_close(ck.model(tokens), model(tokens), atol=0.05, rtol=0.01)
    assert ck.snapshot_steps == [0, 20] and ck.history["step"] == history["step"]
    assert ck.load_snapshot(20).cfg == model.cfg
    with pytest.raises(FileNotFoundError, match="available steps"):
        ck.load_snapshot(7)
    with pytest.raises(FileExistsError, match="overwrite"):
        save_checkpoint(model, out, TOKENIZER)
    save_checkpoint(model, out, TOKENIZER, overwrite=True)
    assert not (tmp_path / "m.partial").exists()


@pytest.fixture
def saved(trained, tmp_path):
    return save_checkpoint(trained[0], tmp_path / "m", TOKENIZER)


def test_tampered_weights_are_refused(saved):
    w = saved / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its SHA-256"):
        load_checkpoint(saved)


def test_saved_files_have_the_usual_mode(saved):
    umask_mode = stat.S_IMODE((saved / "config.json").stat().st_mode)  # written by plain open()
    assert {stat.S_IMODE(p.stat().st_mode) for p in saved.rglob("*") if p.is_file()} == {umask_mode}


@pytest.mark.parametrize("text, expected", [
    ("", "manifest.json is corrupt"),
    ("{not json", "manifest.json is corrupt"),
    ('{"files": {}}', "manifest.json is corrupt"),
    ('{"sha256": ["model.safetensors"]}', "manifest.json is corrupt"),
    ('{"sha256": {}}', "manifest.json lists no files"),
])
def test_unusable_manifest_is_refused(saved, text, expected):
    (saved / "manifest.json").write_text(text)
    with pytest.raises(ValueError, match=expected) as err:
        load_checkpoint(saved)
    assert f"git checkout -- {saved}" in str(err.value)


def test_weights_left_out_of_the_manifest_are_refused(saved):
    manifest = json.loads((saved / "manifest.json").read_text())
    del manifest["sha256"]["model.safetensors"]
    (saved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="model.safetensors is not listed in"):
        load_checkpoint(saved)


def test_nan_weights_never_load(trained, tmp_path):
    model = trained[0]
    broken = {k: v.clone() for k, v in model.state_dict().items()}
    broken["W_E"][3, 5] = float("nan")
    bad = ModelConfig.from_dict(model.cfg.to_dict())
    from attncircuits import Transformer

    nan_model = Transformer(bad)
    nan_model.load_state_dict(broken)
    out = save_checkpoint(nan_model, tmp_path / "nan", TOKENIZER)  # manifest matches: only the check catches it
    with pytest.raises(ValueError, match="holds NaN or infinite weights \\(W_E\\)"):
        load_checkpoint(out)


def test_snapshots_are_verified_before_use(trained, tmp_path):
    model, history, snaps = trained
    out = save_checkpoint(model, tmp_path / "s", TOKENIZER, snapshots=snaps)
    ck = load_checkpoint(out)
    path = out / "snapshots" / "step_000020.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="step_000020.safetensors does not match its SHA-256"):
        ck.load_snapshot(20)
    shutil.copy(out / "snapshots" / "step_000000.safetensors", out / "snapshots" / "step_000010.safetensors")
    with pytest.raises(ValueError, match="step_000010.safetensors is not listed in"):
        ck.load_snapshot(10)
    with pytest.raises(ValueError, match="step_000010.safetensors is not listed in"):
        load_checkpoint(out)


def test_missing_tokenizer(saved):
    (saved / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_checkpoint(saved)


def test_config_disagrees_with_weights(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["model"]["d_model"] = 64
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="disagree"):
        load_checkpoint(saved, verify=False)


def test_corrupt_weights_file(saved):
    (saved / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_checkpoint(saved, verify=False)


def test_missing_directory_and_unknown_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_checkpoint(tmp_path / "nothing")
    with pytest.raises(KeyError, match="attn-only-0l, attn-only-1l, attn-only-2l"):
        load_pretrained("attn-only-3l")


def test_cli_refuses_existing_output(saved, capsys):
    with pytest.raises(SystemExit):
        main(["--preset", "tiny", "--out", str(saved)])
    assert "--overwrite" in capsys.readouterr().err


def test_cli_trains_on_local_files(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(10):
        (docs / f"{i}.txt").write_text(f"File {i}. " + "all work and no play makes a dull model. " * 30)
    out = tmp_path / "model"
    main(["--preset", "tiny", "--out", str(out), "--steps", "5", "--eval-every", "5", "--eval-batches", "1",
          "--corpus-files", *map(str, sorted(docs.iterdir()))])
    ck = load_checkpoint(out)
    assert ck.model.cfg.n_ctx == 64 and ck.history["step"] == [0, 5]
    assert ck.tokenizer.get_vocab_size() == ck.model.cfg.d_vocab
    shutil.rmtree(out)


def test_one_and_two_layer_presets_share_one_recipe():
    def recipe(name):
        model_kw, train_kw = PRESETS[name]
        cfg = TrainConfig(**{k: v for k, v in train_kw.items() if k != "snapshot_steps"})
        return {k: v for k, v in model_kw.items() if k != "n_layers"}, cfg

    assert recipe("attn-only-1l") == recipe("attn-only-2l")  # they differ in depth only
    _, zero = recipe("attn-only-0l")
    assert zero.repeat_frac == zero.random_repeat_frac == 0.0  # plain text: no context to use


def test_validation_windows():
    from attncircuits.checkpoints.pretrained import load_validation_tokens, validation_windows

    val = load_validation_tokens()
    every = validation_windows(n_ctx=64)
    assert every.shape == (len(val) // 64, 64) and torch.equal(every[1], val[64:128])
    spread = validation_windows(5, n_ctx=64)
    assert torch.equal(spread[0], every[0]) and torch.equal(spread[-1], every[-1])
    with pytest.raises(ValueError, match="n_windows must be between 1 and"):
        validation_windows(10**6)


# ---- what the config and the manifest cannot vouch for --------------------------------------------
def _forge(saved, weights=None, config=None, tokenizer=None):
    """Rewrite a checkpoint's files and then its manifest, as a tool that rewrites both would."""
    from safetensors.torch import save_file

    from attncircuits.core.manifest import write_manifest

    if weights is not None:
        save_file(weights, saved / "model.safetensors")
    if config is not None:
        (saved / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        shutil.copyfile(tokenizer, saved / "tokenizer.json")
    write_manifest(saved)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.int64, torch.uint8])
def test_weights_that_are_not_floats_are_refused(saved, dtype):
    sd = {k: v.to(dtype) for k, v in load_checkpoint(saved).model.state_dict().items()}
    _forge(saved, weights=sd)
    with pytest.raises(ValueError, match="holds tensors that are not float weights: W_E"):
        load_checkpoint(saved)


def test_another_models_tokenizer_of_the_same_size_is_refused(saved, tmp_path):
    from attncircuits import data

    other = tmp_path / "other.json"
    texts = [f"some other text number {i} " * 20 for i in range(50)]
    data.train_tokenizer(texts, 2048).save(str(other))
    assert json.loads((saved / "config.json").read_text())["tokenizer_sha256"] == hashlib.sha256(
        (saved / "tokenizer.json").read_bytes()).hexdigest()
    _forge(saved, tokenizer=other)
    with pytest.raises(ValueError, match="is not the tokenizer these weights were trained with"):
        load_checkpoint(saved)


def test_shapes_are_compared_before_anything_is_allocated(saved):
    import time
    import tracemalloc

    cfg = json.loads((saved / "config.json").read_text())
    cfg["model"]["d_vocab"] = 10**9  # 512 GB of float32 weights, were the model built first
    _forge(saved, config=cfg)
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"disagree .*'W_E': \(\(1000000000, 32\), \(2048, 32\)\)"):
        load_checkpoint(saved)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.perf_counter() - t0 < 5 and peak < 50 * 2**20


def test_the_course_sizes_read_their_shapes_on_the_cpu_and_load_without_torch_dynamo():
    """Arithmetic on torch's meta device imports torch._dynamo and sympy (about 2 s in every
    notebook and process that loads a checkpoint): the course's sizes are built on the CPU, with
    the same shapes, the caller's random state untouched, and an upper bound on what they allocate."""
    import subprocess
    import sys

    from attncircuits.checkpoints import weights_file
    from attncircuits.train import family

    for name in family.MEMBERS:
        cfg = family.member_configs(name)[0]
        with torch.device("meta"):
            meta = {k: tuple(v.shape) for k, v in cfg.build().weights().items()}
        torch.manual_seed(3)
        shapes, after = weights_file.expected_shapes(cfg), torch.rand(1)
        torch.manual_seed(3)
        assert shapes == meta and torch.equal(after, torch.rand(1)), name
        model = cfg.build()
        numbers = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
        assert numbers <= weights_file._size_bound(cfg) <= weights_file.SHAPES_ON_CPU, name
    code = ("import sys, attncircuits; [attncircuits.load_pretrained(n) for n in ('attn-only-1l', 'attn-only-2l')]; "
            "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_shipped_model_names_its_tokenizer():
    from attncircuits.checkpoints.pretrained import MODEL_NAMES
    from attncircuits.core.manifest import sha256

    for name in MODEL_NAMES:
        ck = load_pretrained(name)
        assert ck.config["tokenizer_sha256"] == sha256(ck.directory / "tokenizer.json")


@pytest.mark.parametrize("call, error, expected", [
    (lambda: load_pretrained("attn-only-1l", device="bogus"), ValueError, "device 'bogus' is not a device; use one of cpu"),
    (lambda: load_pretrained("attn-only-1l", device="cuda:99"), ValueError, "is not available here (torch"),
    (lambda: load_pretrained(4), KeyError, "unknown model 4"),
    (lambda: load_checkpoint(4), TypeError, "directory must be a path"),
    (lambda: load_checkpoint(None), TypeError, "directory must be a path"),
    (lambda: load_checkpoint("x" * 300), FileNotFoundError, "cannot be read"),
])
def test_bad_load_arguments_are_refused_in_one_line(call, error, expected):
    with pytest.raises(error, match=expected.replace("(", r"\(")) as err:
        call()
    assert "\n" not in str(err.value)
