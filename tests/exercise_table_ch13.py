"""Rows of the exercise table for chapter 13 (why the phase change happens): wrong answers to the
in-context bigram predictor, the stages named from the KL divergences and the induction target a
clamped head attends to, each the slip of a learner who had it almost right, and right answers
written other ways. Added to ``exercise_table.ROWS`` by :func:`add`.
"""

from __future__ import annotations

import torch


def add(wrong, right, sol) -> None:
    """Append the rows (``wrong(check, label, fn, words, cls, avoid=...)``, ``right(...)``)."""
    _bigram(wrong, right, sol)
    _stages(wrong, right, sol)
    _induction(wrong, right, sol)


# ---- 13.1 the in-context bigram predictor ----------------------------------------------------------
def _bigram_by(tokens, k, alpha, upto_next=False, row_of=0, column=False, denom=None, smooth=True):
    """The bigram posterior with one slip: the transition out of t counted, the row of the symbol
    ``row_of`` places back, a column for a row, another denominator, no prior."""
    b, n = tokens.shape
    out = torch.zeros(b, n, k, dtype=torch.float64)
    for i in range(b):
        for t in range(n):
            counts = torch.zeros(k, k, dtype=torch.float64)
            for s in range(t + 1 if upto_next else t):
                if s + 1 < n:
                    counts[tokens[i, s], tokens[i, s + 1]] += 1
            if column:
                counts = counts.T
            a = tokens[i, max(t - row_of, 0)]
            row = counts[a]
            a_ = alpha if smooth else 0.0
            d = row.sum() + (k * alpha if denom is None else denom(k, alpha))
            out[i, t] = (row + a_) / d
    return out.float()


def _bigram(wrong, right, sol):
    C = "ch13.check_bigram_predictor"
    right(C, "the solution", sol("bigram_predictor"))
    right(C, "a loop over rows and positions", lambda t, k, a: _bigram_by(t, k, a))
    right(C, "in float64", lambda t, k, a: sol("bigram_predictor")(t, k, a).double())
    wrong(C, "the transition out of t counted", lambda t, k, a: _bigram_by(t, k, a, upto_next=True),
          "transition out of position t", "named")
    wrong(C, "the unigram", _unigram, "in-context unigram", "named")
    wrong(C, "the previous symbol's row", lambda t, k, a: _bigram_by(t, k, a, row_of=1), "symbol before the current",
          "named")
    wrong(C, "a column for a row", lambda t, k, a: _bigram_by(t, k, a, column=True), "transitions into", "named")
    wrong(C, "alpha once in the denominator", lambda t, k, a: _bigram_by(t, k, a, denom=lambda k, a: a),
          "k * alpha", "named")
    wrong(C, "zeros", lambda t, k, a: torch.zeros(*t.shape, k), "all zeros")
    wrong(C, "NaN at the first position", lambda t, k, a: (lambda p: p.index_fill(1, torch.tensor([0]), float("nan")))(
        sol("bigram_predictor")(t, k, a)), "NaN")


def _unigram(tokens, k, alpha):
    seen = torch.nn.functional.one_hot(tokens, k).double().cumsum(1)
    t = torch.arange(1, tokens.shape[1] + 1, dtype=torch.float64)[None, :, None]
    return ((seen + alpha) / (t + k * alpha)).float()


# ---- 13.2 the stages from the KL divergences --------------------------------------------------------
def _starts(steps, kl, pick="argmin", last=False, index=False, never=-1):
    kl = torch.as_tensor(kl)
    near = getattr(kl, pick)(-1).tolist()
    xs = list(range(len(steps))) if index else list(steps)
    out = []
    for i in range(3):
        hits = [s for s, j in zip(xs, near) if j == i]
        out.append((hits[-1] if last else hits[0]) if hits else never)
    return out


def _stages(wrong, right, sol):
    C = "ch13.check_stage_starts"
    right(C, "the solution", sol("stage_starts"))
    right(C, "with numpy", lambda steps, kl: [
        int(__import__("numpy").asarray(steps)[(__import__("numpy").asarray(kl).argmin(-1) == i)][0])
        if (__import__("numpy").asarray(kl).argmin(-1) == i).any() else -1 for i in range(3)])
    right(C, "a plain loop", lambda steps, kl: _starts(steps, kl))
    wrong(C, "the largest KL", lambda steps, kl: _starts(steps, kl, pick="argmax"), "smallest KL", "named")
    wrong(C, "the last step of each stage", lambda steps, kl: _starts(steps, kl, last=True), "first", "named")
    wrong(C, "indices, not steps", lambda steps, kl: _starts(steps, kl, index=True), "indices", "named")
    wrong(C, "each KL's lowest point", lambda steps, kl: [int(steps[int(torch.as_tensor(kl)[:, i].argmin())])
                                                          for i in range(3)], "lowest KL at that step", "named")
    wrong(C, "never as 0", lambda steps, kl: _starts(steps, kl, never=0), "-1, not 0", "named")
    wrong(C, "the last on a tie", lambda steps, kl: _starts(steps, torch.as_tensor(kl).flip(-1))[::-1], "on a tie",
          "named")


# ---- 13.3 the induction target ---------------------------------------------------------------------
def _pattern(tokens, target="after", fallback="prefix", normalise=True, causal=True):
    b, n = tokens.shape
    out = torch.zeros(b, n, n)
    for i in range(b):
        for q in range(n):
            for k in range(n):
                if target == "after":
                    hit = k >= 1 and (k - 1 < q if causal else k - 1 <= q) and tokens[i, k - 1] == tokens[i, q]
                else:  # the copy itself
                    hit = k < q and tokens[i, k] == tokens[i, q]
                out[i, q, k] = float(hit)
            if out[i, q].sum() == 0:
                if fallback == "prefix":
                    out[i, q, : q + 1] = 1.0
                elif fallback == "self":
                    out[i, q, q] = 1.0
                elif fallback == "first":
                    out[i, q, 0] = 1.0
            elif not normalise:
                continue
            s = out[i, q].sum()
            if s > 0:
                out[i, q] /= s
    return out


def _induction(wrong, right, sol):
    C = "ch13.check_induction_pattern"
    right(C, "the solution", sol("induction_pattern"))
    right(C, "loops over rows, queries and keys", lambda t: _pattern(t))
    right(C, "in float64", lambda t: sol("induction_pattern")(t).double())
    wrong(C, "the copy itself", lambda t: _pattern(t, target="copy"), "earlier copies themselves", "named")
    wrong(C, "a key after the query", lambda t: _pattern(t, causal=False), "after the query", "named")
    wrong(C, "no fallback", lambda t: _pattern(t, fallback="zero"), "no weight at all", "named")
    wrong(C, "falls back to itself", lambda t: _pattern(t, fallback="self"), "attends to itself", "named")
    wrong(C, "falls back to the first key", lambda t: _pattern(t, fallback="first"), "first key", "named")
    wrong(C, "not normalised", lambda t: _pattern(t, normalise=False), "sum to 1", "named")
    wrong(C, "transposed", lambda t: sol("induction_pattern")(t).transpose(-1, -2), "transpose")
