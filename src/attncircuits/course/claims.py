"""A chapter's claims, checked on whichever models are in use.

    from attncircuits.course.claims import claim, summary
    claim(f"a previous-token head in layer 0 ({PREVIOUS_TOKEN_HEAD})",
          PREVIOUS_TOKEN_HEAD.holds(prev_score), prev_score)
    ...
    summary()   # last cell: the claims that held and those that did not

On the shipped models a claim is an assertion, as a bare ``assert`` was: when it does not hold,
:func:`claim` raises ``AssertionError`` naming the claim and the measured value, so nbval fails.
On another set of models (``ATTNCIRCUITS_MODELS``, see :mod:`attncircuits.checkpoints.modelset`) the chapter is
an experiment instead: a claim that does not hold prints one line,
``claim not held: <text> (measured: <value>)`` (wrapped at the book's 79 columns, continuation
lines indented), and the chapter runs on. Every claim is recorded
(in this kernel) for :func:`summary`, and, when ``ATTNCIRCUITS_CLAIMS_LOG`` names a file, appended to
it as one JSON line, so that ``make replicate`` can count the claims that held in each chapter.

A claim about the text rather than the recipe, ``claim(..., about="corpus")`` (the shipped corpus's
or tokenizer's: "``·return`` is one token", "2.5 to 4.5 bytes a token"), is said so when it does
not hold on another set and counted apart by :func:`summary` and ``make replicate``: on other text
it measures that text, not whether the recipe finds the circuits.

:func:`models_notice` is chapter 1's first word on a set that ``make train-mine`` found not trained
enough for what the chapters test (its ``set.json``, see :mod:`attncircuits.train.enough`).
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from dataclasses import asdict, dataclass
from decimal import Decimal

from attncircuits.checkpoints import modelset

LOG_ENV = "ATTNCIRCUITS_CLAIMS_LOG"
#: the widest line a chapter may print (``tests/notebook_pages.py``'s ``LINE_LIMIT``)
WIDTH = 79


@dataclass(frozen=True)
class Claim:
    text: str
    held: bool
    measured: str
    models: str  # "shipped" or the set's folder
    about: str = "recipe"  # or "corpus": a claim about the text and tokenizer (see the module's docstring)


_record: list[Claim] = []
#: what a claim may be about
ABOUT = ("recipe", "corpus")


def models_in_use() -> str:
    """"shipped", or the folder of the set ``ATTNCIRCUITS_MODELS`` names, or of the family results
    ``ATTNCIRCUITS_FAMILY`` names (chapter 11 on another seed's family)."""
    directory = modelset.current_dir() or modelset.family_dir()
    return "shipped" if directory is None else str(directory)


def _fmt(x) -> str:
    if hasattr(x, "tolist"):  # tensors and arrays
        x = x.tolist()
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(_fmt(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in x.items()) + "}"
    return str(x)


def _truth(ok) -> bool:
    """``ok`` as one bool: a bool, or a one-element bool tensor or array (a comparison's result)."""
    if hasattr(ok, "shape") and hasattr(ok, "item"):  # torch tensors, numpy arrays and scalars
        n = math.prod(ok.shape)
        if n != 1:
            raise TypeError(f"claim: ok must be one truth value, got {n} (shape {tuple(ok.shape)}); "
                            "reduce it with .all() or .any()")
        ok = ok.item()
    if not isinstance(ok, bool):
        raise TypeError(f"claim: ok must be a comparison's result (True or False), got {ok!r}")
    return ok


def claim(text: str, ok, measured=None, about: str = "recipe") -> bool:
    """Check one claim: ``ok`` is whether it holds, ``measured`` what was measured (printed when it
    does not hold), ``about`` "recipe" (what training finds: the default) or "corpus" (a claim about
    the text and its tokenizer). Raises ``AssertionError`` on the shipped models when it does not
    hold; on another set prints one line and returns False. Returns whether it held."""
    if not isinstance(text, str) or not text.strip():
        raise TypeError(f"claim: text must say what is claimed, got {text!r}")
    if about not in ABOUT:
        raise ValueError(f"claim: about must be one of {ABOUT}, got {about!r}")
    held = _truth(ok)
    c = Claim(text.strip(), held, _fmt(measured), models_in_use(), about)
    _record.append(c)
    log = os.environ.get(LOG_ENV, "").strip()
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(c)) + "\n")
    if not held:
        what = "claim not held" if about == "recipe" else "claim about the corpus not held"
        if c.models == "shipped":
            raise AssertionError(f"{what}: {c.text} (measured: {c.measured})")
        print(_wrap(f"{what}: {c.text} (measured: {c.measured})"))
    return held


def _wrap(line: str, indent: str = "    ") -> str:
    """``line`` folded to :data:`WIDTH` columns, as the book's column shows a printed line."""
    return textwrap.fill(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def fit_path(path: str, width: int = WIDTH) -> str:
    """``path`` in at most ``width`` columns: whole when it fits, else ``.../`` and its last
    parts (whole parts; a last name longer than the column is cut from the left)."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    if len(".../" + parts[-1]) > width:  # one name longer than the column: its last characters
        return "..." + path[3 - width:]
    tail = parts[-1]
    for part in reversed(parts[:-1]):
        if len(".../" + part + "/" + tail) > width:
            break
        tail = part + "/" + tail
    return ".../" + tail


def shell_lines(command: str) -> str:
    """``command`` folded to :data:`WIDTH` columns as a shell reads it: each line but the last ends
    in `` \\``; a word longer than the column (a long path) is never cut."""
    lines = textwrap.wrap(command, WIDTH - 2, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    return " \\\n".join(lines)


def results() -> list[Claim]:
    """The claims checked so far in this kernel, in order."""
    return list(_record)


def reset() -> None:
    """Forget the claims recorded so far (a chapter's first cell may call it)."""
    _record.clear()


def summary() -> str:
    """Print, and return, the count of claims that held and each one that did not (with its value);
    claims about the corpus (``about="corpus"``) are counted on a line of their own."""
    recipe = [c for c in _record if c.about == "recipe"]
    corpus = [c for c in _record if c.about == "corpus"]
    head = f"{sum(c.held for c in recipe)} of {len(recipe)} claims held on "
    if models_in_use() == "shipped":
        lines = [head + "the shipped models"]
    elif len(head + "the models in " + models_in_use()) <= WIDTH:
        lines = [head + "the models in " + models_in_use()]
    else:  # the folder on a line of its own, its tail where even that line is too long
        lines = [head + "the models in", "  " + fit_path(models_in_use(), WIDTH - 2)]
    lines += [_wrap(f"  not held: {c.text} (measured: {c.measured})", "      ") for c in recipe if not c.held]
    if corpus:
        lines.append(f"and {sum(c.held for c in corpus)} of {len(corpus)} claims about the corpus and tokenizer")
        lines += [_wrap(f"  not held: {c.text} (measured: {c.measured})", "      ") for c in corpus if not c.held]
    text = "\n".join(lines)
    print(text)
    return text


def models_notice() -> str:
    """Print, and return, what ``make train-mine`` found not trained enough in the set in use (its
    ``set.json``): each failed check and the command that trains further. Nothing (``""``) for the
    shipped models and for a set whose checks held or that has none."""
    directory = modelset.current_dir()
    if directory is None:
        return ""
    try:
        info = json.loads((directory / modelset.SET_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    failed = info.get("failed") if isinstance(info, dict) else None
    if not failed or not isinstance(failed, list):
        return ""
    lines = [_wrap("These models are not trained enough for what the chapters test (make train-mine "
                   "checked; the claims that rest on it may not hold): " + "; ".join(map(str, failed)) + "."),
             "Train further with:", shell_lines(str(info.get("train_further", "")))]
    text = "\n".join(lines)
    print(text)
    return text


# ---- claims across runs (the reproduces page) ----------------------------------------------------
SHIPPED_PREFIX = "in the shipped run: "


def split_recorded(line: str) -> tuple[str, str]:
    """A claim recorded as not held, ``"<text> (measured: <value>)"`` (``make replicate``'s
    results.json), as ``(text without "in the shipped run: ", value)``."""
    text, sep, value = line.rpartition(" (measured: ")
    if not sep or not value.endswith(")"):
        raise ValueError(f"not a recorded claim: {line!r}")
    return text.removeprefix(SHIPPED_PREFIX), value[:-1]


#: what a claim kept in its words after it failed on a run trained after them is marked with
#: (``replicates/claims-now.json``'s third kind beside "shipped" and "restated")
STANDS = "as stated, not held on a run trained after its wording"


def _not_held(recorded: dict[str, dict], now: dict[str, dict]) -> list[tuple[str, str, str | None, dict]]:
    """``(chapter, the claim now, the wording a restated claim was recorded under or None, {run:
    measured value})`` per claim that did not hold on some run, sorted (see
    :func:`not_held_across_runs`)."""
    # (chapter, claim now) -> (was: None for the shipped run's, STANDS for one kept in its words, else
    # the wording the runs recorded it under; {run: measured value})
    rows: dict[tuple[str, str], tuple[str | None, dict]] = {}
    for run, chapters in recorded.items():
        for chapter, counts in chapters.items():
            for line in counts.get("claims_not_held", []):
                text, value = split_recorded(line)
                try:
                    claim_now, kind = now[chapter][text]
                except KeyError:
                    raise KeyError(f"{run}, {chapter}: {text!r} is not in claims-now.json") from None
                was = None if kind == "shipped" else STANDS if kind == "stands" else text
                row = rows.setdefault((chapter, claim_now), (was, {}))
                row[1][run] = value
    return [(chapter, text, was, values) for (chapter, text), (was, values) in sorted(rows.items())]


def not_held_across_runs(recorded: dict[str, dict], now: dict[str, dict]) -> list[tuple]:
    """One row per claim that did not hold on some run: ``(chapter, the claim as the chapter states
    it now, what became of it, then per run its measured value or "held")``.

    ``recorded`` is ``{run: results["chapters"]}`` of each run's results.json; ``now`` maps each
    chapter's recorded wordings to ``[the claim now, "shipped", "restated" or "stands"]`` (kept in its
    words: it failed on a run trained after it, which the table shows)
    (``replicates/claims-now.json``), so that a claim recorded under an older wording by one run and
    a newer one by another is one row. A restated claim's row names the wording it was recorded
    under, whose measured values it shows. A recorded wording missing from ``now`` raises
    ``KeyError`` naming it."""
    runs = list(recorded)
    return [(chapter, text, "the shipped run's" if was is None else STANDS if was == STANDS
             else f"restated; recorded as: {was}",
             *(values.get(r, "held") for r in runs))
            for chapter, text, was, values in _not_held(recorded, now)]


def not_held_table(recorded: dict[str, dict], now: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """The rows of the reproduces page's table of claims not held on some run, to read: ``(chapter,
    claim, run, measured)``, one row per run on which a claim did not hold, with its value as text
    (:func:`readable_value`); the chapter and the claim are written on a claim's first row only
    (empty on the rows below it). A restated claim says under which wording its values were
    recorded (or that the claim before it was restated, where its own words are the same); a claim marked as the shipped run's says so in its text ("in the shipped run: ...").
    The runs on which a claim held have no row."""
    out = []
    for chapter, text, was, values in _not_held(recorded, now):
        if was == STANDS:
            text += f" ({STANDS})"
        elif was == text:  # "their ...": what it follows was restated
            text += " (restated with the claim before it, in the same words)"
        elif was is not None:
            text += f" (restated; the runs recorded it as: {was})"
        for i, run in enumerate(r for r in recorded if r in values):
            out.append((chapter if i == 0 else "", text if i == 0 else "", run, readable_value(values[run])))
    return out


#: a number as ``_fmt`` writes one (an int, a float's ``:.4g``, ``nan``, ``inf``)
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|-?inf|nan", re.IGNORECASE)
_WORDS = {"True": "yes", "False": "no", "None": "none"}


class _Pairs(list):
    """A dict's entries, ``[(key, value), ...]``, as :func:`_parse` reads them."""


def _bracketed(s: str) -> bool:
    """Whether ``s`` is one bracketed whole: its first bracket closes at its last character."""
    if len(s) < 2 or s[0] + s[-1] not in ("[]", "()", "{}"):
        return False
    depth = 0
    for i, c in enumerate(s):
        depth += (c in "([{") - (c in ")]}")
        if depth == 0:
            return i == len(s) - 1
    return False


def _split(s: str, sep: str, limit: int = -1) -> list[str]:
    """``s`` split at ``sep`` outside brackets (at most ``limit`` times)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        if depth == 0 and s.startswith(sep, i) and limit != len(parts):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        depth += (s[i] in "([{") - (s[i] in ")]}")
        i += 1
    return [*parts, s[start:]]


def _parse(s: str):
    """A value as ``_fmt`` wrote it: a str (one value), a list (a list or tuple) or :class:`_Pairs`."""
    s = s.strip()
    if not _bracketed(s):
        return s
    items = _split(s[1:-1], ", ") if s[1:-1].strip() else []
    if s[0] != "{":
        return [_parse(x) for x in items]
    pairs = _Pairs()
    for item in items:
        key, *value = _split(item, ": ", limit=1)
        pairs.append((key.strip(), _parse(value[0]) if value else ""))
    return pairs


def _number(s: str, digits: int) -> str:
    """``s`` at ``digits`` significant digits when it is a float with more, else as it is."""
    if not _NUMBER.fullmatch(s) or re.fullmatch(r"-?\d+", s):
        return _WORDS.get(s, s)
    d = Decimal(s)
    if not d.is_finite() or d == 0 or len(d.as_tuple().digits) <= digits:
        return s
    d = d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1))
    # rounding up a power of ten (0.9999 to 1.000) adds a digit: one fewer decimal
    return format(d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1)), "f")


def _text(node, digits: int, inner: bool = False) -> str:
    """``node`` (:func:`_parse`) as text; ``inner``: inside another list or dict."""
    if isinstance(node, str):
        return _number(node, digits)
    if not node:
        return "none"
    if isinstance(node, _Pairs):
        values = [value for _, value in node]
        parts = []
        for key, value in node:
            v = _text(value, digits, inner=True)
            # "key value"; "key: value" where two numbers would stand side by side, or several values
            plain = isinstance(value, str) and not _NUMBER.fullmatch(key)
            parts.append(key if not v else f"{key} {v}" if plain else f"{key}: {v}")
    else:
        values = node
        parts = [_text(x, digits, inner=True) for x in node]
    # a list of lists: its items apart by semicolons, each item's values by commas
    nested = not inner and any(not isinstance(x, str) for x in values)
    return ("; " if nested else ", ").join(parts)


def readable_value(value: str, digits: int = 3) -> str:
    """A measured value as a claim recorded it (``"[0.2222, 0.05556]"``, ``"([], [2])"``, ``"{0.2:
    0.5379}"``, ``"(30.16, k)"``) as text to read: numbers at ``digits`` significant digits (an int,
    or a float with fewer, as it is), the items of a list or tuple separated by commas, a dict's
    entries as "key value" ("key: value" where the key is a number or the value several), the items
    of a list of lists (or of a dict of lists) by semicolons, an empty one "none", True and False
    "yes" and "no"; no brackets, braces or quotes. A value that is not a container is one value:
    ``"0.7875"`` reads "0.788"."""
    return _text(_parse(value), digits)


def counts_across_runs(recorded: dict[str, dict]) -> list[tuple]:
    """Per chapter, ``(chapter, "held of claims" in each run)`` as each run recorded them."""
    chapters = list(dict.fromkeys(ch for chs in recorded.values() for ch in chs))
    return [(ch, *(f"{c['claims_held']} of {c['claims']}" if (c := chs.get(ch)) else "-"
                   for chs in recorded.values()))
            for ch in chapters]
