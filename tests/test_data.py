"""Corpus selection, tokenizer round trip, display helpers and batches."""

import pytest
import torch

from attncircuits import data
from attncircuits.checkpoints.pretrained import CORPUS_DIR


@pytest.fixture(scope="module")
def tokenizer():
    return data.load_tokenizer(CORPUS_DIR / "tokenizer.json")


@pytest.mark.parametrize(
    "text",
    ["def f(x):\n    return x  # ok", "héllo wörld — ünïcödé", "日本語のテキスト", "emoji 🧠🤖 and \t tabs\r\n", "", "\x00\x01 control"],
)
def test_round_trip(tokenizer, text):
    assert data.decode(tokenizer, data.encode(tokenizer, text)) == text


def test_vocab_and_eot(tokenizer):
    assert tokenizer.get_vocab_size() == data.DEFAULT_VOCAB_SIZE
    assert tokenizer.token_to_id(data.EOT) == 0


def test_visible_whitespace(tokenizer):
    assert data.visible(" a\n\tb") == "·a⏎⇥b"
    assert data.token_id(tokenizer, "·self") == data.encode(tokenizer, " self")[0]
    with pytest.raises(ValueError, match="splits into"):
        data.token_id(tokenizer, "supercalifragilistic")


def test_default_corpus_selection_is_deterministic():
    files = data.stdlib_files()
    assert files == sorted(files, key=lambda p: p.as_posix())
    names = [p.as_posix() for p in files]
    assert not any("/test/" in n or "/__pycache__/" in n for n in names)
    assert any(n.endswith("/os.py") for n in names)


def test_local_files_corpus(tmp_path):
    paths = []
    for i in range(12):
        p = tmp_path / f"doc{i}.txt"
        p.write_text(f"document {i}: the quick brown fox jumps over the lazy dog. " * 5)
        paths.append(p)
    corpus = data.load_corpus(paths)
    assert len(corpus.train) + len(corpus.validation) == 12 and corpus.validation
    again = data.load_corpus(reversed(paths))
    assert again == corpus  # order of the input does not matter
    tok = data.train_tokenizer([t for _, t in corpus.train], vocab_size=300)
    stream = data.tokenize_documents(tok, corpus.train)
    assert (stream == 0).sum() == len(corpus.train)  # one EOT after each document
    with pytest.raises(FileNotFoundError, match="not found"):
        data.load_corpus([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        data.load_corpus([tmp_path / "empty.txt"])


def test_batches():
    g = torch.Generator().manual_seed(0)
    stream = torch.arange(1000)
    w = data.random_windows(stream, 4, 16, g)
    assert w.shape == (4, 16) and torch.all(w[:, 1:] - w[:, :-1] == 1)
    r = data.repeated_windows(stream, 4, 32, g, min_len=8, max_len=16)
    assert r.shape == (4, 32)
    for row in r:
        period = int(torch.nonzero(row == row[0])[1])
        assert torch.equal(row[period:], row[: 32 - period])
    with pytest.raises(ValueError, match="fewer than n_ctx"):
        data.random_windows(torch.arange(5), 1, 16, g)


def test_repeated_random_tokens():
    t = data.repeated_random_tokens(3, 10, n_repeats=3, d_vocab=100, seed=1)
    assert t.shape == (3, 31) and torch.all(t[:, 0] == 0) and torch.all(t[:, 1:] > 0)
    assert torch.equal(t[:, 1:11], t[:, 11:21]) and torch.equal(t[:, 1:11], t[:, 21:31])
    assert torch.equal(t, data.repeated_random_tokens(3, 10, n_repeats=3, d_vocab=100, seed=1))
    with pytest.raises(ValueError, match="maximum seq_len for 2 copies is 63"):
        data.repeated_random_tokens(1, 64, n_repeats=2, n_ctx=128)


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="make train"):
        data.load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        data.load_tokenizer(bad)


def test_uint16_token_arrays_from_tokenize_documents_are_model_input(tokenizer):
    from attncircuits import ModelConfig, Transformer

    stream = data.tokenize_documents(tokenizer, [("a.py", "def f(x):\n    return x\n")])
    assert stream.dtype.name == "uint16"
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=32)).eval()
    logits = model(stream)  # once refused with '"min_all" not implemented for UInt16'
    torch.testing.assert_close(logits, model(torch.as_tensor(stream.astype("int64"))))
    assert data.decode(tokenizer, stream[:-1]) == "def f(x):\n    return x\n"


def test_a_lone_surrogate_is_a_clear_error_not_a_deep_type_error(tokenizer):
    with pytest.raises(ValueError, match=r"text holds a lone surrogate '\\ud800' at index 1"):
        data.encode(tokenizer, "a\ud800b")
    with pytest.raises(ValueError, match="lone surrogate"):
        data.tokenize_documents(tokenizer, [("bad.txt", "x\udcff")])
    with pytest.raises(ValueError, match="lone surrogate"):
        data.token_id(tokenizer, "\ud800")
    with pytest.raises(TypeError, match="text must be a str, got NoneType"):
        data.encode(tokenizer, None)


def test_token_ids_are_integers_in_the_vocabulary(tokenizer):
    with pytest.raises(TypeError, match="ids must be integer token ids"):
        data.decode(tokenizer, [0.5, 1.0])  # once silently decoded as [0, 1]
    with pytest.raises(ValueError, match="token id 2048 is outside the vocabulary"):
        data.token_str(tokenizer, 2048)  # once the empty string
    with pytest.raises(TypeError, match="token_id must be an int, got '0'"):
        data.token_str(tokenizer, "0")
    assert data.token_strs(tokenizer, torch.tensor([291], dtype=torch.int32)) == ["·self"]
