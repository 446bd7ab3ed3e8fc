"""Exercise 5.3's check, the random baseline: the learner's scores are random, so they are read by
their mean and spread against many samples of the reference's distribution, beside those of the
usual wrong draws, and each case is called twice to see that the seed reproduces them. One matrix
as writer and reader gives the reference's very distribution: that mistake is told by the number
of Gaussian numbers the function draws."""

from __future__ import annotations

import contextlib
import functools
import math

import torch
from torch import Tensor

from attncircuits.analysis.circuits.composition import random_composition_scores
from attncircuits.course.exercises._core import Draw

N_TARGET = 20_000  # samples of the reference's distribution each learner's sample is read against


@functools.lru_cache(maxsize=None)
def variant_scores(d_model: int, d_head: int, n: int, how: str, seed: int = 99) -> Tensor:
    """Scores of ``n`` random pairs drawn one usual wrong way: ``full`` (full-rank matrices),
    ``same`` (one matrix as writer and reader), ``uniform`` (torch.rand factors), ``symmetric``
    (``U @ U.T``: one factor used twice), ``rank-one`` (factors of one column and one row) or
    ``inner`` (the factors in the other order, ``[d_head, d_model] @ [d_model, d_head]``)."""
    g = torch.Generator().manual_seed(seed)
    draw = (lambda *sh: torch.rand(*sh, generator=g)) if how == "uniform" else (lambda *sh: torch.randn(*sh, generator=g))

    def mat():
        if how == "full":
            return draw(n, d_model, d_model)
        if how == "symmetric":
            u = draw(n, d_model, d_head)
            return u @ u.mT
        if how == "rank-one":
            return draw(n, d_model, 1) @ draw(n, 1, d_model)
        if how == "inner":
            return draw(n, d_head, d_model) @ draw(n, d_model, d_head)
        return draw(n, d_model, d_head) @ draw(n, d_head, d_model)

    first = mat()
    second = first if how == "same" else mat()
    norm = torch.linalg.matrix_norm
    return (norm(first @ second) / (norm(first) * norm(second))).double()


MISTAKES = {
    "full": "your matrices are full rank: each must be a rank-d_head product, [d_model, d_head] @ [d_head, d_model]",
    "same": "the writer and the reader are the same matrix: draw two independent matrices for every sample",
    "uniform": "your factors come from torch.rand (uniform in [0, 1), all positive): draw centred Gaussian "
               "entries with torch.randn",
    "symmetric": "your matrices are symmetric, one factor times its own transpose (U @ U.T): draw the two "
                 "factors of each matrix independently",
    "rank-one": "your matrices have rank one (a column times a row): each factor has d_head columns or rows, "
                "[d_model, d_head] @ [d_head, d_model]",
    "inner": "your factors are multiplied in the other order, [d_head, d_model] @ [d_model, d_head], a "
             "d_head x d_head matrix: a head's matrix is [d_model, d_head] @ [d_head, d_model]",
}


def agree(mean, std, ref: Tensor, n: int) -> bool:
    """Whether ``n`` samples with this mean and standard deviation could come from ``ref``'s
    distribution: each within 5 standard errors of the two samples' difference (that of the
    spread from the reference's fourth moment, as the scores are not Gaussian), plus 0.5%."""
    ref = ref.double()
    m, N = len(ref), float(ref.mean())
    var = float(ref.var())
    fourth = float(((ref - N) ** 4).mean())
    se_mean = math.sqrt(var / n + var / m)
    se_std = math.sqrt(max(fourth - var**2, 1e-30) * (1 / n + 1 / m)) / (2 * math.sqrt(var))
    return (abs(mean - N) <= 5 * se_mean + 0.005 * N
            and abs(std - math.sqrt(var)) <= 5 * se_std + 0.005 * math.sqrt(var))


SEEDED: dict[tuple, list[Tensor]] = {}  # (d_model, d_head, n, seed) -> the learner's scores, per call
DRAWN: dict[tuple, int] = {}  # (d_model, d_head, n, seed) -> Gaussian numbers torch drew in the first call

#: torch's Gaussian draws, counted while the learner's function runs
_GAUSSIAN = ((torch, "randn"), (torch, "randn_like"), (torch, "normal"), (torch.Tensor, "normal_"))


@contextlib.contextmanager
def _counting_draws():
    """How many Gaussian numbers torch draws inside the block (``count[0]``): one matrix used as
    writer and reader gives the very same distribution of scores as two (their mean and spread
    agree to 1% for d_model 2-64), so only the number of draws tells that mistake."""
    count, saved = [0], [(owner, name, getattr(owner, name)) for owner, name in _GAUSSIAN]

    def counted(original):
        @functools.wraps(original)
        def draw(*args, **kwargs):
            out = original(*args, **kwargs)
            count[0] += out.numel() if isinstance(out, Tensor) else 0
            return out
        return draw

    for owner, name, original in saved:
        setattr(owner, name, counted(original))
    try:
        yield count
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def called_twice(fn):
    """The learner's function, called twice on every case: a seed is there to reproduce the
    samples, so both calls must agree; each call's scores are kept for :func:`compare_baseline`,
    and the number of Gaussian numbers the first call drew from torch."""

    @functools.wraps(fn)
    def twice(d_model, d_head, n_samples, *seed):
        key = (d_model, d_head, n_samples, *(seed or (0,)))
        with _counting_draws() as count:
            runs = [fn(d_model, d_head, n_samples, *seed)]
        DRAWN[key] = count[0]
        runs.append(fn(d_model, d_head, n_samples, *seed))
        SEEDED[key] = runs
        return runs[0]

    return twice


def one_matrix(case) -> str | None:
    """The message when the learner's function drew from torch exactly half the Gaussian numbers
    that ``n`` pairs of two rank-``d_head`` matrices need (one matrix as writer and reader), else
    None (a function drawing elsewhere, with numpy, is not counted: None)."""
    d_model, d_head, n = case.args[:3]
    drawn, need = DRAWN.get((*case.args[:3], *(case.args[3:] or (0,)))), 4 * n * d_model * d_head
    if drawn != need // 2:
        return None
    return (f"your function drew {drawn:,} Gaussian numbers for {n:,} samples, half of the {need:,} that two "
            f"matrices of two factors each need: {MISTAKES['same']}")


def seed_problem(got: Tensor, case) -> str | None:
    """What is wrong with the seed, if the learner's two calls say so: other scores for the same
    seed (the global generator), or the same scores for another seed (the seed ignored)."""
    key = (*case.args[:3], *(case.args[3:] or (0,)))
    again = SEEDED.get(key, (got, got))[1]
    if isinstance(again, Tensor) and (again.shape != got.shape or not torch.equal(again.detach().double(), got)):
        return ("a second call with the same seed gave other scores: draw from "
                "torch.Generator().manual_seed(seed), not from torch's global generator")
    for (*sizes, seed), (other, _) in SEEDED.items():
        if tuple(sizes) == key[:3] and seed != key[3] and isinstance(other, Tensor) and other.shape == got.shape \
                and torch.equal(other.detach().double(), got):
            return f"seeds {seed} and {key[3]} gave the very same scores: draw with the seed you are given"
    return None


def compare_baseline(got, expected, case) -> str | None:
    if not isinstance(got, Tensor):
        return f"return a tensor of the scores, got a {type(got).__name__}"
    d_model, d_head, n = case.args[:3]
    if tuple(got.shape) != (n,):
        return f"return one score per sample, shape [{n}]; got {list(got.shape)}"
    got = got.detach().double()
    if not torch.isfinite(got).all():
        bad = int((~torch.isfinite(got)).sum())
        return f"{bad} of your {n} scores are NaN or infinite (a division by a zero norm?)"
    mean, std = float(got.mean()), float(got.std())
    if std < 1e-6:
        return "all your samples have the same score: draw new random matrices for every sample"
    if agree(mean, std, expected.double(), n):
        return one_matrix(case) or seed_problem(got, case)
    for how, message in MISTAKES.items():  # said only when the scores look like that mistake's
        if agree(mean, std, variant_scores(d_model, d_head, N_TARGET, how), n):
            return message
    if mean > 1 + 1e-4:
        return f"scores above 1 (mean {mean:.3g}): divide by the two Frobenius norms"
    ref_mean, ref_std = float(expected.mean()), float(expected.std())
    return (f"your scores' mean is {mean:.4f} and spread (std) {std:.4f}; the baseline's are {ref_mean:.4f} and "
            f"{ref_std:.4f}: check each step against the text (each matrix [d_model, d_head] @ [d_head, d_model] "
            "of Gaussian factors, two independent matrices, the Frobenius norm of their product over the "
            "product of their Frobenius norms)")



@functools.lru_cache(maxsize=None)
def target(d_model: int, d_head: int) -> Tensor:
    return random_composition_scores(d_model, d_head, N_TARGET, seed=99)


def baseline_sizes(draw: Draw):
    """(d_model, d_head, n_samples, seed) at the edges: d_head 1, d_head = d_model (full rank), the
    seed 0 left to its default."""
    edge = draw.edge(3)
    d_model, d_head, n = ((16, 1, 1000), (8, 8, 1000), (24, 6, 1000))[edge] if edge is not None else (
        16, draw.int(1, 16), 1000)
    return (d_model, d_head, n) if edge == 2 else (d_model, d_head, n, draw.int(0, 100))
