"""Holding out about a tenth of any corpus for validation, with no text in both splits.

The shipped corpus (the standard library, hundreds of files) is split by file, one name in ten by
its hash. A learner's own text may be one file, two, or thousands, and a rule by file alone then
leaks or starves: one file cannot be split by file at all. :func:`split_documents` therefore holds
out a tenth of the text *whatever the files look like*:

1. **whole files**, when some of them together make up 9% to 11% of the text (by UTF-8 bytes):
   files are taken in the order of a hash of their names, each one that still fits under 11%,
   until 9% is reached. A corpus of many files of any sizes gets this split;
2. otherwise **the last tenth of each file**: each file is cut at the line break nearest to 90% of
   its characters (without one near there, at the nearest space). Its head is training text, its
   tail validation text: no character is in both. A corpus of one or a few large files gets this.

Bytes stand in for tokens (the tokenizer is trained on the training split, so tokens cannot be
counted before the split); a tenth of the bytes is about a tenth of the tokens. The split depends
only on the files' names and contents, never on the order they are given in.

:func:`repeated_share` measures what a held-out split cannot fix: text that repeats itself, where
validation lines are also training lines and a validation loss measures memory, not prediction.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

#: the share of the text held out for validation
HELD_OUT = 0.1
#: whole files are held out when some make up this share of the text (by bytes)
WHOLE_FILES = (0.09, 0.11)
#: how a corpus's validation text was chosen (``Corpus.held_out``)
BY_HASH, WHOLE, TAILS = "one file in ten by a hash of its name", "whole files", "the last tenth of each file"
#: a file shorter than this (characters) is not cut: it is training text
SHORTEST_CUT = 10
#: the suffix a file's held-out tail is named by
TAIL_SUFFIX = " (last tenth)"

Docs = tuple[tuple[str, str], ...]


def _hash(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def whole_files(docs: Sequence[tuple[str, str]]) -> set[str] | None:
    """The names of the files to hold out whole (9-11% of the bytes), or None when no such choice
    is found by taking them in hash order (the corpus is one or a few large files)."""
    total = sum(_size(t) for _, t in docs)
    lo, hi = WHOLE_FILES[0] * total, WHOLE_FILES[1] * total
    chosen, size = set(), 0
    for name, text in sorted(docs, key=lambda d: _hash(d[0])):
        n = _size(text)
        if size + n <= hi:
            chosen.add(name)
            size += n
        if size >= lo:
            break
    return chosen if lo <= size <= hi and len(chosen) < len(docs) else None


def tail_cut(text: str, keep: float = 1 - HELD_OUT) -> int:
    """Where ``text`` is cut: the start of the line nearest to ``keep`` of its characters, so that no
    line is split; without a line break within 5% of the length from there, the start of the nearest
    word; else exactly there."""
    target = round(keep * len(text))
    near = 0.05 * len(text)
    for sep in ("\n", " "):
        starts = [i + 1 for i in (text.rfind(sep, 0, target), text.find(sep, target))
                  if i != -1 and 0 < i + 1 < len(text) and abs(i + 1 - target) <= near]
        if starts:
            return min(starts, key=lambda i: abs(i - target))
    return target


def split_documents(docs: Sequence[tuple[str, str]]) -> tuple[Docs, Docs, str]:
    """``(train, validation, how)`` for the ``(name, text)`` documents (sorted by name): about a
    tenth of the text held out, by whole files when some make up 9-11% of it, else each file's last
    tenth (see the module's docstring). Validation may be empty only for a corpus too short to cut."""
    docs = sorted(docs, key=lambda d: d[0])
    held = whole_files(docs)
    if held is not None:
        return (tuple(d for d in docs if d[0] not in held), tuple(d for d in docs if d[0] in held), WHOLE)
    train, val = [], []
    for name, text in docs:
        cut = tail_cut(text)
        if len(text) >= SHORTEST_CUT and 0 < cut < len(text):
            train.append((name, text[:cut]))
            val.append((name + TAIL_SUFFIX, text[cut:]))
        else:  # too short to cut: all of it is training text
            train.append((name, text))
    return tuple(train), tuple(val), TAILS


#: the most of the validation split's distinct lines that may also be training lines. Measured
#: (distinct non-blank lines, stripped): the shipped corpus 0.18, SQLAlchemy's source 0.20, pandas's
#: 0.22, sympy's 0.11, Vim's documentation 0.04, HuggingFace transformers's source (much code copied
#: between models) 0.54; a corpus of one repeated line, or of a few lines in any order, 1.0.
MAX_REPEATED = 0.8


def _lines(docs: Sequence[tuple[str, str]]) -> set[str]:
    return {line.strip() for _, text in docs for line in text.splitlines() if line.strip()}


def repeated_share(train: Sequence[tuple[str, str]], validation: Sequence[tuple[str, str]]) -> float:
    """The share of the validation split's distinct non-blank lines (stripped) that also occur in
    the training split (see :data:`MAX_REPEATED`); 0 for a validation split without such lines."""
    val = _lines(validation)
    return len(val & _lines(train)) / len(val) if val else 0.0
