"""One measure per quantity: the numbers the book reports on more than one page, each defined once,
on named windows, with its standard error, and printed in one form.

A page reports a quantity in two lines::

    from attncircuits.analysis import quantities as Q
    icl = Q.measure("ICL score", model, "attn-only-2l")   # on the quantity's own windows
    print(icl)  # ICL score of attn-only-2l on 1024 spread validation windows: -0.57 ± 0.11 nats

``Q.measure(quantity, model, name, windows=None, condition="", head=None, **forward_kwargs)``
returns a :class:`Measured` (``.value``, ``.se``, ``.windows``); printing it (``str``, or
``f"{icl}"``) gives the one line "<quantity> of <model> on <windows>: value ± se unit", wrapped at
the book's 79 columns; :func:`table` prints several models' quantities under one header that
names the windows. Other windows are named, never implied: pass ``windows=`` from
:func:`validation_sample` (another count of validation windows) or :func:`repeated_tokens`
(another batch of random tokens), and a changed model says how in ``condition`` ("induction heads
ablated"). A value the training history recorded is :func:`from_history`, on the windows it was
measured on. A page that states a quantity in its own words names the windows in the same line
(``windows.name``), so that the reader can tell two numbers apart.

A page with its own models and windows (a family of models, a model trained on the page) does the
same: ``w = Q.Windows("the family's 256 eval windows", tokens)`` once, then
``print(Q.measure("ICL score", member, "fam-3l", w))`` for each member. ``name`` is the key the
check below compares across pages, so two different models never share a name in one book run.
A new quantity is one entry of :data:`QUANTITIES`, one of :data:`MENTIONS` and one branch of
:func:`per_row`.

The quantities (:data:`QUANTITIES`), each a mean over rows with its standard error
``std / sqrt(rows)`` (rows: windows of text, or rows of random tokens):

- ``"validation loss"``: mean next-token loss (nats) on :data:`LOSS_WINDOWS`, 128 validation
  windows spread evenly over the split (chapter 1's, and ``make replicate``'s, whose committed
  results are measured on them);
- ``"ICL score"``: Olsson et al.'s loss at a late token minus the loss at an early one (token 125
  vs 12 of 128, :func:`attncircuits.analysis.losses.icl_positions`) on :data:`ICL_WINDOWS`, 1024
  validation windows spread evenly over the split: one position of one window has 2-3 nats of
  noise, so it needs eight times the windows of the loss;
- ``"first-copy loss"`` and ``"second-copy loss"``: mean loss on the first and second copy of
  random tokens repeated twice (each copy's first target left out: nothing predicts it), on
  :func:`repeated_tokens` (16 rows of the longest length that fits, seed 0);
- ``"prefix matching"`` of one ``head``: Olsson et al.'s prefix-matching score on 16 rows of 25
  random tokens repeated 4 times (seed 0), the detectors' probe.

Every line printed is recorded (:data:`REPORTED`), and appended as one JSON line to the file that
``ATTNCIRCUITS_QUANTITY_LOG`` names: the notebook run (``tests/notebook_pages.py``) fails when two
pages print different values of the same quantity of the same model on the same windows, and
when a page names a quantity (:data:`MENTIONS`) in a line that names no windows (the names of
every :class:`Windows` made so far, and :data:`HISTORY_WINDOWS`).
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from attncircuits.analysis import losses
from attncircuits.analysis.scores import prefix_matching_scores
from attncircuits.checkpoints.pretrained import validation_windows
from attncircuits.core.heads import head_name

__all__ = ["HISTORY_WINDOWS", "ICL_WINDOWS", "LOSS_WINDOWS", "MENTIONS", "QUANTITIES", "Measured", "Windows", "from_history", "per_token_loss", "sample_name", "spread", "table",
           "measure", "repeated_tokens", "validation_sample"]

LOG_ENV = "ATTNCIRCUITS_QUANTITY_LOG"
#: the widest line a page may print (``tests/notebook_pages.py``'s ``LINE_LIMIT``)
WIDTH = 79


@dataclass(frozen=True)
class Windows:
    """Named inputs a quantity is measured on; ``name`` is what the printed line says."""

    name: str
    tokens: Tensor | None  # [rows, pos]; None for windows only a record describes (the history's)
    seq_len: int = 0  # random tokens: the length of one copy

    def __post_init__(self):  # a line may name these windows from now on (tests/notebook_pages.py)
        _log({"windows_name": self.name})


@dataclass(frozen=True)
class _Spec:
    unit: str
    sign: str  # "+" to print the sign (a difference), "" otherwise
    on: str  # "text" (validation windows) or "repeated" (random tokens)


#: every quantity the book reports on more than one page
QUANTITIES = {
    "validation loss": _Spec("nats", "", "text"),
    "ICL score": _Spec("nats", "+", "text"),
    "first-copy loss": _Spec("nats", "", "repeated"),
    "second-copy loss": _Spec("nats", "", "repeated"),
    "prefix matching": _Spec("", "", "repeated"),
}
#: how a printed line names each quantity (a line that matches names the quantity)
MENTIONS = {
    "validation loss": r"\bval(idation)?[ _]loss",
    "ICL score": r"\bICL\b|in-context[- ]learning score",
    "first-copy loss": r"\bfirst[- ]copy|\b1st copy",
    "second-copy loss": r"\bsecond[- ]copy|\b2nd copy",
    "prefix matching": r"\bprefix[- ]matching",
}
#: the validation loss's windows: how many, spread evenly over the split
LOSS_WINDOWS = 128
#: the ICL score's windows
ICL_WINDOWS = 1024

#: what a value read from a training history is measured on (random validation windows per evaluation)
HISTORY_WINDOWS = "the training history's evaluations"
#: every line printed in this process, as its record
REPORTED: list[dict] = []


def validation_sample(n: int, n_ctx: int = 128, directory=None) -> Windows:
    """``n`` validation windows of ``n_ctx`` tokens spread evenly over the split (of the corpus of the
    models in use, or ``directory``): the loss's 128 and the ICL score's 1024 are two of them."""
    return spread(validation_windows(n_ctx=n_ctx, directory=directory), n)


def spread(windows: Tensor, n: int) -> Windows:
    """``n`` of ``windows`` (every window of a split) spread evenly over them, named by
    :func:`sample_name`: the loss's 128 evenly spaced from first to last (chapter 1's), any other
    count every k-th window from the first (the ICL score's selection since chapter 7)."""
    if n == LOSS_WINDOWS or n >= len(windows):
        tokens = windows[torch.linspace(0, len(windows) - 1, min(n, len(windows))).long()]
    else:
        tokens = windows[:: len(windows) // n][:n]
    return Windows(sample_name(len(tokens)), tokens)


def sample_name(n: int) -> str:
    """The name of ``n`` validation windows spread over the split."""
    return f"{n} spread validation windows"


def repeated_tokens(model, seq_len: int | None = None, n_repeats: int = 2, batch_size: int = 16,
                    seed: int = 0) -> Windows:
    """Random tokens repeated (``[EOT]`` + ``n_repeats`` copies of ``seq_len``, by default the
    longest that fits), named by their shape and seed."""
    tokens = losses.repeated_tokens(model, seq_len, n_repeats, batch_size, seed)
    L = (tokens.shape[1] - 1) // n_repeats
    return Windows(f"{batch_size} rows of {L} random tokens x {n_repeats} (seed {seed})", tokens, L)


def default_windows(quantity: str, model) -> Windows:
    """The windows ``quantity`` is measured on unless a page names others."""
    n_ctx = model.cfg.n_ctx
    if quantity == "validation loss":
        return validation_sample(LOSS_WINDOWS, n_ctx)
    if quantity == "ICL score":
        return validation_sample(ICL_WINDOWS, n_ctx)
    if quantity == "prefix matching":
        return repeated_tokens(model, min(25, (n_ctx - 1) // 4), 4)
    return repeated_tokens(model)


@dataclass(frozen=True)
class Measured:
    """One quantity of one model on named windows; ``str()`` is the line a page prints."""

    quantity: str
    model: str
    windows: str
    value: float
    se: float | None  # None where the rows are not kept (the training history's means)
    condition: str = ""
    digits: int = 2

    def __str__(self) -> str:
        spec = QUANTITIES[self.quantity]
        cond = f" ({self.condition})" if self.condition else ""
        se = f" ± {self.se:.{self.digits}f}" if self.se is not None else ""
        unit = f" {spec.unit}" if spec.unit else ""
        line = (f"{self.quantity} of {self.model}{cond} on {self.windows}: "
                f"{self.value:{spec.sign}.{self.digits}f}{se}{unit}")
        text = "\n".join(textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False))
        _record(self, text)
        return text

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(self.value, spec)


def table(measures: list[Measured], extra: dict[str, dict[str, str]] | None = None) -> str:
    """Several models' quantities as one table: a column a quantity, a row a model, the windows
    named above it (each column's when they differ); ``extra`` adds columns of text the page
    computed, ``{header: {model: cell}}``. Every value is recorded as :func:`measure`'s lines are."""
    cols = list(dict.fromkeys(m.quantity for m in measures))
    rows = list(dict.fromkeys(m.model + (f" ({m.condition})" if m.condition else "") for m in measures))
    cell = {(m.model + (f" ({m.condition})" if m.condition else ""), m.quantity): m for m in measures}
    where = {q: next(m.windows for m in measures if m.quantity == q) for q in cols}
    units = {QUANTITIES[q].unit for q in cols}
    unit = f", {units.pop()}" if len(units) == 1 and "" not in units else ""
    if len(set(where.values())) == 1:
        head = [f"on {next(iter(where.values()))}{unit} (± s.e.):"]
    else:
        head = [f"{q} on {w}{unit} (± s.e.):" for q, w in where.items()]
    head = [part for line in head for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ")]
    extra = extra or {}
    width = max(map(len, rows))
    def fmt(m):
        spec = QUANTITIES[m.quantity]
        se = f" ± {m.se:.{m.digits}f}" if m.se is not None else ""
        return f"{m.value:{spec.sign}.{m.digits}f}{se}"
    lines = head + [f"{'':<{width}}" + "".join(f"  {c:>{max(len(c), 12)}}" for c in (*cols, *extra))]
    for r in rows:
        cells = [fmt(cell[r, q]) if (r, q) in cell else "-" for q in cols]
        cells += [extra[e].get(r, "-") for e in extra]
        lines.append(f"{r:<{width}}" + "".join(f"  {x:>{max(len(c), 12)}}" for x, c in zip(cells, (*cols, *extra))))
    text = "\n".join(lines)
    for m in measures:
        _record(m, text)
    return text


def _record(m: Measured, text: str) -> None:
    row = {**asdict(m), "text": text}
    REPORTED.append(row)
    _log(row)


def _log(row: dict) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _mean_se(rows: Tensor) -> tuple[float, float]:
    rows = rows.double()
    se = (rows.std() / math.sqrt(len(rows))).item() if len(rows) > 1 else float("nan")
    return rows.mean().item(), se


_NLL: dict = {}  # (id(model), windows, weights' checksum) -> per-token loss, intact models only


def _fingerprint(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _nll_key(model, windows: Windows) -> tuple:
    """The key of an intact model's per-token loss on ``windows`` in :data:`_NLL`."""
    return id(model), windows.name, _fingerprint(model)


@torch.no_grad()
def per_token_loss(model, windows: Windows, cached: bool = True, **forward_kwargs) -> Tensor:
    """The per-token loss ``[row, pos - 1]`` on ``windows`` that the loss and ICL score average (kept
    for an intact model, so a page that also draws it, and a second quantity, cost no second pass;
    ``cached=False`` for a model changed by hooks around the call)."""
    if forward_kwargs or not cached:
        return losses.per_token_loss(model, windows.tokens, **forward_kwargs)
    key = _nll_key(model, windows)
    if key not in _NLL:
        if len(_NLL) > 16:
            _NLL.clear()
        _NLL[key] = losses.per_token_loss(model, windows.tokens)
    return _NLL[key]


@torch.no_grad()
def per_row(quantity: str, model, windows: Windows, head=None, cached: bool = True, **forward_kwargs) -> Tensor:
    """The quantity on each row of ``windows`` (its mean is :func:`measure`'s value)."""
    tokens = windows.tokens
    if tokens is None:
        raise ValueError(f"{windows.name} keep no tokens to measure on; use from_history for its values")
    if quantity == "validation loss":
        return per_token_loss(model, windows, cached, **forward_kwargs).mean(1)
    if quantity == "ICL score":
        key = _nll_key(model, windows)
        if not forward_kwargs and cached and key in _NLL:  # a page that drew the loss already
            return losses.icl_scores_per_row(_NLL[key], model.cfg.n_ctx)
        return losses.icl_rows(model, tokens, **forward_kwargs)  # two positions unembedded, not all
    L = windows.seq_len
    if quantity in ("first-copy loss", "second-copy loss"):
        c = 0 if quantity == "first-copy loss" else 1
        nll = per_token_loss(model, windows, cached, **forward_kwargs)
        return nll[:, c * L + 1: (c + 1) * L].mean(1)  # as RepeatedLossCurve.copy_means
    if quantity == "prefix matching":
        if head is None:
            raise ValueError("prefix matching is a head's score: pass head=(layer, head)")
        n_rep = (tokens.shape[1] - 1) // L
        return torch.stack([prefix_matching_scores(model, L, n_rep, tokens=row[None], **forward_kwargs)[tuple(head)]
                            for row in tokens])
    raise ValueError(f"unknown quantity {quantity!r}; the book's quantities are {', '.join(QUANTITIES)}")


def measure(quantity: str, model, name: str, windows: Windows | None = None, condition: str = "",
            head=None, digits: int = 2, **forward_kwargs) -> Measured:
    """``quantity`` of ``model`` (called ``name`` on the page) on ``windows`` (default: the quantity's
    own, :func:`default_windows`), with its standard error over the rows. ``condition`` says what
    was done to the model (``forward_kwargs`` such as ``ablate=``, or hooks around the call); a
    ``head``'s score is named after it."""
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; the book's quantities are {', '.join(QUANTITIES)}")
    if forward_kwargs and not condition:
        raise ValueError(f"{quantity} of a changed model ({', '.join(forward_kwargs)}) needs condition= to say how")
    windows = windows if windows is not None else default_windows(quantity, model)
    value, se = _mean_se(per_row(quantity, model, windows, head, not condition, **forward_kwargs))
    if head is not None:
        name = f"{name} {head_name(*head)}"
    return Measured(quantity, name, windows.name, value, se, condition, digits)


#: the training history's names of the quantities it records
_HISTORY_KEYS = {"validation loss": "val_loss", "ICL score": "icl_score"}


def from_history(quantity: str, history: dict, name: str, step: int | None = None, digits: int = 2) -> Measured:
    """``quantity`` as the training history recorded it at ``step`` (default: the last evaluation),
    on the windows it was measured on: the history's eval batches, random validation windows drawn
    at each evaluation and random tokens repeated (means only, so no standard error)."""
    key = _HISTORY_KEYS.get(quantity)
    if key is None:
        raise ValueError(f"the training history records {', '.join(_HISTORY_KEYS)}, not {quantity!r}")
    steps = history["step"]
    k = len(steps) - 1 if step is None else steps.index(step)
    where = f"{HISTORY_WINDOWS} at step {steps[k]:,}"
    return Measured(quantity, name, where, float(history[key][k]), None, "", digits)


def mentions(line: str) -> list[str]:
    """The quantities a printed line names (:data:`MENTIONS`)."""
    return [q for q, pat in MENTIONS.items() if re.search(pat, line, re.I)]
