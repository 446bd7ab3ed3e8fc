"""Corpus, tokenizer and batches: everything the course feeds its models.

The default corpus is real text that every Python installation carries: the standard library's
source (code, docstrings, comments) and its bundled documentation text. Files are chosen by a fixed
rule, ordered by path and split into train/validation by a hash of the path, so the split never
depends on the order the file system lists them in. Any local text files go through the same loader,
and about a tenth of their text is held out whatever the files look like: whole files, or the last
tenth of each (:mod:`attncircuits.data.split`); no character is in both splits.

Tokens are byte-level BPE (HuggingFace ``tokenizers``): every Unicode string round-trips exactly.
The vocabulary has 2048 entries: small enough that ``d_vocab x d_vocab`` tables (bigrams, OV
circuits) are 4 M entries and fit in memory and on a heatmap, large enough that common identifiers
and English words are single tokens, so skip-trigram tables read as words rather than letters.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from attncircuits.core import validate
from attncircuits.data.split import BY_HASH, TAILS, split_documents

EOT = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 2048
#: directories of the standard library left out: test suites are mostly synthetic strings.
EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "turtledemo"}
)
CORPUS_SUFFIXES = (".py", ".txt")
#: one file in ``VALIDATION_MODULUS`` (by path hash) goes to the validation split.
VALIDATION_MODULUS = 10

# Visible whitespace for tables and plots.
_VISIBLE = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍"}


# ----------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Corpus:
    """A list of (name, text) documents split into train and validation; ``held_out`` says how the
    validation text was chosen (by file, or the last tenth of each file: see :mod:`attncircuits.data.split`)."""

    train: tuple[tuple[str, str], ...]
    validation: tuple[tuple[str, str], ...]
    held_out: str = BY_HASH

    @property
    def n_bytes(self) -> int:
        return sum(len(t.encode("utf-8")) for _, t in self.train + self.validation)

    def describe(self) -> str:
        tb = sum(len(t.encode("utf-8")) for _, t in self.train)
        vb = sum(len(t.encode("utf-8")) for _, t in self.validation)
        if self.held_out == TAILS:
            n = len(self.train)
            return f"the last tenth of each of {n} file{'s' * (n != 1)} held out: {tb / 1e6:.2f} MB train, {vb / 1e6:.2f} MB validation"
        return (
            f"{len(self.train)} train files ({tb / 1e6:.2f} MB), "
            f"{len(self.validation)} validation files ({vb / 1e6:.2f} MB)"
        )


def _is_validation(name: str) -> bool:
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % VALIDATION_MODULUS == 0


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard-library files of the default corpus, sorted by relative path."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.suffix not in CORPUS_SUFFIXES or not path.is_file():
            continue
        if any(part in EXCLUDED_DIRS or part.startswith("test_") for part in rel.parts):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_text_file(path: Path) -> str:
    """A corpus file as text: UTF-8, a stray undecodable byte becoming U+FFFD; a file with NUL
    bytes or mostly undecodable bytes is binary and refused."""
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    if b"\0" in raw or text.count("\ufffd") > 0.01 * max(len(text), 1):
        raise ValueError(f"corpus file {path} is not text (binary or not UTF-8): leave it out of the corpus "
                         "(a narrower pattern) or convert it to UTF-8 text")
    return text


def _read_stdlib_file(path: Path) -> str:  # the rule the shipped corpus files were made with
    return path.read_bytes().decode("utf-8", errors="replace")


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except OSError:  # e.g. a name too long for the file system
        return False


def load_corpus(paths: str | Path | Iterable[str | Path] | None = None, root: str | Path | None = None) -> Corpus:
    """Load the default corpus (``paths=None``) or local text files (one path or several).

    Files are read as UTF-8 (a stray undecodable byte becomes U+FFFD; binary files are refused) and
    ordered by name. The default corpus is split by a hash of each file's name (one in ten held
    out); local files by :func:`attncircuits.data.split.split_documents` (about a tenth of the text:
    whole files, or the last tenth of each), so the same files always give the same split and no
    text is in both. A corpus too short to hold anything out is refused.
    """
    if paths is None:
        root = Path(root or sysconfig.get_paths()["stdlib"])
        paths = stdlib_files(root)
        read = _read_stdlib_file
    else:
        if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Iterable):
            paths = [paths]
        paths = [validate.path(p, "corpus file") for p in paths]
        if not paths:
            raise ValueError("no corpus files given: pass at least one text file")
        missing = [str(p)[:80] for p in paths if not _is_file(p)]
        if missing:
            raise FileNotFoundError(f"corpus files not found: {missing[:5]}; pass existing text files")
        root, read = None, read_text_file
    docs = []
    for p in paths:
        name = p.relative_to(root).as_posix() if root is not None else p.as_posix()
        text = read(p)
        if text.strip():
            docs.append((name, text))
    if not docs:
        raise ValueError("the corpus is empty: pass at least one non-empty text file")
    docs.sort(key=lambda d: d[0])
    if root is None:
        train, val, how = split_documents(docs)
        if not val:
            raise ValueError(f"the corpus ({sum(len(t) for _, t in docs)} characters) is too short to hold out "
                             "a tenth for validation: pass more text")
        return Corpus(train=train, validation=val, held_out=how)
    train = tuple(d for d in docs if not _is_validation(d[0]))
    val = tuple(d for d in docs if _is_validation(d[0]))
    return Corpus(train=train, validation=val)


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------
def train_tokenizer(texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train a byte-level BPE tokenizer; ``<|endoftext|>`` is token 0 and separates documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path: str | Path):
    """Load a tokenizer JSON file, with a message that names the fix when it is missing."""
    from tokenizers import Tokenizer

    path = validate.path(path, "tokenizer path")
    if not _is_file(path):
        raise FileNotFoundError(
            f"tokenizer file {path} not found; re-train with `make train` or restore it with "
            "`git checkout -- src/attncircuits/checkpoints/shipped/`"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise ValueError(f"tokenizer file {path} is corrupt ({err}); restore it from git") from err


def encode(tokenizer, text: str) -> list[int]:
    """The token ids of ``text`` (a ``str`` of valid Unicode)."""
    return tokenizer.encode(validate.text(text)).ids


def decode(tokenizer, ids: Iterable[int]) -> str:
    """The text of a 1-D sequence of token ids (a list, array or tensor)."""
    ids = validate.token_ids(ids, tokenizer.get_vocab_size(), "ids", ndim=1)
    return tokenizer.decode(ids.tolist(), skip_special_tokens=False)


def tokenize_documents(tokenizer, docs: Sequence[tuple[str, str]]) -> np.ndarray:
    """All documents as one uint16 stream, each followed by ``<|endoftext|>``."""
    eot = tokenizer.token_to_id(EOT)
    texts = [validate.text(t, f"the text of document {name!r}") for name, t in docs]
    encs = tokenizer.encode_batch(texts)
    out = []
    for e in encs:
        out.extend(e.ids)
        out.append(eot)
    return np.asarray(out, dtype=np.uint16)


def visible(s: str) -> str:
    """Make whitespace visible: ``·`` for a space, ``⏎`` newline, ``⇥`` tab."""
    return "".join(_VISIBLE.get(c, c) for c in s)


def _byte_level_chars() -> dict[str, int]:
    """The byte-level BPE alphabet: each of the 256 bytes is written as one printable character
    (printable Latin-1 bytes as themselves, the others as ``chr(256 + k)`` in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_chars()
_HEX_BYTES = "attncircuits-hex-bytes"  # a decoding error handler: an undecodable byte reads <0xE2>
codecs.register_error(_HEX_BYTES, lambda e: ("".join(f"<0x{b:02X}>" for b in e.object[e.start : e.end]), e.end))


def token_str(tokenizer, token_id: int) -> str:
    """One token as readable text (whitespace made visible). A byte-level token that is not valid
    UTF-8 on its own (a piece of a multi-byte character) shows its bytes, e.g. ``<0xE2>``, where
    decoding would give ``\ufffd``."""
    token_id = validate.token_id(token_id, tokenizer.get_vocab_size(), "token_id")
    return _token_text(tokenizer, token_id)


def _token_text(tokenizer, token_id: int) -> str:
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    piece = tokenizer.id_to_token(token_id) if "\ufffd" in text else None
    if piece is not None and all(c in _BYTE_LEVEL for c in piece):
        text = bytes(_BYTE_LEVEL[c] for c in piece).decode("utf-8", errors=_HEX_BYTES)
    return visible(text)


def token_strs(tokenizer, ids: Iterable[int]) -> list[str]:
    """Each token of a 1-D sequence of ids as readable text."""
    ids = validate.token_ids(ids, tokenizer.get_vocab_size(), "ids", ndim=1)
    return [_token_text(tokenizer, i) for i in ids.tolist()]


def token_id(tokenizer, s: str) -> int:
    """The id of a string that is exactly one token; ``·``/``⏎``/``⇥`` may stand for whitespace.

    Raises a ValueError that lists the pieces when the string splits into several tokens.
    """
    return validate.token(tokenizer, s, ids=False)


# ----------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------
def random_windows(
    tokens: np.ndarray | Tensor, batch_size: int, n_ctx: int, generator: torch.Generator
) -> Int[Tensor, "batch pos"]:
    """``batch_size`` windows of ``n_ctx`` consecutive tokens at random offsets."""
    tokens = validate.token_ids(tokens, None, "tokens", ndim=1)
    batch_size, n_ctx = validate.count(batch_size, "batch_size"), validate.count(n_ctx, "n_ctx")
    if len(tokens) < n_ctx:
        raise ValueError(f"the token stream has {len(tokens)} tokens, fewer than n_ctx={n_ctx}")
    return random_windows_checked(tokens, batch_size, n_ctx, generator)


def random_windows_checked(tokens: Tensor, batch_size: int, n_ctx: int, generator: torch.Generator) -> Tensor:
    """:func:`random_windows` for checked arguments: ``tokens`` a 1-D int64 tensor of at least
    ``n_ctx`` ids (the training loop checks its stream once, not at every step)."""
    starts = torch.randint(0, len(tokens) - n_ctx + 1, (batch_size,), generator=generator)
    return torch.stack([tokens[s : s + n_ctx] for s in starts.tolist()])


def repeated_windows(
    tokens: np.ndarray | Tensor,
    batch_size: int,
    n_ctx: int,
    generator: torch.Generator,
    min_len: int = 8,
    max_len: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """Rows made of one window of real text repeated until ``n_ctx`` tokens are filled.

    The window length is drawn per row from ``[min_len, max_len]`` (default ``n_ctx // 2``), so a
    model sees repeats at many distances: the training signal that makes induction heads pay off.
    """
    batch_size, n_ctx = validate.count(batch_size, "batch_size"), validate.count(n_ctx, "n_ctx", 2)
    max_len = validate.count(n_ctx // 2 if max_len is None else max_len, "max_len", 1, n_ctx)
    min_len = validate.count(min_len, "min_len", 1, max_len, why="the shortest window, at most max_len")
    tokens = validate.token_ids(tokens, None, "tokens", ndim=1)
    if len(tokens) < max_len:
        raise ValueError(f"the token stream has {len(tokens)} tokens, fewer than max_len={max_len}")
    return repeated_windows_checked(tokens, batch_size, n_ctx, generator, min_len, max_len)


def repeated_windows_checked(
    tokens: Tensor, batch_size: int, n_ctx: int, generator: torch.Generator, min_len: int, max_len: int
) -> Tensor:
    """:func:`repeated_windows` for checked arguments (``tokens`` as in :func:`random_windows_checked`)."""
    lens = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator).tolist()
    windows = random_windows_checked(tokens, batch_size, max_len, generator)
    rows = [windows[i, :L].repeat(n_ctx // L + 1)[:n_ctx] for i, L in enumerate(lens)]
    return torch.stack(rows)


def repeated_random_tokens(
    batch_size: int,
    seq_len: int,
    n_repeats: int = 2,
    d_vocab: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    n_ctx: int | None = None,
    prepend_eot: bool = True,
) -> Int[Tensor, "batch pos"]:
    """Uniformly random tokens repeated ``n_repeats`` times: ``[EOT] r1..rL r1..rL ...``.

    Nothing but an earlier copy can predict a token of a later copy, so loss that falls on the
    later copies is in-context learning, and attention to "the token after my earlier copy" is
    prefix matching. Token 0 (``<|endoftext|>``) is never drawn; with ``prepend_eot`` it starts
    each row, as a document start does in training.
    """
    seq_len, n_repeats = validate.repeats(seq_len, n_repeats, n_ctx, prepend_eot)
    batch_size = validate.count(batch_size, "batch_size")
    d_vocab = validate.count(d_vocab, "d_vocab", 2, why="token 0 is never drawn")
    return repeated_rows(batch_size, seq_len, n_repeats, d_vocab, seed, prepend_eot)


def repeated_rows(batch_size: int, seq_len: int, n_repeats: int, d_vocab: int, seed: int, prepend_eot: bool = True) -> Tensor:
    """:func:`repeated_random_tokens` for checked arguments (callers that checked them already)."""
    g = torch.Generator().manual_seed(int(seed))
    seq = torch.randint(1, d_vocab, (batch_size, seq_len), generator=g)
    rows = seq.repeat(1, n_repeats)
    if prepend_eot:
        rows = torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), rows], dim=1)
    return rows
