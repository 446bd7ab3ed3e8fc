"""Behaviour-based analysis: run the model and score what each head attends to (chapters 6 and 7).

Where ``circuits`` reads weights, this module runs forward passes:

- per-head scores: previous-token (real text), prefix-matching and copying (Olsson et al. 2022,
  on random tokens repeated), collected by :func:`head_scores`;
- value-weighted attention (the paper's way of showing where information really comes from);
- repeats in real text, and the phase change in a training history.

The loss-based measures (loss on repeated tokens, the in-context-learning score, ablations) live
in :mod:`attncircuits.analysis.losses`, and the chapters import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.analysis.circuits.paths import next_token_contributions
from attncircuits.core import validate
from attncircuits.core.heads import Head, head_name
from attncircuits.data import repeated_rows
from attncircuits.models.attn_only import ActivationCache, AttnOnlyTransformer

SCORES = ("previous_token", "prefix_matching", "copying")


def _patterns(model: AttnOnlyTransformer, tokens: Tensor, **forward_kwargs) -> Float[Tensor, "layer batch head q k"]:
    if not isinstance(model, AttnOnlyTransformer) and not forward_kwargs:  # chapter 10's HookedTransformer
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
        return torch.stack([cache["pattern", layer] for layer in range(model.cfg.n_layers)])
    _, cache = model.forward_checked(tokens, return_cache=True, **forward_kwargs)
    return torch.stack(cache.pattern)


# ----------------------------------------------------------------------------------------------
# Per-head attention scores
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def previous_token_scores(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer head"]:
    """Mean attention from each position to the one before it (positions 1..n-1)."""
    validate.depth(model, "attention heads to score")
    tokens = validate.tokens(model, tokens, 2, "a previous-token score (a token with one before it)")
    pat = _patterns(model, tokens)
    return pat.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, 3))


def prefix_matching_mask(seq_len: int, n_repeats: int, prepend_eot: bool = True) -> Tensor:
    """``[q, k]`` True where key k holds the token that followed an earlier copy of query q's token
    (by position: assumes the tokens within one copy are all different)."""
    seq_len, n_repeats = validate.repeats(seq_len, n_repeats, None, prepend_eot)
    off = int(prepend_eot)
    n = seq_len * n_repeats + off
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(seq_len, seq_len * n_repeats):  # queries in copies 2, 3, ...
        for j in range(i - seq_len, -1, -seq_len):  # earlier occurrences of the same token
            mask[i + off, j + 1 + off] = True
    return mask


def prefix_match_targets(tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """``[batch, q, k]`` True where the token before key k equals query q's token (k - 1 < q).

    This is the definition itself ("the token after an earlier occurrence of my token"); unlike
    :func:`prefix_matching_mask` it stays right when a random sequence happens to hold a token twice.
    """
    return _prefix_targets(validate.token_rows(tokens))


def _prefix_targets(tokens: Tensor) -> Tensor:
    prev = tokens[:, :-1]  # token before key k = 1..n-1
    match = tokens[:, :, None] == prev[:, None, :]  # [batch, q, k-1]
    n = tokens.shape[1]
    earlier = torch.ones(n, n - 1, dtype=torch.bool, device=tokens.device).tril(-1)  # k-1 < q
    out = torch.zeros(tokens.shape[0], n, n, dtype=torch.bool, device=tokens.device)
    out[:, :, 1:] = match & earlier
    return out


@torch.no_grad()
def prefix_matching_scores(
    model: AttnOnlyTransformer,
    seq_len: int = 25,
    n_repeats: int = 4,
    batch_size: int = 16,
    seed: int = 0,
    tokens: Int[Tensor, "batch pos"] | None = None,
    **forward_kwargs,
) -> Float[Tensor, "layer head"]:
    """Olsson et al.'s prefix-matching score: on random tokens repeated ``n_repeats`` times, the
    attention a query in a later copy pays to the tokens right after earlier occurrences of its
    own token. 1 for a perfect induction head, about ``1/position`` for uniform attention.

    ``tokens`` replaces the random batch (it must be ``[EOT]`` + ``n_repeats`` copies of ``seq_len``);
    ``forward_kwargs`` go to the model, e.g. ``**zero_ablation(model, (0, 3))`` to score the heads
    with another head removed.
    """
    validate.depth(model, "attention heads to score")
    why = "prefix matching is measured on the later copies"
    seq_len, n_repeats, batch_size = validate.repeat_args(model, seq_len, n_repeats, batch_size, min_repeats=2, why=why)
    if tokens is None:
        tokens = repeated_rows(batch_size, seq_len, n_repeats, model.cfg.d_vocab, seed)
    tokens = validate.tokens(model, tokens)
    if tokens.shape[1] != 1 + seq_len * n_repeats:
        raise ValueError(
            f"tokens has {tokens.shape[1]} positions per row, but [EOT] + {n_repeats} copies of seq_len={seq_len} "
            f"are {1 + seq_len * n_repeats}; pass tokens = repeated_tokens(model, seq_len, n_repeats) or the matching seq_len"
        )
    pat = _patterns(model, tokens, **forward_kwargs)  # [layer, batch, head, q, k]
    target = _prefix_targets(tokens)  # [batch, q, k]
    later = torch.zeros(tokens.shape[1], dtype=torch.bool, device=tokens.device)
    later[1 + seq_len :] = True  # queries in copies 2, 3, ...
    mass = einsum(pat, target.to(pat.dtype), "l b h q k, b q k -> l b h q")
    return mass[..., later].mean(dim=(1, 3))


@torch.no_grad()
def copying_scores(
    model: AttnOnlyTransformer, seq_len: int = 25, batch_size: int = 8, seed: int = 0
) -> Float[Tensor, "layer head"]:
    """How much each head raises the logit of the token it attends to, in ``[-1, 1]``.

    Following Olsson et al.: for every source position of random tokens, take the head's direct
    effect on the logits if it attended there, ``ℓ = v W_O W_U`` (``v`` from the real residual
    stream, so a layer-1 head sees what layer 0 wrote); subtract the mean over the vocabulary;
    rectify into the promoted part ``relu(ℓ)`` and the suppressed part ``relu(-ℓ)``; rescale each by
    its largest entry. The score of one source token ``t`` is
    ``relu(ℓ)[t] / max relu(ℓ) - relu(-ℓ)[t] / max relu(-ℓ)``: +1 when ``t`` is the token the head
    promotes most (perfect copying), -1 when it is the one it suppresses most, about 0 for a head
    whose output does not single ``t`` out. Heads get the mean over source tokens.
    """
    validate.depth(model, "attention heads to score")
    seq_len, _, batch_size = validate.repeat_args(model, seq_len, 1, batch_size)
    toks = repeated_rows(batch_size, seq_len, 1, model.cfg.d_vocab, seed).to(next(model.parameters()).device)
    _, cache = model.forward_checked(toks, return_cache=True)
    src = toks[:, 1:].flatten()  # the random tokens (the start token is left out)
    out = torch.empty(model.cfg.n_layers, model.cfg.n_heads)
    for layer, block in enumerate(model.blocks):
        v = cache.v[layer][:, 1:].flatten(0, 1)  # [n, head, d_head]
        out[layer] = copying_score_of_logits(einsum(v, block.W_O, model.W_U, "n h dh, h dh dm, dm vocab -> n h vocab"), src)
    return out


def copying_score_of_logits(logits: Float[Tensor, "n head vocab"], src: Int[Tensor, " n"]) -> Float[Tensor, " head"]:
    """The copying score (see :func:`copying_scores`) of every head from its direct logit effects
    ``logits[i]`` when attending to source token ``src[i]``."""
    logits = logits - logits.mean(-1, keepdim=True)
    up, down = logits.clamp(min=0), (-logits).clamp(min=0)
    idx = src[:, None, None].expand(-1, logits.shape[1], 1)
    eps = torch.finfo(logits.dtype).tiny
    score = up.gather(-1, idx)[..., 0] / up.amax(-1).clamp(min=eps) - down.gather(-1, idx)[..., 0] / down.amax(-1).clamp(min=eps)
    return score.mean(0).cpu()


@dataclass
class HeadScores:
    """The three behavioural scores of every head, each ``[layer, head]``."""

    previous_token: Tensor
    prefix_matching: Tensor
    copying: Tensor

    def rows(self) -> list[dict]:
        """One dict per head (``head`` is its name, ``"1.4"``: see :func:`~attncircuits.core.heads.head_name`), for a table."""
        n_layers, n_heads = self.previous_token.shape
        return [
            {
                "head": head_name(l, h),
                "previous_token": float(self.previous_token[l, h]),
                "prefix_matching": float(self.prefix_matching[l, h]),
                "copying": float(self.copying[l, h]),
            }
            for l in range(n_layers)
            for h in range(n_heads)
        ]

    def table(self) -> str:
        """A fixed-width text table, one row per head."""
        lines = [f"{'head':>6} {'prev-token':>10} {'prefix-match':>12} {'copying':>8}"]
        for r in self.rows():
            lines.append(f"{r['head']:>6} {r['previous_token']:>10.3f} {r['prefix_matching']:>12.3f} {r['copying']:>8.3f}")
        return "\n".join(lines)

    def best(self, score: str, layer: int | None = None) -> Head:
        """The ``(layer, head)`` with the highest ``score`` (optionally within one layer)."""
        if score not in SCORES:
            raise ValueError(f"unknown score {score!r}; use one of {SCORES}")
        s = getattr(self, score).clone()
        if layer is not None:
            layer = validate.layer(s.shape[0], layer)
            s[torch.arange(s.shape[0]) != layer] = -float("inf")
        idx = int(s.argmax())
        return divmod(idx, s.shape[1])


def head_scores(
    model: AttnOnlyTransformer,
    text_tokens: Int[Tensor, "batch pos"],
    seq_len: int = 25,
    n_repeats: int = 4,
    seed: int = 0,
) -> HeadScores:
    """Previous-token score on ``text_tokens`` (real text); prefix-matching score on ``seq_len``
    random tokens repeated ``n_repeats`` times (Olsson's 25 x 4) and copying score on random tokens,
    for every head."""
    return HeadScores(
        previous_token=previous_token_scores(model, text_tokens).cpu(),
        prefix_matching=prefix_matching_scores(model, seq_len, n_repeats, seed=seed).cpu(),
        copying=copying_scores(model, seq_len=min(seq_len, model.cfg.n_ctx - 1), seed=seed),
    )


def induction_heads(model: AttnOnlyTransformer, threshold: float = 0.3) -> list[Head]:
    """The heads whose prefix-matching score (25 random tokens x 4) is above ``threshold``."""
    pm = prefix_matching_scores(model, batch_size=8)
    return [(int(l), int(h)) for l, h in (pm > threshold).nonzero().tolist()]


# ----------------------------------------------------------------------------------------------
# Attention scores by source, and the logit by term
# ----------------------------------------------------------------------------------------------


def qk_source_names(model: AttnOnlyTransformer) -> list[str]:
    """The sources of a layer-1 query or key input: the embedding, the positions, each layer-0 head."""
    return ["embed", "pos"] + [head_name(0, h) for h in range(model.cfg.n_heads)]


@torch.no_grad()
def qk_score_terms(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], head: int
) -> Float[Tensor, "q_source k_source batch q k"]:
    """The attention scores of layer-1 head ``head`` split by where the query and the key input
    come from (:func:`qk_source_names`): the query input is ``W_E[t] + W_pos + Σ_a out^{0,a}`` and
    so is the key's, so the score is a sum of ``(2 + n_heads)²`` terms
    ``(src_q W_Q)(src_k W_K)ᵀ / sqrt(d_head)``. Unmasked: the causal mask is not applied."""
    validate.depth(model, "splitting a layer-1 head's scores by source", at_least=2)
    tokens = validate.tokens(model, tokens)
    head = validate.head(model, head)
    _, cache = model.forward_checked(tokens, return_cache=True)
    n = tokens.shape[1]
    parts = [model.W_E[tokens], model.W_pos[:n].expand(tokens.shape[0], -1, -1)]
    parts += [cache.head_out[0][:, :, a] for a in range(model.cfg.n_heads)]
    src = torch.stack(parts)  # [source, batch, pos, d_model]
    blk = model.blocks[1]
    q = src @ blk.W_Q[head]
    k = src @ blk.W_K[head]
    return einsum(q, k, "s b q d, t b k d -> s t b q k") / model.cfg.d_head**0.5


def attribution_labels(model: AttnOnlyTransformer) -> list[str]:
    """The names of the terms of :func:`logit_attribution`: ``direct``, then ``0.0``, ``0.1``, ...
    (:func:`~attncircuits.core.heads.head_name`)."""
    return ["direct"] + [head_name(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]


@torch.no_grad()
def logit_attribution(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch target term"]:
    """Each term's share of the logit of the *next* token, at every position but the last: the
    direct path ``W_E[t] W_U`` and every head's output times ``W_U`` (:func:`attribution_labels`).
    With no LayerNorm or biases the terms sum exactly to the model's logit of that token."""
    tokens = validate.tokens(model, tokens, 2, "a next token to attribute")
    _, cache = model.forward_checked(tokens, return_cache=True)
    parts = [(model.W_E[tokens] @ model.W_U)[:, :, None]] + [out @ model.W_U for out in cache.head_out]
    return next_token_contributions(parts, tokens, centered=False)


@torch.no_grad()
def two_back_accuracy(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], back: int = 2) -> float:
    """How often the model's top prediction at position ``i`` is the token at ``i - back``."""
    back = validate.count(back, "back")
    tokens = validate.tokens(model, tokens, back + 1, f"a token {back} back")
    logits = model.forward_checked(tokens)
    return float((logits[:, back:].argmax(-1) == tokens[:, :-back]).float().mean())


# ----------------------------------------------------------------------------------------------
# Value-weighted attention
# ----------------------------------------------------------------------------------------------


def value_weighted_pattern(
    model: AttnOnlyTransformer, cache: ActivationCache, layer: int, head: int
) -> Float[Tensor, "batch q k"]:
    """Attention weighted by how much each source position writes: ``A[q, k] · |v_k W_O|``,
    renormalised per query row. A head that attends to a position whose value is near zero moves no
    information from it; this weighting (the paper's, for its induction-head figures) hides those."""
    layer, head = validate.head_pair(model, (layer, head))
    pat = cache.pattern[layer][:, head]  # [batch, q, k]
    norms = (cache.v[layer][:, :, head] @ model.blocks[layer].W_O[head]).norm(dim=-1)  # [batch, k]
    weighted = pat * norms[:, None, :]
    return weighted / weighted.sum(-1, keepdim=True).clamp(min=1e-12)


# ----------------------------------------------------------------------------------------------
# Finding repeats in real text, and the phase change in a training history
# ----------------------------------------------------------------------------------------------


def repeated_spans(tokens: Int[Tensor, " pos"], min_len: int = 4, min_gap: int = 1) -> list[tuple[int, int, int]]:
    """Spans of at least ``min_len`` tokens that occur again later in ``tokens``, as
    ``(first start, second start, length)``, longest first. Only maximal spans are listed (not
    extendable to the left or right), and the second copy starts at least ``min_gap`` after the first."""
    t = validate.token_ids(tokens, None, "tokens", ndim=1)
    min_len, min_gap = validate.count(min_len, "min_len"), validate.count(min_gap, "min_gap")
    n = len(t)
    eq = t[:, None] == t[None, :]
    out = []
    for i, j in torch.nonzero(torch.triu(eq, diagonal=min_gap)).tolist():
        if i > 0 and t[i - 1] == t[j - 1]:
            continue  # not maximal: it extends to the left
        length = 0
        while j + length < n and i + length < j and t[i + length] == t[j + length]:
            length += 1
        if length >= min_len:
            out.append((i, j, length))
    return sorted(out, key=lambda s: (-s[2], s[0]))


def phase_change_step(history: dict, key: str = "prefix_matching", layer: int = 1, frac: float = 0.5) -> int:
    """The first evaluated training step at which the best ``layer`` head's ``key`` score (default:
    prefix matching) has covered ``frac`` of its rise from the first evaluation to the last: the
    midpoint of the phase change. A midpoint is steadier than the steepest step between two noisy
    evaluations, and for an S-shaped rise it is the same moment."""
    if key not in history or "step" not in history:
        raise KeyError(f"history has no {key!r} or 'step' column; available: {sorted(history)}")
    if not 0 < validate.number(frac, "frac") < 1:
        raise ValueError(f"frac={frac} must be between 0 and 1 (0.5: the midpoint of the rise)")
    rows = [v for v in history[key] if v is not None]
    layer = validate.in_range(layer, len(rows[0]) if rows else 0, "layer", f"layers in history[{key!r}]")
    best = [max(v[layer]) for v in rows]
    steps = [s for s, v in zip(history["step"], history[key]) if v is not None]
    if len(best) < 2 or best[-1] <= best[0]:
        raise ValueError(f"the best layer-{layer} {key!r} score never rises in this history; there is no phase change to locate")
    level = best[0] + frac * (best[-1] - best[0])
    return next(s for s, b in zip(steps, best) if b >= level)
