"""ATTNCIRCUITS_MODELS: one switch points every loader at another set of models and its corpus;
a set the chapters cannot read is refused at the first load, in one line naming the fix."""

import json
from pathlib import Path
import shutil

import pytest
import torch

from attncircuits import ModelConfig, Transformer, data
from attncircuits.checkpoints import modelset, pretrained
from attncircuits.checkpoints.modelset import ENV, ModelSetError, check_model_set
from attncircuits.checkpoints.pretrained import CORPUS_DIR, PRETRAINED_DIR, load_pretrained, save_checkpoint

SHIPPED_TOKENIZER = CORPUS_DIR / "tokenizer.json"
NAMES = modelset.SET_MODEL_NAMES


def tiny(n_layers, d_vocab):
    torch.manual_seed(n_layers)
    return Transformer(ModelConfig(n_layers=n_layers, d_model=16, n_heads=2, d_head=8,
                                              d_vocab=d_vocab, n_ctx=128))


def make_set(folder, tokenizer=SHIPPED_TOKENIZER, names=NAMES, seed=3):
    folder.mkdir(exist_ok=True)
    d_vocab = data.load_tokenizer(tokenizer).get_vocab_size()
    for i, name in enumerate(names):
        save_checkpoint(tiny(int(name[-2]), d_vocab), folder / name, tokenizer, meta={"train": {"seed": seed}})
    return folder


@pytest.fixture
def own_tokenizer(tmp_path):
    texts = [f"def f{i}(x):\n    return x + {i} * y_{i % 7}\n" * 40 for i in range(60)]
    path = tmp_path / "own-tokenizer.json"
    data.train_tokenizer(texts, 300).save(str(path))
    return path


def error(monkeypatch, folder) -> str:
    monkeypatch.setenv(ENV, str(folder))
    with pytest.raises(ModelSetError) as info:
        check_model_set()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{ENV}=") and f"unset {ENV}" in msg, msg
    with pytest.raises(ModelSetError):  # the first load raises the same, before anything is read
        load_pretrained("attn-only-2l")
    return msg


@pytest.mark.parametrize("value", [None, "", "  "])
def test_unset_or_empty_means_the_shipped_models(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert check_model_set() == "models: the shipped ones"
    assert load_pretrained("attn-only-1l").directory == PRETRAINED_DIR / "attn-only-1l"
    assert pretrained.corpus_dir() == CORPUS_DIR


@pytest.mark.parametrize("env, read", [(ENV, modelset.current_dir), (modelset.FAMILY_ENV, modelset.family_dir)])
def test_a_relative_folder_is_found_from_the_current_folder_or_the_checkout(tmp_path, monkeypatch, env, read):
    """The reproduces page says `export ATTNCIRCUITS_MODELS=replicates/seed-1` at the repository's
    root; the kernel then runs in notebooks/, where that path names nothing."""
    root = Path(modelset.__file__).resolve().parents[3]
    monkeypatch.chdir(root / "notebooks")
    monkeypatch.setenv(env, "replicates/seed-1")
    assert read() == root / "replicates" / "seed-1"
    (tmp_path / "replicates" / "seed-1").mkdir(parents=True)  # one in the current folder comes first
    monkeypatch.chdir(tmp_path)
    assert read() == tmp_path / "replicates" / "seed-1"
    monkeypatch.setenv(env, "nowhere/seed-9")  # found nowhere: named from the current folder
    assert read() == tmp_path / "nowhere" / "seed-9"
    monkeypatch.setenv(env, "~/x")
    assert read() == Path.home() / "x"


def test_a_replicate_set_is_loaded_and_reads_the_shipped_corpus(tmp_path, monkeypatch):
    shipped_windows = pretrained.validation_windows(8)
    make_set(tmp_path / "seed-3")
    monkeypatch.setenv(ENV, str(tmp_path / "seed-3"))
    assert "the shipped corpus" in check_model_set()
    for name in NAMES:
        ck = load_pretrained(name)
        assert ck.directory == tmp_path / "seed-3" / name and ck.model.cfg.d_model == 16
    assert torch.equal(pretrained.validation_windows(8), shipped_windows)
    assert modelset.model_dir("ln-mlp-4l") == PRETRAINED_DIR / "ln-mlp-4l"  # chapter 10's: shipped tokens
    monkeypatch.chdir(tmp_path)  # a relative path is read from the current folder
    monkeypatch.setenv(ENV, "seed-3")
    assert load_pretrained("attn-only-0l").directory == tmp_path / "seed-3" / "attn-only-0l"


def test_a_set_with_its_own_tokenizer_reads_its_own_corpus(tmp_path, monkeypatch, own_tokenizer):
    from attncircuits.train import prepare_corpus

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(12):
        (docs / f"m{i}.py").write_text(f"def g{i}(a, b):\n    return a * {i} + b\n" * 80)
    corpus = data.load_corpus(sorted(docs.iterdir()))
    s = make_set(tmp_path / "mine", own_tokenizer)
    assert error(monkeypatch, s).endswith(f"make the set with `make train-mine CORPUS='...' OUT={s}`, or unset {ENV} "
                                          "to use the shipped models")
    prepare_corpus(300, s / "corpus", corpus=corpus, tokenizer_path=own_tokenizer)
    assert f"the corpus in {s / 'corpus'}" in check_model_set()
    val = pretrained.load_validation_tokens()
    assert int(val.max()) < 300 and len(val) == pretrained.corpus_info()["validation_tokens"]
    with pytest.raises(ModelSetError, match="has no ln-mlp-4l and reads its own tokenizer"):
        load_pretrained("ln-mlp-4l")
    # a corpus tokenized with another tokenizer than the models'
    shutil.copyfile(SHIPPED_TOKENIZER, s / "corpus" / "tokenizer.json")
    assert "was tokenized with another tokenizer" in error(monkeypatch, s)


def test_a_missing_folder_or_a_file_is_refused(tmp_path, monkeypatch):
    msg = error(monkeypatch, tmp_path / "nope")
    assert "nope does not exist" in msg and "make replicate SEED=1" in msg and "make train-mine" in msg
    (tmp_path / "file").write_text("x")
    assert "is a file, not a folder" in error(monkeypatch, tmp_path / "file")
    make_set(tmp_path / "s")
    assert "one model's folder, not a set" in error(monkeypatch, tmp_path / "s" / "attn-only-1l")


@pytest.mark.parametrize("missing", NAMES)
def test_a_set_with_one_model_missing_names_it_and_the_command(tmp_path, monkeypatch, missing):
    s = make_set(tmp_path / "s", names=[n for n in NAMES if n != missing], seed=7)
    msg = error(monkeypatch, s)
    assert f"the set has no {missing}" in msg
    assert f"`python -m attncircuits.train --preset {missing} --seed 7 --out {s / missing}`" in msg
    (s / modelset.SET_FILE).write_text(json.dumps({"command": "make replicate SEED=7"}))
    assert "train it with `make replicate SEED=7`" in error(monkeypatch, s)


def test_a_half_written_replicate_is_refused_with_the_resume_command(tmp_path, monkeypatch):
    s = make_set(tmp_path / "s", names=NAMES[:2], seed=2)
    (s / "attn-only-2l.partial" / "resume").mkdir(parents=True)
    msg = error(monkeypatch, s)
    assert "attn-only-2l is half-written" in msg and "--resume" in msg and "--seed 2" in msg
    (s / "attn-only-2l").mkdir()  # a folder without config.json is no finished model either
    assert "config.json is missing or unreadable" in error(monkeypatch, s)


def test_a_vocabulary_that_differs_from_the_tokenizer_is_refused(tmp_path, monkeypatch, own_tokenizer):
    s = make_set(tmp_path / "s")
    shutil.copyfile(own_tokenizer, s / "attn-only-1l" / "tokenizer.json")
    msg = error(monkeypatch, s)
    assert "attn-only-1l has a vocabulary of 2048 tokens but its tokenizer.json has 300" in msg
    assert "--preset attn-only-1l --seed 3" in msg
    (s / "attn-only-1l" / "tokenizer.json").write_text("{not json")
    assert "tokenizer.json is missing or unreadable" in error(monkeypatch, s)


def test_models_that_read_different_tokenizers_are_refused(tmp_path, monkeypatch, own_tokenizer):
    s = make_set(tmp_path / "s")
    shutil.rmtree(s / "attn-only-2l")
    save_checkpoint(tiny(2, 300), s / "attn-only-2l", own_tokenizer)
    assert "attn-only-2l reads another tokenizer than attn-only-0l" in error(monkeypatch, s)
