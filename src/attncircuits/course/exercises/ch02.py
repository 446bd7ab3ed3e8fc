"""Checks for chapter 2, zero layers: the bigram table read from the weights, the table counted in
the corpus, and two ways to compare them weighted by how often each bigram occurs.

The references are in :mod:`attncircuits.analysis.circuits.bigrams`: ``bigram_log_probs``, ``count_bigrams``,
``cross_entropy - conditional_entropy`` (the KL that ``compare_bigram_tables`` reports) and
``weighted_pearson`` on the observed bigrams (its Pearson). While the learner's function runs,
``bigram_log_probs``, ``count_bigrams`` and ``compare_bigram_tables`` (the package's own answers)
are withheld.
"""

from __future__ import annotations

import torch

from attncircuits.analysis.circuits.bigrams import (
    bigram_log_probs,
    compare_bigram_tables,
    conditional_entropy,
    count_bigrams,
    cross_entropy,
    next_token_kl,
    weighted_pearson,
)
from attncircuits.checkpoints.pretrained import load_validation_tokens
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises._core import (
    Case,
    Diagnosis,
    Draw,
    Method,
    guarded,
    random_model,
    random_tokens,
    run_check,
    shipped,
)

__all__ = ["check_bigram_table", "check_bigram_counts", "check_bigram_kl", "check_bigram_correlation"]


# ---- Exercise 2.1 --------------------------------------------------------------------------------
def _product(case):
    model = case.args[0]
    return model.W_E @ model.W_U


@guarded
def check_bigram_table(bigram_table) -> bool:
    """``bigram_table(model)`` -> ``log p(b | a)`` from ``W_E`` and ``W_U``, ``[d_vocab, d_vocab]``."""
    cases = [
        Case("attn-only-0l", (shipped("attn-only-0l").model,)),
        Case("attn-only-2l's direct path", (shipped("attn-only-2l").model,)),
        Case("a random model", (random_model(n_layers=0, seed=1),), kind="random"),
    ]
    mistakes = [
        Diagnosis("these are logits; apply log_softmax over the next token (the last axis)", lambda e, c: _product(c)),
        Diagnosis(
            "these are probabilities; the table holds log-probabilities (log_softmax)",
            lambda e, c: _product(c).softmax(-1),
        ),
        Diagnosis(
            "normalised over the current token (axis 0); each row a must be a distribution over next tokens b",
            lambda e, c: _product(c).log_softmax(0),
        ),
    ]
    return run_check(bigram_table, cases, lambda m: bigram_log_probs(m, direct_path=True), mistakes, atol=1e-4,
                     n_generated=_draws.MODEL_CASES, generate=lambda draw: (_draws.model(draw, (0, 2), edge=draw.edge(4)),),
                     withheld=[bigram_log_probs])


# ---- Exercise 2.2 --------------------------------------------------------------------------------
def _pairs(tokens, d_vocab, gap=1, drop_last=False):
    a, b = tokens[:-gap], tokens[gap:]
    if drop_last:
        a, b = a[:-1], b[:-1]
    return torch.bincount(a * d_vocab + b, minlength=d_vocab * d_vocab).view(d_vocab, d_vocab)


def _wrapped(tokens, d_vocab):
    """The counts with the pair (last token, first token) added: ``tokens.roll(-1)`` as the next token."""
    if len(tokens) < 2:
        return None
    return _pairs(torch.cat([tokens, tokens[:1]]), d_vocab)


@guarded
def check_bigram_counts(bigram_counts) -> bool:
    """``bigram_counts(tokens, d_vocab)`` -> integer counts ``C[a, b]`` (``b`` right after ``a``)."""
    val = load_validation_tokens()[:20_000]
    cases = [
        Case("20,000 validation tokens", (val, 2048)),
        Case("random tokens", (random_tokens(40, (600,), seed=2), 40), kind="random"),
        Case("the stream 3 1 3 1 2", (torch.tensor([3, 1, 3, 1, 2]), 4), kind="hand-built"),
    ]
    mistakes = [
        Diagnosis("counted pairs two tokens apart; a bigram is two neighbours", lambda e, c: _pairs(*c.args, gap=2)),
        Diagnosis("the last pair is missing", lambda e, c: _pairs(*c.args, drop_last=True)),
        Diagnosis("each pair is counted at most once: `C[a, b] += 1` with index tensors writes a repeated pair "
                  "once, it does not add; use torch.bincount of a * d_vocab + b (or index_put_ with accumulate=True)",
                  lambda e, c: e.clamp(max=1)),
        Diagnosis("one pair too many: the last token is paired with the first (torch.roll wraps around); "
                  "pair tokens[:-1] with tokens[1:]", lambda e, c: _wrapped(*c.args)),
    ]
    loop = Method(
        "a Python loop over the tokens (more than 2,000 torch calls for 20,000 tokens); count all pairs "
        "at once: torch.bincount of a * d_vocab + b",
        max_calls=2_000,
    )
    return run_check(
        bigram_counts, cases, count_bigrams, mistakes, method=loop,
        slow_hint="count all pairs at once: torch.bincount of a * d_vocab + b", generate=_stream,
        withheld=[count_bigrams],
    )


_EDGE_STREAMS = (([5], 6), ([2, 2, 2, 2], 3), ([0, 3], 4), ([0, 0, 0], 1), ([1, 0, 1, 0, 1], 2), ([4, 1, 2, 4], 7))


def _stream(draw: Draw):
    """A 1-D stream and d_vocab; edges: one token (no pair), one token repeated, a single pair
    with the last id, a vocabulary of one, two tokens alternating, ids never seen at the end."""
    edge = draw.edge(len(_EDGE_STREAMS))
    if edge is not None:
        stream, d_vocab = _EDGE_STREAMS[edge]
        return torch.tensor(stream), d_vocab
    d_vocab = draw.int(1, 10)
    return torch.randint(0, d_vocab, (draw.int(1, 40),), generator=draw.gen), d_vocab


# ---- Exercises 2.3 and 2.4 -----------------------------------------------------------------------
def _comparison_cases() -> list[Case]:
    val = load_validation_tokens()
    rnd = random_model(n_layers=0, seed=3, d_vocab=30)
    counts = count_bigrams(random_tokens(30, (400,), seed=4), 30)
    three = torch.tensor([[3, 1, 0], [0, 0, 0], [2, 0, 2]])  # token 1 is never followed by anything
    three_lp = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]]).log()
    return [
        Case("attn-only-0l vs the validation split", (bigram_log_probs(shipped("attn-only-0l").model), count_bigrams(val, 2048))),
        Case("a random model vs random tokens", (bigram_log_probs(rnd), counts), kind="random"),
        Case("a 3-token table", (three_lp, three), kind="hand-built"),
    ]


def _seen(counts):
    return counts.sum(-1) > 0


@guarded
def check_bigram_kl(bigram_kl) -> bool:
    """``bigram_kl(log_probs, counts)`` -> the frequency-weighted mean over current tokens ``a`` of
    ``KL(p_counts(. | a) || p_table(. | a))``, in nats (a float)."""
    mistakes = [
        Diagnosis(
            "an unweighted mean over current tokens; weight each token's KL by how often it occurs (C[a])",
            lambda e, c: float(next_token_kl(*c.args)[_seen(c.args[1])].mean()),
        ),
        Diagnosis(
            "the mean over all d_vocab rows, unseen tokens included; weight by C[a] / sum(C)",
            lambda e, c: float(next_token_kl(*c.args).mean()),
        ),
        Diagnosis(
            "this is the cross-entropy (the table's loss); subtract the entropy of the counts to get the KL",
            lambda e, c: cross_entropy(*c.args),
        ),
        Diagnosis("summed over current tokens; take their weighted mean", lambda e, c: float(next_token_kl(*c.args).sum())),
    ]
    return run_check(
        bigram_kl, _comparison_cases(), lambda lp, c: cross_entropy(lp, c) - conditional_entropy(c), mistakes, atol=1e-5, rtol=1e-4,
        returns=float, generate=_tables, withheld=[compare_bigram_tables],
    )


def _tables(draw: Draw):
    """A table of log-probabilities and a count table, ``[d_vocab, d_vocab]`` each; edges: one
    token, a row seen once, counts exactly the table's (a KL of 0), a probability of e^-20 that
    was counted, every row but one unseen, the last row and column the only counts."""
    edge = draw.edge(6)
    d = (1, 3, 2, 4, 5, 4)[edge] if edge is not None else draw.int(1, 8)
    logits = draw.randn(d, d, scale=2.0)
    counts = torch.randint(0, 4, (d, d), generator=draw.gen)
    note = ""
    if edge == 1:
        counts[0] = torch.tensor([0, 1, 0])
        note = "token 0 is followed once"
    elif edge == 2:
        counts, logits = torch.tensor([[1, 3], [2, 2]]), torch.tensor([[1, 3], [2, 2]]).float().log()
        note = "the counts are the table's own probabilities"
    elif edge == 3:
        logits[0, 0], counts[0, 0] = -20.0, 1
        note = "p(0 | 0) is about e^-20 and was counted"
    elif edge == 4:
        counts[1:] = 0
        note = "only token 0 is ever followed"
    elif edge == 5:
        counts.zero_()
        counts[-1, -1] = 5
    if int(counts.sum()) == 0:
        counts[draw.rng.randrange(d), draw.rng.randrange(d)] = 1
    return Case(note, (logits.log_softmax(-1), counts))


def _pearson_variant(log_probs, counts, weighted=True, log=True):
    a, b = counts.nonzero(as_tuple=True)
    n = counts[a, b].double()
    x = log_probs[a, b].double()
    y = (n / counts.sum(-1)[a].double()).log()
    if not log:
        x, y = x.exp(), y.exp()
    return weighted_pearson(x, y, n if weighted else torch.ones_like(n))


@guarded
def check_bigram_correlation(bigram_correlation) -> bool:
    """``bigram_correlation(log_probs, counts)`` -> the Pearson correlation of ``log p(b | a)`` from
    the table and from the counts, over the observed bigrams, each weighted by its count."""
    mistakes = [
        Diagnosis(
            "every observed bigram counts once; weight each by its count C[a, b]",
            lambda e, c: _pearson_variant(*c.args, weighted=False),
        ),
        Diagnosis(
            "correlated probabilities; the chapter compares log-probabilities",
            lambda e, c: _pearson_variant(*c.args, log=False),
        ),
    ]
    return run_check(
        bigram_correlation,
        _comparison_cases(),
        _pearson_variant,
        mistakes,
        atol=1e-5,
        rtol=1e-4,
        returns=float,
        generate=_correlated_tables,
        withheld=[compare_bigram_tables],
    )


def _correlated_tables(draw: Draw):
    """A log-probability table and counts with at least two observed bigrams whose log-probabilities
    differ on both sides (else no correlation is defined); edges: two bigrams in one row, one
    bigram counted 1000 times among ones, a vocabulary of 2, counts in the last row only."""
    edge = draw.edge(4)
    if edge == 0:
        return torch.tensor([[0.2, 0.8, 0.0], [0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]).log(), torch.tensor(
            [[1, 3, 0], [0, 0, 0], [0, 0, 0]])
    d = (5, 2, 4)[edge - 1] if edge is not None else draw.int(2, 8)
    while True:
        logits, counts = draw.randn(d, d, scale=2.0), torch.randint(0, 5, (d, d), generator=draw.gen)
        if edge == 1:
            counts = counts.clamp(max=1)
            counts[0, 0] = 1000
        elif edge == 3:
            counts[:-1] = 0
        lp = logits.log_softmax(-1)
        a, b = counts.nonzero(as_tuple=True)
        y = (counts[a, b].double() / counts.sum(-1)[a].double()).log()
        if len(a) >= 2 and float(lp[a, b].std()) > 1e-3 and float(y.std()) > 1e-3:
            return lp, counts
