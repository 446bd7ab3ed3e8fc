"""Rows of the exercise table for the kinds of wrong answer that fixed cases miss: answers wrong
only at an edge the text allows (the extreme at the last position, a loss of 0, a leading
``None``, a variance near zero, a value exactly at a level, a second start token in a row),
answers that change the caller's inputs in place (a numpy array too), answers of
the wrong type, and the slips whose messages once named a mistake they did not make (``avoid``:
words a message must not contain). Added to ``exercise_table.ROWS`` by :func:`add`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

import exercise_table_early_edges


def add(wrong, right, sol) -> None:
    """Append the rows (``wrong(check, label, fn, words, cls, avoid=...)``, ``right(...)``)."""
    _chapter_10(wrong, right, sol)
    _chapters_11_12(wrong, right, sol)
    exercise_table_early_edges.add(wrong, right, sol)
    _in_place(wrong, sol)
    _types(wrong, right, sol)


def _vals(v):
    return [x for x in v if x is not None]


def _bump(vals):
    best, bump = vals[0], 0.0
    for x in vals:
        best = min(best, x)
        bump = max(bump, x - best)
    return float(bump)


def _strip_nones(v):
    while None in v:
        v.remove(None)
    return _bump(v)


def _np_nan(v):
    a = np.array(v, dtype=float)
    return float(np.max(a - np.minimum.accumulate(a)))


def _leading(v):
    best, bump = v[0], 0.0  # a None first reaches min()
    for x in v:
        if x is not None:
            best = min(best, x)
            bump = max(bump, x - best)
    return float(bump)


def _chapter_10(wrong, right, sol) -> None:
    C = "ch10.check_loss_bump"
    wrong(C, "skips the last value", lambda v: _bump(_vals(v)[:-1] or _vals(v)), "generated")
    wrong(C, "a noise threshold of 0.02", lambda v: (lambda b: b if b > 0.02 else 0.0)(_bump(_vals(v))), "generated")
    wrong(C, "if v: drops a loss of 0", lambda v: _bump([x for x in v if x] or [0.0]), "generated")
    wrong(C, "a leading None reaches min()", _leading, "TypeError")
    wrong(C, "removes the Nones from the caller's list", _strip_nones, "in place", "named")
    wrong(C, "a 0-d tensor", lambda v: torch.tensor(_bump(_vals(v))), "0-d tensor", "named")
    wrong(C, "the int 0 for a curve that only falls", lambda v: (lambda b: b if b else 0)(_bump(_vals(v))), "int",
          "named")
    wrong(C, "int truncation", lambda v: float(int(_bump(_vals(v)))), "expected", avoid="nothing was added")
    wrong(C, "the rise at the last point", lambda v: float(_vals(v)[-1] - min(_vals(v))), "expected",
          avoid="nothing was added")
    wrong(C, "only after the global minimum", lambda v: (lambda w: float(max(w[w.index(min(w)):]) - min(w)))(_vals(v)),
          "expected", avoid="nothing was added")
    wrong(C, "skips the first point", lambda v: _bump(_vals(v)[1:] or _vals(v)), "expected", avoid="nothing was added")
    wrong(C, "a hard-coded 0.0", lambda v: 0.0, "got 0", avoid="nothing was added")
    wrong(C, "None as NaN by np.array", _np_nan, "nan", avoid="log of 0")
    right(C, "a numpy running minimum", lambda v: (lambda a: float((a - np.minimum.accumulate(a)).max()))(
        np.array(_vals(v), dtype=float)))
    right(C, "itertools.accumulate", lambda v: float(max(x - m for x, m in zip(_vals(v), itertools.accumulate(
        _vals(v), min)))))

    C = "ch10.check_frozen_ln"

    def scaled(f):
        return lambda comps, resid: (comps - comps.mean(-1, keepdim=True)) / f(
            (resid - resid.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True))

    wrong(C, "sqrt(var) + 1e-5", scaled(lambda v: v.sqrt() + 1e-5), "generated")
    wrong(C, "no epsilon", scaled(lambda v: v.sqrt()), "generated")
    wrong(C, "an epsilon of 1e-6", scaled(lambda v: (v + 1e-6).sqrt()), "generated")
    wrong(C, "centres the caller's components in place", lambda comps, resid: sol("frozen_ln")(
        comps.sub_(comps.mean(-1, keepdim=True)), resid), "in place", "named")
    right(C, "the scale from components.sum(0)", lambda comps, resid: sol("frozen_ln")(comps, comps.sum(0)))
    right(C, "rsqrt of the biased variance", lambda comps, resid: (comps - comps.mean(-1, keepdim=True)) * torch.rsqrt(
        resid.var(-1, unbiased=False, keepdim=True) + 1e-5))

    C = "ch10.check_fold_ln_into"

    def fold(w, b_ln, W, b, bias=None, centre=None):
        F = w[:, None] * W
        Wf = centre(F, w, W) if centre else F - F.mean(-2, keepdim=True)
        return Wf, bias(w, b_ln, W, b, Wf) if bias else b + torch.einsum("d,...de->...e", b_ln, W)

    def ein(x, W):
        return torch.einsum("d,...de->...e", x, W)

    mistakes = {
        "the bias through the centred folded weight": dict(bias=lambda w, bl, W, b, Wf: b + ein(bl, Wf)),
        "b dropped": dict(bias=lambda w, bl, W, b, Wf: ein(bl, W)),
        "b_ln @ W subtracted": dict(bias=lambda w, bl, W, b, Wf: b - ein(bl, W)),
        "the folded bias centred too": dict(bias=lambda w, bl, W, b, Wf: (lambda x: x - x.mean(-1, keepdim=True))(
            b + ein(bl, W))),
        "centred by the mean over every axis": dict(centre=lambda F, w, W: F - F.mean()),
        "centred by W's mean, not the folded weight's": dict(centre=lambda F, w, W: F - W.mean(-2, keepdim=True)),
        "the bias divided by the gain": dict(bias=lambda w, bl, W, b, Wf: b + ein(bl / w, W)),
    }
    named = ("the bias through the centred folded weight", "b dropped", "b_ln @ W subtracted",
             "the folded bias centred too")  # diagnoses verified on every case
    for label, how in mistakes.items():
        wrong(C, label, lambda *a, how=how: fold(*a, **how), "b_folded" if "bias" in how else "W_folded",
              "named" if label in named else "symptom")
    wrong(C, "scales the caller's W in place", lambda w, b_ln, W, b: (lambda bf: ((lambda F: F - F.mean(
        -2, keepdim=True))(W.mul_(w[:, None])), bf))(b + ein(b_ln, W)), "in place", "named")
    right(C, "centre W then scale (the gain's mean is not the point)", lambda w, b_ln, W, b: (
        (w[:, None] * W) - (w[:, None] * W).sum(-2, keepdim=True) / W.shape[-2], b + b_ln @ W))


def _first_at(v, level, strict=False):
    a = np.asarray(v, dtype=float)
    return int(np.argmax(a > level if strict else a >= level))


def _copy_mass(pattern, tokens, shift, bos_query=False):
    """copy_attention, with the start token's queries kept when ``bos_query``."""
    n = tokens.shape[1]
    src = torch.full_like(tokens, -1)
    src[:, shift:] = tokens[:, : n - shift]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None]
    mask = (src[:, None, :] == tokens[:, :, None]) & (k - shift < q) & (k <= q)
    if not bos_query:
        mask &= tokens[:, :, None] != 0
    has = mask.any(-1)
    return ((pattern * mask[:, None]).sum(-1) * has[:, None]).sum((0, 2)) / has.sum().clamp(min=1)


def _grammar_rows(model, task, paths):
    """The grammar read on rows BOS, trigger, cue by ``paths(logits, pattern, ov, row) -> [vocab]``,
    then the largest among the answer tokens."""
    from attncircuits.analysis.circuits import full_ov_circuit

    ov = [full_ov_circuit(model, 0, h).AB for h in range(model.cfg.n_heads)]
    answers = torch.tensor(task.answer_tokens)
    table = torch.zeros(len(task.cues), len(task.triggers), dtype=torch.long)
    for i, cue in enumerate(task.cues):
        for j, trig in enumerate(task.triggers):
            row = torch.tensor([[0, trig, cue]])
            logits, cache = model.run_with_cache(row)
            out = paths(logits[0, -1], cache.pattern[0][0, :, -1], ov, row[0])
            table[i, j] = out if out.ndim == 0 else answers[out[answers].argmax()]
    return table


def _chapters_11_12(wrong, right, sol) -> None:
    """Answers the fixed cases of chapters 11 and 12 once let through: a level reached only
    exactly at hi, a tie reached at different evaluations, a second start token in a row, a
    non-answer token with the largest logit, heads whose paths do not decide every answer."""
    C = "ch11.check_rise_window"
    wrong(C, "> at the hi level only (np.argmax)", lambda s, v, lo=0.2, hi=0.8: tuple(
        s[_first_at(v, v[0] + f * (max(v) - v[0]), strict)] for f, strict in ((lo, False), (hi, True))),
          "hi level counts as reaching it", "named")
    wrong(C, "> at the lo level only (np.argmax)", lambda s, v, lo=0.2, hi=0.8: tuple(
        s[_first_at(v, v[0] + f * (max(v) - v[0]), strict)] for f, strict in ((lo, True), (hi, False))),
          "lo level counts as reaching it", "named")

    C = "ch11.check_best_induction_head"
    wrong(C, "np.argmax over evaluations, layers and heads at once", lambda pm: (lambda a: (lambda e, l, h: (
        int(l) + 1, int(h)))(*np.unravel_index(np.argmax(a), a.shape)))(np.asarray(pm)[:, 1:]), "on a tie", "named")

    C = "ch12.check_copy_attention"
    wrong(C, "the start token kept as a query", lambda p, t, s: _copy_mass(p, t, s, bos_query=True),
          "start token (id 0) counted as a query", "named")
    right(C, "queries masked by token id, not by position", lambda p, t, s: _copy_mass(p, t, s))

    C = "ch12.check_grammar_2"
    wrong(C, "the largest logit over the whole vocabulary", lambda m, t: _grammar_rows(
        m, t, lambda logits, pat, ov, row: logits.argmax()), "whole vocabulary", "named")
    wrong(C, "the heads' paths without the direct path", lambda m, t: _grammar_rows(
        m, t, lambda logits, pat, ov, row: sum(pat[h] @ ov[h][row] for h in range(len(ov)))), "direct path is missing",
          "named")
    wrong(C, "rows [trigger, BOS, cue]", lambda m, t: torch.stack([torch.stack([
        torch.tensor(t.answer_tokens)[m(torch.tensor([[tr, 0, cue]]))[0, -1, t.answer_tokens].argmax()]
        for tr in t.triggers]) for cue in t.cues]), "entries differ")
    right(C, "rows with a filler between trigger and cue", lambda m, t: torch.stack([torch.stack([
        torch.tensor(t.answer_tokens)[m(torch.tensor([[0, tr, 40, cue]]))[0, -1, t.answer_tokens].argmax()]
        for tr in t.triggers]) for cue in t.cues]))


def _in_place(wrong, sol) -> None:
    """Right values, but the caller's inputs are changed."""
    wrong("ch11.check_best_induction_head", "masks layer 0 of the caller's numpy array with -inf", lambda pm: (
        pm.__setitem__((slice(None), 0), -np.inf), sol("best_induction_head")(pm))[1], "in place", "named")
    wrong("ch01.check_attention_pattern", "scales q in place", lambda q, k: (lambda s: s.masked_fill(
        ~torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).tril(), float("-inf")).softmax(-1))(
        q.div_(math.sqrt(q.shape[-1])) @ k.transpose(-1, -2)), "in place", "named")
    wrong("ch01.check_next_token_loss", "log-softmaxes the logits in place", lambda lg, t: float(-lg.sub_(
        lg.logsumexp(-1, keepdim=True))[:, :-1].gather(-1, t[:, 1:, None]).mean()), "in place", "named")
    wrong("ch02.check_bigram_kl", "exponentiates the log-probs in place", lambda lp, c: sol("bigram_kl")(
        lp.exp_().log(), c), "in place", "named")
    wrong("ch05.check_composition_score", "normalises first in place", lambda a, b: float(
        (a.div_(a.norm()) @ b.div_(b.norm())).norm()), "in place", "named")
    wrong("ch07.check_icl_score", "adds 1 to nll in place (a difference keeps)", lambda n, late, early: sol(
        "icl_score")(n.add_(1.0), late, early), "in place", "named")


def _types(wrong, right, sol) -> None:
    """The text asks for a float (or an int): a 0-d tensor, or an int where a float is asked, is not
    one; a numpy integer where an int is asked is (the text allows any integer)."""
    wrong("ch05.check_composition_score", "a 0-d tensor", lambda a, b: (a @ b).norm() / (a.norm() * b.norm()),
          "0-d tensor", "named")
    right("ch03.check_positional_head", "a numpy integer", lambda m: __import__("numpy").int64(sol("positional_head")(m)))
