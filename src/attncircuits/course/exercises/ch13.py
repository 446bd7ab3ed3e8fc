"""Checks for chapter 13 (why the phase change happens): the in-context bigram predictor, the
induction target a clamped head attends to, and the stages named from the KL divergences.

The references are the package's: :meth:`attncircuits.data.markov.MarkovChains.predictors`,
:func:`attncircuits.train.clamps.target_pattern` and :func:`attncircuits.train.markov.stage_steps`;
each is withheld while the learner's function runs.
"""

from __future__ import annotations

import torch

from attncircuits.analysis.scores import prefix_match_targets
from attncircuits.course.exercises._core import Case, Diagnosis, Draw, Identity, guarded, run_check
from attncircuits.data.markov import PREDICTORS, MarkovChains
from attncircuits.train import clamps, markov

__all__ = ["check_bigram_predictor", "check_induction_pattern", "check_stage_starts"]


# ---- 13.1 the in-context bigram predictor ---------------------------------------------------------
def bigram_predictor(tokens, k, alpha):
    """The reference: the bigram posterior mean of :class:`MarkovChains` at every position."""
    return MarkovChains(k, max(3, tokens.shape[1]), alpha).predictors(tokens)["bigram"]


def _counts(tokens, k, upto_next=False):
    """``[batch, pos, k, k]`` transition counts seen before position t (or up to t + 1)."""
    b, n = tokens.shape
    pairs = torch.zeros(b, n + 1, k * k, dtype=torch.float64)
    pairs[:, 1:n] = torch.nn.functional.one_hot(tokens[:, :-1] * k + tokens[:, 1:], k * k).double()
    c = pairs.cumsum(1)
    return (c[:, 1 : n + 1] if upto_next else c[:, :n]).view(b, n, k, k)


def _row(counts, sym):
    b, n, k, _ = counts.shape
    return counts.gather(2, sym[:, :, None, None].expand(b, n, 1, k))[:, :, 0]


def _post(rows, k, alpha, denom_alpha=None):
    da = k * alpha if denom_alpha is None else denom_alpha
    return ((rows + alpha) / (rows.sum(-1, keepdim=True) + da)).float()


@guarded
def check_bigram_predictor(fn) -> bool:
    """Exercise 13.1: ``bigram_predictor(tokens [batch, pos], k, alpha) -> [batch, pos, k]``, the
    posterior mean of the symbol after each position under Dirichlet(alpha) transition rows."""
    chains, _ = MarkovChains(3, 40, 1.0).sample(6, seed=3)
    small, _ = MarkovChains(2, 12, 0.5).sample(3, seed=4)
    cases = [
        Case("6 chains of 40 over 3 symbols, alpha 1", (chains, 3, 1.0)),
        Case("3 chains of 12 over 2 symbols, alpha 0.5", (small, 2, 0.5), kind="random"),
        Case("0 1 0 1 0 0 1 (k 2, alpha 1)", (torch.tensor([[0, 1, 0, 1, 0, 0, 1]]), 2, 1.0), kind="hand-built"),
        Case("symbol 3 never seen, 2 1 2 2 1 (k 4, alpha 2)", (torch.tensor([[2, 1, 2, 2, 1]]), 4, 2.0), kind="hand-built"),
    ]

    def leaks(e, c):
        t, k, a = c.args
        return _post(_row(_counts(t, k, upto_next=True), t), k, a)

    def unigram(e, c):
        t, k, a = c.args
        return MarkovChains(k, max(3, t.shape[1]), a).predictors(t)["unigram"]

    def previous_row(e, c):
        t, k, a = c.args
        prev = torch.cat([t[:, :1], t[:, :-1]], 1)
        return _post(_row(_counts(t, k), prev), k, a)

    def column(e, c):
        t, k, a = c.args
        return _post(_row(_counts(t, k).transpose(-1, -2), t), k, a)

    def one_alpha(e, c):
        t, k, a = c.args
        return _post(_row(_counts(t, k), t), k, a, denom_alpha=a)

    return run_check(
        fn, cases, bigram_predictor,
        [
            Diagnosis("you counted the transition out of position t too: that is the symbol to predict; count only "
                      "the transitions before it", leaks),
            Diagnosis("that is the in-context unigram: count what followed the current symbol, not every symbol", unigram),
            Diagnosis("you read the counts of the symbol before the current one; the next symbol follows the "
                      "current one", previous_row),
            Diagnosis("you counted transitions into the current symbol (a column); count those out of it (its row)",
                      column),
            Diagnosis("the denominator adds alpha once; the prior adds alpha to each of the k counts, so k * alpha",
                      one_alpha),
        ],
        atol=1e-5, axes=("batch", "position", "symbol"), generate=_chains,
        identities=[Identity("alpha > 0 and every token is a symbol 0..k-1",
                             lambda t, k, a: a > 0 and bool(((t >= 0) & (t < k)).all()))],
        withheld=[(MarkovChains, "predictors"), bigram_predictor],
    )


def _chains(draw: Draw):
    """Chains of 2-6 symbols, 2-30 positions, alpha 0.1-3; edges: two positions, one symbol
    repeated, k = 2 with alpha 0.1, one row."""
    edge = draw.edge(4)
    k = (3, 2, 2, 4)[edge] if edge is not None else draw.int(2, 6)
    n = (2, 9, 10, 6)[edge] if edge is not None else draw.int(2, 30)
    b = 1 if edge == 3 else draw.int(1, 4)
    alpha = (1.0, 1.0, 0.1, 3.0)[edge] if edge is not None else round(float(draw.rand(1, lo=0.1, hi=3.0)), 2)
    tokens = (draw.rand(b, n) * k).long().clamp(max=k - 1)
    if edge == 1:
        tokens[:] = 1
    return tokens, k, alpha


# ---- 13.2 the induction target, as a clamp -------------------------------------------------------
def induction_pattern(tokens):
    """The reference: :func:`attncircuits.train.clamps.target_pattern` for the induction target."""
    return clamps.target_pattern(clamps.Clamp(1, 0, "induction"), tokens)


def _fallback(match, how):
    b, n, _ = match.shape
    some = match.sum(-1, keepdim=True) > 0
    other = {"prefix": torch.ones(n, n).tril(), "self": torch.eye(n), "first": torch.zeros(n, n).index_fill_(1, torch.tensor([0]), 1.0),
             "zero": torch.zeros(n, n)}[how].expand(b, n, n)
    p = torch.where(some, match, other)
    s = p.sum(-1, keepdim=True)
    return p / torch.where(s > 0, s, torch.ones_like(s))


@guarded
def check_induction_pattern(fn) -> bool:
    """Exercise 13.3: ``induction_pattern(tokens [batch, pos]) -> [batch, q, k]``: each query attends
    evenly to the keys right after earlier copies of its token, else evenly to keys 0..q."""
    g = torch.Generator().manual_seed(5)
    half = torch.randint(1, 30, (4, 7), generator=g)
    repeated = torch.cat([torch.zeros(4, 1, dtype=torch.long), half, half], 1)
    chains, _ = MarkovChains(3, 20, 1.0).sample(3, seed=6)
    cases = [
        Case("[EOT] + 7 random tokens twice, 4 rows", (repeated,)),
        Case("3 chains of 20 over 3 symbols", (chains,), kind="random"),
        Case("a b a b a (as 1 2 1 2 1)", (torch.tensor([[1, 2, 1, 2, 1]]),), kind="hand-built"),
        Case("one token repeated: 4 4 4 4", (torch.tensor([[4, 4, 4, 4]]),), kind="hand-built"),
    ]

    def dup(e, c):
        t = c.args[0]
        n = t.shape[1]
        match = ((t[:, :, None] == t[:, None, :]) & torch.ones(n, n, dtype=torch.bool).tril(-1)).float()
        return _fallback(match, "prefix")

    def future(e, c):
        t = c.args[0]
        n = t.shape[1]
        m = torch.zeros(t.shape[0], n, n)
        m[:, :, 1:] = (t[:, :, None] == t[:, None, :-1]).float() * torch.ones(n, n - 1).tril(0)
        return _fallback(m, "prefix")

    def fb(how):
        return lambda e, c: _fallback(prefix_match_targets(c.args[0]).float(), how)

    return run_check(
        fn, cases, induction_pattern,
        [
            Diagnosis("you attend to the earlier copies themselves; the induction target is the key right after "
                      "each copy", dup),
            Diagnosis("a key after the query gets weight: the copy before key k must come before the query (k - 1 < q)",
                      future),
            Diagnosis("a query whose token has no earlier copy gets no weight at all; spread it evenly over keys 0..q",
                      fb("zero")),
            Diagnosis("a query with no earlier copy attends to itself; spread it evenly over keys 0..q", fb("self")),
            Diagnosis("a query with no earlier copy attends to the first key; spread it evenly over keys 0..q",
                      fb("first")),
            Diagnosis("each row must sum to 1: divide the matches by how many there are",
                      lambda e, c: torch.where(prefix_match_targets(c.args[0]).any(-1, keepdim=True),
                                               prefix_match_targets(c.args[0]).float(), e)),
        ],
        atol=1e-5, axes=("batch", "query", "key"), generate=_token_rows,
        withheld=[clamps.target_pattern, clamps.clamp_patterns, induction_pattern],
    )


def _token_rows(draw: Draw):
    """Token rows of 1-3 rows, 1-24 positions over 2-12 ids; edges: one position, every token
    distinct, one id only."""
    edge = draw.edge(3)
    n = (1, 8, 5)[edge] if edge is not None else draw.int(1, 24)
    b = draw.int(1, 3)
    if edge == 1:
        return (torch.arange(n).repeat(b, 1),)
    vocab = 1 if edge == 2 else draw.int(2, 12)
    return ((draw.rand(b, n) * vocab).long().clamp(max=vocab - 1),)


# ---- 13.3 the stages from the KL divergences ------------------------------------------------------
def stage_starts(steps, kl):
    """The reference: the first step at which each predictor is the nearest (-1: never)."""
    log = {"step": list(steps), **{f"kl_{p}": [float(row[i]) for row in kl] for i, p in enumerate(PREDICTORS)}}
    return [-1 if s is None else s for s in markov.stage_steps(log).values()]


@guarded
def check_stage_starts(fn) -> bool:
    """Exercise 13.2: ``stage_starts(steps, kl [evaluation, 3]) -> list[int]``: for uniform, unigram
    and bigram (the columns of ``kl``), the first step where that predictor is the nearest; -1 if never."""
    runs = markov.load_results()["runs"]
    res = next((r for r in runs if (r["k"], r["seed"]) == (3, 0)), runs[0])
    cases = []
    for n in ("2", "1"):
        run = res["runs"][n]
        kl = torch.tensor([run[f"kl_{p}"] for p in PREDICTORS]).T
        cases.append(Case(f"the committed {n}-layer run (k={res['k']}, seed {res['seed']})", (list(run["step"]), kl)))
    cases += [
        Case("uniform, unigram, back to uniform, bigram", ([0, 10, 20, 30, 40], torch.tensor(
            [[0.1, 0.3, 0.5], [0.3, 0.1, 0.4], [0.2, 0.3, 0.4], [0.4, 0.3, 0.1], [0.5, 0.3, 0.05]])), kind="hand-built"),
        Case("the unigram stage never reached", ([0, 50, 100], torch.tensor(
            [[0.1, 0.2, 0.5], [0.3, 0.4, 0.2], [0.4, 0.5, 0.1]])), kind="hand-built"),
    ]

    def argmax(e, c):
        return _starts(c.args[0], c.args[1], largest=True)

    def last(e, c):
        return _starts(c.args[0], c.args[1], last=True)

    def index(e, c):
        return _starts(list(range(len(c.args[0]))), c.args[1])

    def per_column(e, c):
        steps, kl = c.args
        return [int(steps[int(torch.as_tensor(kl)[:, i].argmin())]) for i in range(3)]

    def last_on_tie(e, c):
        steps, kl = c.args
        flipped = torch.as_tensor(kl).flip(-1)
        return [x for x in _starts(steps, flipped)][::-1]

    def none_as_zero(e, c):
        return [0 if s == -1 else s for s in e]

    return run_check(
        fn, cases, stage_starts,
        [
            Diagnosis("the nearest predictor has the smallest KL, not the largest", argmax),
            Diagnosis("that is the last step of each stage; the exercise asks for the first", last),
            Diagnosis("those are indices of the evaluations; return the steps", index),
            Diagnosis("that is the step where each KL is lowest over training; the stage at a step is the "
                      "predictor with the lowest KL at that step", per_column),
            Diagnosis("a stage never reached is -1, not 0", none_as_zero),
            Diagnosis("on a tie the first predictor in the order (uniform, unigram, bigram) is the stage", last_on_tie),
        ],
        atol=0, rtol=0, returns=list, generate=_kl_history, withheld=[markov.stage_steps, markov.stage_of, stage_starts],
    )


def _starts(steps, kl, largest=False, last=False):
    kl = torch.as_tensor(kl)
    near = (kl.argmax(-1) if largest else kl.argmin(-1)).tolist()
    out = []
    for i in range(3):
        hits = [s for s, j in zip(steps, near) if j == i]
        out.append((hits[-1] if last else hits[0]) if hits else -1)
    return out


def _kl_history(draw: Draw):
    """1-10 evaluations 25 steps apart, KLs in [0, 1]; edges: one evaluation, a tie between two
    predictors (the first in the order wins), one stage throughout."""
    edge = draw.edge(3)
    e = 1 if edge == 0 else draw.int(2, 10)
    kl = draw.rand(e, 3).double()
    if edge == 1:
        kl[:, 1] = kl[:, 0] = kl.min(-1).values / 2
    if edge == 2:
        kl[:, 2] = 0.0
    return [25 * i for i in range(e)], kl.round(decimals=3)
