"""Skip-trigrams, copying heads and the skip-trigram bug, read from the weights (chapter 4).

A one-layer head implements skip-trigrams ``[source] … [destination] → [output]``: the QK circuit
decides how much the destination token attends to the source token, the OV circuit how much
attending to the source raises each output logit. The head's effect on an output factors as

    f(source, destination, output) ≈ attention(destination → source) · OV[source, output]

and everything here uses that factorisation, so no table of ``d_vocab³`` triples is ever built.

Scores. Softmaxes ignore shifts, so both circuits are centered first: QK per destination row
(``QK[d, s] − mean_s' QK[d, s']``) and OV per source row (``OV[s, o] − mean_o' OV[s, o']``). A triple's
score is the rise of the output's logit that the head predicts when the source sits among
``n_keys − 1`` average keys before the destination::

    attn(d, s) = exp(QKc[d, s]) / (exp(QKc[d, s]) + n_keys − 1)
    score(s, d, o) = attn(d, s) · OVc[s, o]

For a fixed source the score is largest for the source's top destinations and top outputs, so the
global top ``k`` triples lie among ``k`` destinations x ``k`` outputs per source: two top-``k`` passes
over the factored circuits (a block of rows at a time) find them exactly.

Copying heads, read from the OV circuit's eigenvalues, are in :mod:`.copying`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.analysis.circuits.factored import ov_factors, qk_factors
from attncircuits.core import validate
from attncircuits.core.heads import head_name
from attncircuits.data import token_str
from attncircuits.models.transformer import Transformer

__all__ = [
    "SkipTrigramBug",
    "SkipTrigramRow",
    "SkipTrigrams",
    "find_skip_trigram_bugs",
    "resolve_tokens",
    "skip_trigram_effects",
    "top_skip_trigrams",
]


def resolve_tokens(tokenizer, tokens, d_vocab: int) -> Int[Tensor, " n"]:
    """Token ids from ids or one-token strings (``·``/``⏎``/``⇥`` stand for whitespace).

    Raises one ``ValueError`` that lists every unknown entry and how it splits, so a whole subset
    can be fixed at once.
    """
    return validate.token_list(tokenizer, tokens, d_vocab)


def _subset(model, tokens) -> Tensor | None:
    """A vocabulary subset (ids), checked; None: the whole vocabulary."""
    return None if tokens is None else validate.token_ids(tokens, model.cfg.d_vocab, "tokens", ndim=1, allow_empty=False)


def _centered_circuits(model, layer: int, heads: list[int] | None, tokens: Tensor | None):
    """Centered QK and OV circuits of a checked layer, heads (None: all) and vocabulary subset."""
    qk = qk_factors(model, layer, slice(None), model.W_E, model.W_E).centered(-1)  # centered over all keys, then restricted
    ov = ov_factors(model, layer, slice(None)).centered(-1)
    if heads is not None:
        qk, ov = qk[heads], ov[heads]
    if tokens is not None:
        qk, ov = qk.restrict(tokens, tokens), ov.restrict(tokens, tokens)
    return qk, ov


# ------------------------------------------------------------------------------------------------
# Skip-trigram tables
# ------------------------------------------------------------------------------------------------
class SkipTrigramRow(NamedTuple):
    """One skip-trigram ``source … dest → out`` with readable tokens, as tables and figures show it."""

    source: str
    dest: str
    out: str
    attn: float  # attention the destination gives the source among n_keys keys
    ov: float  # centered OV logit effect
    score: float  # predicted rise of the output logit, attn · OV


@dataclass
class SkipTrigrams:
    """The top ``k`` skip-trigrams of each head, best first: all fields ``[n_heads, k]``."""

    layer: int
    heads: list[int]
    source: Int[Tensor, "head k"]
    dest: Int[Tensor, "head k"]
    out: Int[Tensor, "head k"]
    score: Float[Tensor, "head k"]  # predicted rise of the output logit, attn · OVc
    attn: Float[Tensor, "head k"]  # attention the destination gives the source among n_keys keys
    qk: Float[Tensor, "head k"]  # centered QK score
    ov: Float[Tensor, "head k"]  # centered OV logit effect

    def triples(self, head: int) -> Int[Tensor, "k 3"]:
        i = self._index(head)
        return torch.stack([self.source[i], self.dest[i], self.out[i]], -1)

    def _index(self, head: int) -> int:
        head = validate.index(head, "head")
        if head not in self.heads:
            raise IndexError(f"head {head} is not in this table; it has heads {self.heads}")
        return self.heads.index(head)

    def rows(self, tokenizer, head: int, n: int | None = None) -> list[SkipTrigramRow]:
        """The head's first ``n`` (default: all) skip-trigrams, best first, with readable tokens."""
        i = self._index(head)
        n = self.source.shape[1] if n is None else n
        return [
            SkipTrigramRow(
                source=token_str(tokenizer, int(self.source[i, j])),
                dest=token_str(tokenizer, int(self.dest[i, j])),
                out=token_str(tokenizer, int(self.out[i, j])),
                attn=float(self.attn[i, j]),
                ov=float(self.ov[i, j]),
                score=float(self.score[i, j]),
            )
            for j in range(n)
        ]

    def format(self, tokenizer, head: int, n: int | None = None) -> str:
        """A plain-text table: ``source … destination → output`` with its scores."""
        lines = [f"head {head_name(self.layer, head)}: source … destination → output   attn   OV    score"]
        for r in self.rows(tokenizer, head, n):
            lines.append(f"  {r.source!r:>14} … {r.dest!r:<12} → {r.out!r:<14} {r.attn:5.2f} {r.ov:5.2f} {r.score:6.2f}")
        return "\n".join(lines)


@torch.no_grad()
def top_skip_trigrams(
    model: Transformer,
    layer: int,
    k: int = 10,
    heads: list[int] | None = None,
    tokens: Int[Tensor, " n"] | None = None,
    n_keys: int | None = None,
) -> SkipTrigrams:
    """The ``k`` strongest skip-trigrams of each head, from the weights alone (see the module docstring).

    ``tokens`` restricts sources, destinations and outputs to a subset of the vocabulary (ids);
    ``n_keys`` is the size of the imagined context (default ``n_ctx // 2``, the average number of keys
    a query sees). Cost: two top-``k`` passes over each ``d_vocab x d_vocab`` circuit, a block of rows at
    a time, and ``d_vocab · k²`` candidates per head; no dense circuit is kept.
    """
    validate.depth(model, "skip-trigrams")
    layer, k = validate.layer(model, layer), validate.count(k, "k")
    heads = None if heads is None else validate.head_list(model, heads)
    tokens = _subset(model, tokens)
    n_keys = validate.count(max(2, model.cfg.n_ctx // 2) if n_keys is None else n_keys, "n_keys", 2)
    qk, ov = _centered_circuits(model, layer, heads, tokens)
    heads = list(range(model.cfg.n_heads)) if heads is None else heads
    V_src = qk.rdim
    k = min(k, V_src, ov.rdim)
    qk_v, dest = qk.topk_per_col(k)  # [H, k, V_src]: each source's best destinations
    ov_v, out = ov.topk_per_row(k)  # [H, V_src, k]: each source's best outputs
    attn = qk_v.exp() / (qk_v.exp() + n_keys - 1)
    cand = attn.transpose(-2, -1)[..., :, None] * ov_v[..., None, :]  # [H, V_src, k_dest, k_out]
    score, flat = cand.flatten(-3).topk(k, dim=-1)
    s, rem = flat // (k * k), flat % (k * k)
    i_d, i_o = rem // k, rem % k
    H = torch.arange(len(heads))[:, None]
    d = dest[H, i_d, s]
    o = out[H, s, i_o]
    qk_sel, ov_sel, attn_sel = qk_v[H, i_d, s], ov_v[H, s, i_o], attn[H, i_d, s]
    if tokens is not None:  # back to vocabulary ids
        s, d, o = tokens[s], tokens[d], tokens[o]
    return SkipTrigrams(layer, heads, s, d, o, score, attn_sel, qk_sel, ov_sel)


# ------------------------------------------------------------------------------------------------
# Checking triples against behaviour
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def skip_trigram_effects(
    model: Transformer,
    triples: Int[Tensor, "n 3"],
    contexts: Int[Tensor, "c pos"],
    seed: int = 0,
    gap: int | None = None,
) -> Float[Tensor, "n c"]:
    """How much putting the source before the destination raises the output's log-probability.

    For each ``(source, destination, output)`` and each context window of real text: the last token
    is set to the destination, one earlier position to the source, and the model's ``log p(output)``
    at the last position is compared with the same text where that position keeps its original
    token. The source goes ``gap`` positions before the destination, or, by default, at a random
    position (fixed by ``seed``): the weights-only score ignores positions, but a head that prefers
    recent tokens only finds a source that is near. Returns the rise in nats, ``[n_triples, n_contexts]``.
    """
    triples = validate.token_ids(triples, model.cfg.d_vocab, "triples")
    if triples.ndim != 2 or triples.shape[1] != 3:
        raise ValueError(f"triples must be [n, 3] (source, destination, output), got {tuple(triples.shape)}")
    why = "a skip-trigram (a source, a token between, the destination)"
    contexts = validate.tokens(model, contexts, 3, why, "contexts")
    n, (c, L) = len(triples), contexts.shape
    if gap is not None:
        gap = validate.count(gap, "gap", 1, L - 1, why=f"the source sits before the destination in windows of {L} tokens")
    if gap is None:
        g = torch.Generator().manual_seed(seed)
        pos = torch.randint(1, L - 1, (c,), generator=g)  # never the first token, never the destination
    else:
        pos = torch.full((c,), L - 1 - gap)
    clean = contexts[None].repeat(n, 1, 1)  # [n, c, L]
    clean[:, :, -1] = triples[:, 1:2]
    with_src = clean.clone()
    with_src[:, torch.arange(c), pos] = triples[:, 0:1].expand(n, c)
    out = triples[:, 2, None, None].expand(n, c, 1)

    def logp(batch):
        lp = model(batch.flatten(0, 1))[:, -1].log_softmax(-1).view(n, c, -1)
        return lp.gather(-1, out)[..., 0]

    return logp(with_src) - logp(clean)


# ------------------------------------------------------------------------------------------------
# The skip-trigram bug
# ------------------------------------------------------------------------------------------------
@dataclass
class SkipTrigramBug:
    """Same source, two destinations, two outputs: the head learned ``s … d1 → o1`` and
    ``s … d2 → o2`` (both bigrams ``d1 o1`` and ``d2 o2`` occur in the training text), and since its
    effect factors as attn(d, s) · OV(s, o) it also predicts ``s … d1 → o2``, a bigram that never occurs."""

    layer: int
    head: int
    source: int
    dest1: int
    out1: int
    dest2: int
    out2: int
    predicted: float  # predicted rise of the unwanted output's logit, attn(d1, s) · OVc(s, o2)
    count11: int  # training count of the bigram d1 o1
    count22: int  # training count of d2 o2

    def describe(self, tokenizer) -> str:
        s, d1, o1, d2, o2 = (
            repr(token_str(tokenizer, i)) for i in (self.source, self.dest1, self.out1, self.dest2, self.out2)
        )
        return (
            f"head {self.layer}.{self.head}: {s} … {d1} → {o1} (bigram seen {self.count11}x) and "
            f"{s} … {d2} → {o2} ({self.count22}x) also give {s} … {d1} → {o2} (never seen), "
            f"predicted +{self.predicted:.2f}"
        )

    @property
    def triples(self) -> Int[Tensor, "3 3"]:
        """The two learned triples and the unwanted one, as ``[source, destination, output]`` rows."""
        s = self.source
        return torch.tensor([[s, self.dest1, self.out1], [s, self.dest2, self.out2], [s, self.dest1, self.out2]])


@torch.no_grad()
def find_skip_trigram_bugs(
    model: Transformer,
    layer: int,
    bigram_counts: Int[Tensor, "d_vocab d_vocab"],
    k: int = 8,
    min_count: int = 5,
    n: int = 10,
    tokens: Int[Tensor, " m"] | None = None,
    n_keys: int | None = None,
) -> list[SkipTrigramBug]:
    """Find skip-trigram bugs automatically, strongest predicted unwanted rise first.

    For every head and every source ``s``: take its ``k`` best destinations (by attention) and ``k`` best
    outputs (by OV), and look for ``d1, d2, o1, o2`` among them with the bigrams ``d1 o1`` and ``d2 o2``
    seen at least ``min_count`` times in training but ``d1 o2`` and ``d2 o1`` never. Then
    ``s … d1 → o2`` is raised only because ``d1`` attends to ``s`` and ``s`` raises ``o2``: the bug.
    ``bigram_counts`` is a dense ``[d_vocab, d_vocab]`` count table (``C[a, b]`` = times ``b`` follows ``a``).
    """
    V = model.cfg.d_vocab
    if tuple(bigram_counts.shape) != (V, V):
        raise ValueError(f"bigram_counts must be a dense [{V}, {V}] table, got {tuple(bigram_counts.shape)}")
    validate.depth(model, "skip-trigrams")
    layer, k, n = validate.layer(model, layer), validate.count(k, "k"), validate.count(n, "n")
    min_count, tokens = validate.count(min_count, "min_count"), _subset(model, tokens)
    n_keys = validate.count(max(2, model.cfg.n_ctx // 2) if n_keys is None else n_keys, "n_keys", 2)
    qk, ov = _centered_circuits(model, layer, None, tokens)
    ids = torch.arange(V) if tokens is None else tokens
    qk_v, dest = qk.topk_per_col(k)  # [H, k, S]
    ov_v, out = ov.topk_per_row(k)  # [H, S, k]
    dest, out = ids[dest].transpose(-2, -1), ids[out]  # [H, S, k] each, vocabulary ids
    attn = (qk_v.exp() / (qk_v.exp() + n_keys - 1)).transpose(-2, -1)  # [H, S, k]
    counts = bigram_counts.long()
    found = []
    for h in range(model.cfg.n_heads):
        C = counts[dest[h][:, :, None], out[h][:, None, :]]  # [S, k_dest, k_out]
        seen, never = C >= min_count, C == 0
        cand = (seen.flatten(1).sum(1) >= 2).nonzero()[:, 0]  # a bug needs two seen pairs
        seen, never = seen[cand], never[cand]
        # bug[s, i, j, a, b]: bigrams d_i o_j and d_a o_b seen, d_i o_b and d_a o_j never
        bug = seen[:, :, :, None, None] & seen[:, None, None, :, :]
        bug &= never[:, :, None, None, :] & never.transpose(-2, -1)[:, None, :, :, None]
        s, i, j, a, b = bug.nonzero().unbind(-1)
        s = cand[s]
        pred = attn[h, s, i] * ov_v[h, s, b]  # the unwanted rise of o_b after s … d_i
        # keep the best supporting pair per unwanted (source, destination, output), best n of those
        order = pred.argsort(descending=True)
        key = ((s * k + i) * k + b)[order]
        _, inv = torch.unique(key, return_inverse=True)
        first = torch.full((int(inv.max()) + 1 if len(inv) else 0,), len(inv), dtype=torch.long)
        first = first.scatter_reduce(0, inv, torch.arange(len(inv)), reduce="amin")
        for r in order[first.sort().values[:n]].tolist():
            s_, i_, j_, a_, b_ = int(s[r]), int(i[r]), int(j[r]), int(a[r]), int(b[r])
            d1, o1, d2, o2 = int(dest[h, s_, i_]), int(out[h, s_, j_]), int(dest[h, s_, a_]), int(out[h, s_, b_])
            found.append(
                SkipTrigramBug(
                    layer, h, int(ids[s_]), d1, o1, d2, o2, float(pred[r]), int(counts[d1, o1]), int(counts[d2, o2])
                )
            )
    found.sort(key=lambda bug: -bug.predicted)
    return found[:n]
