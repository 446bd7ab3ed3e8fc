"""The zero-layer bigram table: read from the weights, and counted from the corpus (chapter 2).

A transformer with no layers maps the current token ``a`` straight to logits,
``logits = W_E[a] @ W_U``, so everything it can know is a table ``T = W_E @ W_U``
``[d_vocab, d_vocab]`` whose row ``a`` holds the logits of every next token ``b``: a bigram model
(the paper's ``W_U W_E``, in column-vector notation). The best such model on a corpus predicts
``p(b | a) = count(a, b) / count(a)``; this module builds both tables and measures how close they
are. In models with layers the same product is only the *direct path* (embedding straight to
unembedding), the term of the path expansion that skips every head.

Tables are ``[current_token, next_token]``: rows are what the model has just read, columns what it
predicts. Counts are dense ``d_vocab x d_vocab`` int64 tensors (4 M entries for the shipped
vocabulary), built with one ``bincount`` over ``prev * d_vocab + next``, never a Python loop.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.core import validate
from attncircuits.models.transformer import Transformer

__all__ = [
    "BigramComparison",
    "DirectPathWarning",
    "bigram_count_table",
    "bigram_log_probs",
    "bigram_logits",
    "compare_bigram_tables",
    "conditional_entropy",
    "count_bigrams",
    "cross_entropy",
    "fit_smoothing",
    "next_token_kl",
    "resolve_token",
    "self_prediction",
    "smoothed_log_probs",
    "top_next_tokens",
    "topk_agreement",
    "weighted_pearson",
    "weighted_spearman",
]


class DirectPathWarning(UserWarning):
    """``W_E @ W_U`` was taken from a model with layers, where it is only the direct path."""


def _warn_if_layers(model: Transformer, direct_path: bool) -> None:
    if model.cfg.n_layers and not direct_path:
        warnings.warn(
            f"this model has {model.cfg.n_layers} layer(s): W_E @ W_U is only its direct path, not its "
            "full next-token prediction (the heads add to it). Pass direct_path=True if the direct path "
            "is what you mean.",
            DirectPathWarning,
            stacklevel=3,  # the caller of bigram_logits / bigram_log_probs
        )


# ---- the table in the weights ------------------------------------------------------------------
def bigram_logits(model: Transformer, direct_path: bool = False) -> Float[Tensor, "d_vocab d_vocab"]:
    """The bigram logit table ``T = W_E @ W_U``: ``T[a, b]`` is the logit of ``b`` after ``a``.

    For a zero-layer model this *is* the model: ``model(tokens)[..., i, :] == T[tokens[i]]``.
    For a model with layers it is only the direct path, the one term of the logits that no head
    touches; the heads add their own terms on top. Passing such a model without
    ``direct_path=True`` still returns ``W_E @ W_U`` but emits a :class:`DirectPathWarning`, because
    reading it as "the model's bigram predictions" would be wrong; ``direct_path=True`` says that
    the direct path is what is meant and silences it.
    """
    _warn_if_layers(model, direct_path)
    with torch.no_grad():
        return (model.W_E @ model.W_U).detach()


def bigram_log_probs(model: Transformer, direct_path: bool = False) -> Float[Tensor, "d_vocab d_vocab"]:
    """``log softmax(W_E @ W_U)`` over next tokens: the model's ``log p(b | a)`` (see :func:`bigram_logits`)."""
    _warn_if_layers(model, direct_path)
    return bigram_logits(model, direct_path=True).log_softmax(dim=-1)


def _observed(counts: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The observed pairs of a count table: rows ``a``, columns ``b``, counts ``C[a,b]`` and row totals ``C[a]``."""
    a, b = counts.nonzero(as_tuple=True)
    n = counts[a, b].double()
    row = counts.sum(-1).double()
    return a, b, n, row


# ---- the table in the corpus -------------------------------------------------------------------
def count_bigrams(tokens: Int[Tensor, " pos"], d_vocab: int) -> Int[Tensor, "d_vocab d_vocab"]:
    """``C[a, b]`` = how often token ``b`` follows token ``a`` in a 1-D token stream.

    Every adjacent pair counts, including those across an ``<|endoftext|>`` separator: the model
    sees those pairs too. One ``bincount`` over the flat index ``a * d_vocab + b``.
    """
    d_vocab = validate.count(d_vocab, "d_vocab")
    tokens = validate.token_ids(tokens, d_vocab, "tokens", ndim=1)
    flat = tokens[:-1] * d_vocab + tokens[1:]
    return torch.bincount(flat, minlength=d_vocab * d_vocab).view(d_vocab, d_vocab)


def bigram_count_table(
    prev: Int[Tensor, " n"], nxt: Int[Tensor, " n"], count: Int[Tensor, " n"], d_vocab: int
) -> Int[Tensor, "d_vocab d_vocab"]:
    """A dense count table from sparse ``(prev, next, count)`` triples (e.g. ``load_train_bigram_counts()``).

    Repeated pairs are summed. One ``index_add_`` into the flat table.
    """
    d_vocab = validate.count(d_vocab, "d_vocab")
    prev, nxt = validate.token_ids(prev, d_vocab, "prev"), validate.token_ids(nxt, d_vocab, "nxt")
    count = validate.int_tensor(count, "count", "bigram counts")
    if not prev.shape == nxt.shape == count.shape or prev.ndim != 1:
        raise ValueError(
            f"prev, nxt and count must be 1-D and of equal length, got {tuple(prev.shape)}, "
            f"{tuple(nxt.shape)}, {tuple(count.shape)}"
        )
    if count.numel() and count.min() < 0:
        raise ValueError("bigram counts must be non-negative")
    flat = torch.zeros(d_vocab * d_vocab, dtype=torch.long)
    return flat.index_add_(0, prev * d_vocab + nxt, count).view(d_vocab, d_vocab)


def smoothed_log_probs(counts: Int[Tensor, "d_vocab d_vocab"], alpha: float) -> Float[Tensor, "d_vocab d_vocab"]:
    """Add-``alpha`` (Lidstone) smoothing: ``p(b | a) = (C[a, b] + alpha) / (C[a] + alpha * d_vocab)``.

    Every bigram gets ``alpha`` pseudo-counts, so unseen pairs keep a small probability and a
    token never seen at all predicts the uniform distribution. ``alpha = 0`` is the maximum-likelihood
    table (``-inf`` for unseen pairs; rows of unseen tokens are uniform). :func:`fit_smoothing`
    chooses ``alpha`` from the counts alone.
    """
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    V = counts.shape[-1]
    row = counts.sum(-1, keepdim=True).double()
    if alpha == 0:
        logp = counts.float().log() - row.clamp(min=1).log().float()
        return torch.where(row > 0, logp, torch.full_like(logp, -math.log(V)))
    return (counts.float() + alpha).log() - (row + alpha * V).log().float()


def fit_smoothing(counts: Int[Tensor, "d_vocab d_vocab"], alphas: Sequence[float] | None = None) -> float:
    """The ``alpha`` of :func:`smoothed_log_probs` that best predicts each bigram from all the *others*.

    Leave-one-out: removing one occurrence of ``(a, b)`` leaves ``C[a, b] - 1`` of it among
    ``C[a] - 1``, so the held-out log-likelihood is, in closed form,
    ``Σ_{a,b} C[a,b] log((C[a,b] - 1 + alpha) / (C[a] - 1 + alpha V))``. It uses the counts only, so
    the smoothing is fixed before any validation text is looked at. Grid search over ``alphas``
    (default: 40 values log-spaced from 1e-4 to 10).
    """
    alphas = list(alphas) if alphas is not None else torch.logspace(-4, 1, 40).tolist()
    V = counts.shape[-1]
    a, _, n, rows = _observed(counts)
    keep = rows[a] > 1  # a token seen once has nothing left to predict from
    if not keep.any():
        raise ValueError("fit_smoothing needs at least one token seen twice or more")
    # Σ n log(n - 1 + α) only depends on the distinct values of n, and Σ_b n = C[a] per row
    values, mult = n[keep].unique(return_counts=True)
    row = rows[rows > 1]
    al = torch.tensor(alphas, dtype=torch.float64)[:, None]
    loo = (mult * values * (values - 1 + al).log()).sum(-1) - (row * (row - 1 + al * V).log()).sum(-1)
    return alphas[int(loo.argmax())]


def conditional_entropy(counts: Int[Tensor, "d_vocab d_vocab"]) -> float:
    """``H(next | current)`` of the counts, in nats: the lowest loss any bigram model gets on them.

    ``-Σ_{a,b} C[a,b] log(C[a,b] / C[a]) / Σ C``; a zero-layer model can do no better on the same
    text, since its prediction depends on the current token only.
    """
    a, _, n, row = _observed(counts)
    if not len(n):
        raise ValueError("the count table is empty")
    return float(-(n * (n / row[a]).log()).sum() / n.sum())


def cross_entropy(log_probs: Float[Tensor, "d_vocab d_vocab"], counts: Int[Tensor, "d_vocab d_vocab"]) -> float:
    """The loss, in nats, of a bigram table on counted text: ``-Σ C[a,b] log p(b|a) / Σ C``.

    For a zero-layer model this is exactly its mean next-token loss on the text the counts came
    from (its prediction depends on the current token only), without running it.
    """
    a, b, n, _ = _observed(counts)
    if not len(n):
        raise ValueError("the count table is empty")
    return float(-(n * log_probs.detach()[a, b].double()).sum() / n.sum())


# ---- comparing two tables ----------------------------------------------------------------------
def weighted_pearson(x: Float[Tensor, " n"], y: Float[Tensor, " n"], w: Float[Tensor, " n"]) -> float:
    """Pearson correlation with each pair ``(x_i, y_i)`` counted ``w_i`` times."""
    x, y, w = (torch.as_tensor(v).detach().double() for v in (x, y, w))
    w = w / w.sum()
    dx, dy = x - (w * x).sum(), y - (w * y).sum()
    return float((w * dx * dy).sum() / ((w * dx**2).sum() * (w * dy**2).sum()).sqrt())


def _weighted_midranks(x: Tensor, w: Tensor) -> Tensor:
    """Ranks of ``x`` in the sample where value ``x_i`` occurs ``w_i`` times; tied values share their mid-rank."""
    order = x.argsort()
    xs, ws = x[order], w[order]
    _, inverse, _ = torch.unique_consecutive(xs, return_inverse=True, return_counts=True)
    group_w = torch.zeros(int(inverse.max()) + 1, dtype=ws.dtype).index_add_(0, inverse, ws)
    before = group_w.cumsum(0) - group_w  # weight of all smaller values
    ranks = torch.empty_like(ws)
    ranks[order] = (before + (group_w + 1) / 2)[inverse]
    return ranks


def weighted_spearman(x: Float[Tensor, " n"], y: Float[Tensor, " n"], w: Float[Tensor, " n"]) -> float:
    """Spearman rank correlation with each pair counted ``w_i`` times (ties get mid-ranks).

    Equal to Spearman's rho on the sample with every pair repeated ``w_i`` times, computed without
    materialising it: the weighted Pearson correlation of weighted mid-ranks.
    """
    x, y, w = (torch.as_tensor(v).detach().double() for v in (x, y, w))
    return weighted_pearson(_weighted_midranks(x, w), _weighted_midranks(y, w), w)


def next_token_kl(
    log_probs: Float[Tensor, "d_vocab d_vocab"], counts: Int[Tensor, "d_vocab d_vocab"]
) -> Float[Tensor, " d_vocab"]:
    """Per current token ``a``: ``KL(p_counts(. | a) || p_table(. | a))`` in nats (0 for unseen ``a``).

    ``p_counts`` is the maximum-likelihood table ``C[a, b] / C[a]``. Averaged over ``a`` with weights
    ``C[a]`` it equals ``cross_entropy(log_probs, counts) - conditional_entropy(counts)``: the
    distance of a bigram model from the best one on the same text.
    """
    a, b, n, row = _observed(counts)
    p = n / row[a]
    terms = p * (p.log() - log_probs.detach()[a, b].double())
    return torch.zeros(counts.shape[0], dtype=torch.float64).index_add_(0, a, terms)


def topk_agreement(
    table: Float[Tensor, "d_vocab d_vocab"], counts: Int[Tensor, "d_vocab d_vocab"], k: int = 1
) -> Float[Tensor, " d_vocab"]:
    """Per current token: the fraction of the table's top-``k`` next tokens that are also the counts' top ``k``.

    ``|topk(table[a]) ∩ topk(C[a])| / k``; for ``k = 1``, 1.0 where both argmaxes agree. Ties in the
    counts are broken by token id (lower first) so the result is deterministic.
    """
    return _agreement(*_top_ids(table, counts, k), k)


def _top_ids(table: Tensor, counts: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The top-``k`` next tokens per row of a table and of the counts (best first)."""
    V = counts.shape[-1]
    k = validate.count(k, "k", 1, V, why="the table's d_vocab")
    # an exact integer key: a higher count always wins, and among equal counts the lower id
    key = counts.long() * (V + 1) + (V - torch.arange(V))
    return table.detach().topk(k, dim=-1).indices, key.topk(k, dim=-1).indices


def _agreement(top_t: Tensor, top_c: Tensor, k: int) -> Tensor:
    hit = (top_t[:, :k, None] == top_c[:, None, :k]).any(-1)
    return hit.double().sum(-1) / k


@dataclass(frozen=True)
class BigramComparison:
    """How close a bigram table is to the counted one (all weighted by how often the bigram occurs).

    ``pearson`` / ``spearman``: correlation of ``log p(b|a)`` from the table and from the counts over
    the observed bigrams, each weighted by its count. ``kl``: ``KL(counts || table)`` of the next-token
    distributions, averaged over current tokens by frequency (nats). ``top1`` / ``top5``: top-k
    agreement averaged over current tokens by frequency. ``loss`` and ``floor``: the table's loss on
    the counted text and the best any bigram model gets (``loss - floor == kl``).
    """

    pearson: float
    spearman: float
    kl: float
    top1: float
    top5: float
    loss: float
    floor: float
    n_bigrams: int  # distinct observed pairs
    n_tokens: int  # distinct current tokens observed

    def __str__(self) -> str:
        return (
            f"Pearson {self.pearson:.3f}, Spearman {self.spearman:.3f}, KL {self.kl:.3f} nats, "
            f"top-1 {self.top1:.1%}, top-5 {self.top5:.1%} (loss {self.loss:.3f} vs floor {self.floor:.3f} nats)"
        )


def compare_bigram_tables(
    log_probs: Float[Tensor, "d_vocab d_vocab"], counts: Int[Tensor, "d_vocab d_vocab"]
) -> BigramComparison:
    """All the measures of :class:`BigramComparison` for a table of ``log p(b|a)`` against counts."""
    if log_probs.shape != counts.shape or log_probs.ndim != 2:
        raise ValueError(
            f"tables must be [d_vocab, d_vocab] of the same shape, got {tuple(log_probs.shape)} and {tuple(counts.shape)}"
        )
    a, b, n, row = _observed(counts)
    if not len(n):
        raise ValueError("the count table is empty")
    w_tok = row / row.sum()
    x, y = log_probs.detach()[a, b].double(), (n / row[a]).log()
    top_t, top_c = _top_ids(log_probs, counts, 5)  # sorted, so their first columns are the top 1
    loss, floor = float(-(n * x).sum() / n.sum()), float(-(n * y).sum() / n.sum())
    return BigramComparison(
        pearson=weighted_pearson(x, y, n),
        spearman=weighted_spearman(x, y, n),
        kl=loss - floor,  # == Σ_a w_a KL_a, see next_token_kl
        top1=float((_agreement(top_t, top_c, 1) * w_tok).sum()),
        top5=float((_agreement(top_t, top_c, 5) * w_tok).sum()),
        loss=loss,
        floor=floor,
        n_bigrams=len(n),
        n_tokens=int((row > 0).sum()),
    )


def self_prediction(table: Float[Tensor, "d_vocab d_vocab"]) -> Int[Tensor, " d_vocab"]:
    """Per token ``a``: 1 where ``a`` is its own top prediction (``argmax_b T[a, b] == a``), else 0.

    If ``W_U`` were the inverse of ``W_E``, ``W_E @ W_U`` would be the identity and every token would
    predict itself; a bigram table predicts what *follows*, which is rarely the same token.
    """
    V = table.shape[-1]
    return (table.detach().argmax(-1) == torch.arange(V)).long()


# ---- tokens ------------------------------------------------------------------------------------
def resolve_token(tokenizer, token: int | str, d_vocab: int) -> int:
    """A token id from an id or a string that is exactly one token (``·``/``⏎``/``⇥`` stand for whitespace).

    Raises ``ValueError`` naming the pieces when the string splits into several tokens, and when
    an id is outside ``[0, d_vocab)``.
    """
    return validate.token(tokenizer, token, d_vocab)


def top_next_tokens(
    log_probs: Float[Tensor, "d_vocab d_vocab"], token: int, k: int = 5
) -> tuple[Int[Tensor, " k"], Float[Tensor, " k"]]:
    """The ``k`` most likely next tokens after ``token`` and their probabilities, best first."""
    V = log_probs.shape[0]
    token = validate.token_id(token, V)
    k = validate.count(k, "k", 1, V, why="the table's d_vocab")
    lp, ids = log_probs.detach()[token].topk(k)
    return ids, lp.exp()
