"""A chapter's claims, checked on whichever models are in use.

    from attncircuits.course.claims import claim, summary
    claim("a previous-token head in layer 0", prev_score > 0.5, prev_score)
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
import textwrap
from dataclasses import asdict, dataclass

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


def not_held_across_runs(recorded: dict[str, dict], now: dict[str, dict]) -> list[tuple]:
    """One row per claim that did not hold on some run: ``(chapter, the claim as the chapter states
    it now, what became of it, then per run its measured value or "held")``.

    ``recorded`` is ``{run: results["chapters"]}`` of each run's results.json; ``now`` maps each
    chapter's recorded wordings to ``[the claim now, "shipped" or "restated"]``
    (``replicates/claims-now.json``), so that a claim recorded under an older wording by one run and
    a newer one by another is one row. A restated claim's row names the wording it was recorded
    under, whose measured values it shows. A recorded wording missing from ``now`` raises
    ``KeyError`` naming it."""
    rows: dict[tuple[str, str], dict] = {}
    for run, chapters in recorded.items():
        for chapter, counts in chapters.items():
            for line in counts.get("claims_not_held", []):
                text, value = split_recorded(line)
                try:
                    claim_now, kind = now[chapter][text]
                except KeyError:
                    raise KeyError(f"{run}, {chapter}: {text!r} is not in claims-now.json") from None
                status = "the shipped run's" if kind == "shipped" else f"restated; recorded as: {text}"
                row = rows.setdefault((chapter, claim_now), {"status": status, "values": {}})
                row["values"][run] = value
    runs = list(recorded)
    return [(chapter, text, row["status"], *(row["values"].get(r, "held") for r in runs))
            for (chapter, text), row in sorted(rows.items())]


def counts_across_runs(recorded: dict[str, dict]) -> list[tuple]:
    """Per chapter, ``(chapter, "held of claims" in each run)`` as each run recorded them."""
    chapters = list(dict.fromkeys(ch for chs in recorded.values() for ch in chs))
    return [(ch, *(f"{c['claims_held']} of {c['claims']}" if (c := chs.get(ch)) else "-"
                   for chs in recorded.values()))
            for ch in chapters]
