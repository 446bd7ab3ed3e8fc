"""Corpus selection, tokenizer round trip, display helpers and batches."""

import pytest
import torch

from attncircuits import data
from attncircuits.pretrained import CORPUS_DIR


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
    with pytest.raises(ValueError, match="seq_len <= 63"):
        data.repeated_random_tokens(1, 64, n_repeats=2, n_ctx=128)


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="make train"):
        data.load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        data.load_tokenizer(bad)
