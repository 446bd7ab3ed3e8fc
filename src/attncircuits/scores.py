"""Behaviour-based analysis: run the model and measure what its heads do (chapters 6 and 7).

Where ``circuits`` reads weights, this module runs forward passes:

- per-head scores: previous-token (real text), prefix-matching and copying (Olsson et al. 2022,
  on random tokens repeated), collected by :func:`head_scores`;
- losses: per position on repeated random tokens, first vs second copy, and the
  in-context-learning score (late-token loss minus early-token loss);
- ablations: zero ablation and Olsson's pattern-preserving ablation of chosen heads;
- value-weighted attention (the paper's way of showing where information really comes from).

Random repeated tokens are the clean test of in-context learning: nothing but an earlier copy can
predict a token of a later copy, so any loss that falls on the second copy was learned in context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from .data import repeated_random_tokens
from .heads import Head, head_name
from .model import ActivationCache, AttnOnlyTransformer, loss_fn

# ----------------------------------------------------------------------------------------------
# Inputs and their checks
# ----------------------------------------------------------------------------------------------


def max_repeat_len(n_ctx: int, n_repeats: int = 2, prepend_eot: bool = True) -> int:
    """The longest sequence that fits ``n_repeats`` times (plus the start token) in ``n_ctx``."""
    return (n_ctx - int(prepend_eot)) // n_repeats


def check_repeat_fits(model: AttnOnlyTransformer, seq_len: int, n_repeats: int = 2, prepend_eot: bool = True) -> None:
    """Raise a ValueError naming the longest ``seq_len`` that fits when the repeats overflow n_ctx."""
    if n_repeats < 1 or seq_len < 1:
        raise ValueError(f"seq_len and n_repeats must be at least 1, got seq_len={seq_len}, n_repeats={n_repeats}")
    n_ctx = model.cfg.n_ctx
    need = seq_len * n_repeats + int(prepend_eot)
    if need > n_ctx:
        best = max_repeat_len(n_ctx, n_repeats, prepend_eot)
        raise ValueError(
            f"{n_repeats} copies of {seq_len} tokens{' plus the start token' if prepend_eot else ''} need {need} "
            f"positions but the model has n_ctx={n_ctx}; the maximum seq_len for {n_repeats} copies is {best}"
        )


def repeated_tokens(
    model: AttnOnlyTransformer, seq_len: int | None = None, n_repeats: int = 2, batch_size: int = 16, seed: int = 0
) -> Int[Tensor, "batch pos"]:
    """``[EOT] r1..rL r1..rL ...`` for this model's vocabulary; by default the longest L that fits."""
    seq_len = seq_len if seq_len is not None else max_repeat_len(model.cfg.n_ctx, n_repeats)
    check_repeat_fits(model, seq_len, n_repeats)
    return repeated_random_tokens(batch_size, seq_len, n_repeats, model.cfg.d_vocab, seed, n_ctx=model.cfg.n_ctx)


def as_heads(model: AttnOnlyTransformer, heads: Head | Iterable[Head]) -> list[Head]:
    """Normalise one ``(layer, head)`` or a list of them, checking that each exists."""
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(x, int) for x in heads):
        heads = [heads]
    out = []
    for item in heads:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"a head is a (layer, head) pair of ints, got {item!r}")
        layer, head = int(item[0]), int(item[1])
        model.check_head(layer, head)
        out.append((layer, head))
    return out


def _patterns(model: AttnOnlyTransformer, tokens, **forward_kwargs) -> Float[Tensor, "layer batch head q k"]:
    if model.cfg.n_layers == 0:
        raise ValueError("a model with no layers has no attention heads to score")
    _, cache = model.run_with_cache(tokens, **forward_kwargs)
    return torch.stack(cache.pattern)


# ----------------------------------------------------------------------------------------------
# Per-head attention scores
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def previous_token_scores(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer head"]:
    """Mean attention from each position to the one before it (positions 1..n-1)."""
    pat = _patterns(model, tokens)
    return pat.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, 3))


def prefix_matching_mask(seq_len: int, n_repeats: int, prepend_eot: bool = True) -> Tensor:
    """``[q, k]`` True where key k holds the token that followed an earlier copy of query q's token
    (by position: assumes the tokens within one copy are all different)."""
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
    if tokens is None:
        check_repeat_fits(model, seq_len, n_repeats)
        tokens = repeated_random_tokens(batch_size, seq_len, n_repeats, model.cfg.d_vocab, seed, n_ctx=model.cfg.n_ctx)
    tokens = model.check_tokens(tokens)
    pat = _patterns(model, tokens, **forward_kwargs)  # [layer, batch, head, q, k]
    target = prefix_match_targets(tokens)  # [batch, q, k]
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
    toks = repeated_tokens(model, seq_len, 1, batch_size, seed)
    if model.cfg.n_layers == 0:
        raise ValueError("a model with no layers has no attention heads to score")
    _, cache = model.run_with_cache(toks)
    src = toks[:, 1:].flatten()  # the random tokens (the start token is left out)
    out = torch.empty(model.cfg.n_layers, model.cfg.n_heads)
    for layer, block in enumerate(model.blocks):
        v = cache.v[layer][:, 1:].flatten(0, 1)  # [n, head, d_head]
        logits = einsum(v, block.W_O, model.W_U, "n h dh, h dh dm, dm vocab -> n h vocab")
        logits = logits - logits.mean(-1, keepdim=True)
        up, down = logits.clamp(min=0), (-logits).clamp(min=0)
        idx = src[:, None, None].expand(-1, logits.shape[1], 1)
        eps = torch.finfo(logits.dtype).tiny
        score = up.gather(-1, idx)[..., 0] / up.amax(-1).clamp(min=eps) - down.gather(-1, idx)[..., 0] / down.amax(-1).clamp(min=eps)
        out[layer] = score.mean(0).cpu()
    return out


@dataclass
class HeadScores:
    """The three behavioural scores of every head, each ``[layer, head]``."""

    previous_token: Tensor
    prefix_matching: Tensor
    copying: Tensor

    def rows(self) -> list[dict]:
        """One dict per head (``head`` is its name, ``"1.4"``: see :func:`~attncircuits.heads.head_name`), for a table."""
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
        s = getattr(self, score).clone()
        if layer is not None:
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


# ----------------------------------------------------------------------------------------------
# Losses on repeated tokens and the in-context-learning score
# ----------------------------------------------------------------------------------------------


@dataclass
class RepeatedLoss:
    first: float  # mean loss on the first copy (nothing to copy from)
    second: float  # mean loss on the second copy (an induction head can copy)

    @property
    def ratio(self) -> float:
        return self.second / self.first


@torch.no_grad()
def repeated_token_loss(
    model: AttnOnlyTransformer, seq_len: int | None = None, batch_size: int = 16, seed: int = 0
) -> RepeatedLoss:
    """Loss on ``[EOT] r1..rL r1..rL``: first copy (targets r2..rL) vs second copy (targets r2..rL
    again). The first target of each copy is left out: no earlier context predicts it."""
    curve = repeated_loss_curve(model, seq_len, 2, batch_size, seed)
    first, second = curve.copy_means()
    return RepeatedLoss(first, second)


@dataclass
class RepeatedLossCurve:
    """Per-position loss on ``[EOT]`` + ``n_repeats`` copies of ``seq_len`` random tokens."""

    loss: Float[Tensor, "target"]  # loss[t] is the mean loss of predicting token t + 1
    seq_len: int
    n_repeats: int

    @property
    def positions(self) -> Tensor:
        """The position of each target token (1 .. n-1)."""
        return torch.arange(1, len(self.loss) + 1)

    def copy_means(self) -> list[float]:
        """Mean loss per copy, leaving out each copy's first target (nothing predicts it)."""
        L = self.seq_len
        return [self.loss[c * L + 1 : (c + 1) * L].mean().item() for c in range(self.n_repeats)]


@torch.no_grad()
def per_token_loss(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], chunk: int = 32, **forward_kwargs
) -> Float[Tensor, "batch target"]:
    """Next-token loss of every row and position; entry ``[b, t]`` predicts token ``t + 1`` of row ``b``.
    Rows run ``chunk`` at a time (the logits of 32 x 128 tokens are 32 MB); ``forward_kwargs``
    (``ablate=``, ``patterns=``) go to the model and must not depend on the batch."""
    tokens = model.check_tokens(tokens)
    return torch.cat([loss_fn(model(rows, **forward_kwargs), rows, per_token=True).cpu() for rows in tokens.split(chunk)])


def per_position_loss(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], chunk: int = 32, **forward_kwargs
) -> Float[Tensor, "target"]:
    """Mean next-token loss at each position over the batch; entry ``t`` predicts token ``t + 1``."""
    return per_token_loss(model, tokens, chunk, **forward_kwargs).mean(0)


@torch.no_grad()
def repeated_loss_curve(
    model: AttnOnlyTransformer,
    seq_len: int | None = None,
    n_repeats: int = 2,
    batch_size: int = 16,
    seed: int = 0,
    **forward_kwargs,
) -> RepeatedLossCurve:
    """Per-position loss on random tokens repeated ``n_repeats`` times (default: the longest
    ``seq_len`` that fits). An induction head shows as loss falling to near 0 on later copies."""
    seq_len = seq_len if seq_len is not None else max_repeat_len(model.cfg.n_ctx, n_repeats)
    toks = repeated_tokens(model, seq_len, n_repeats, batch_size, seed)
    return RepeatedLossCurve(per_position_loss(model, toks, **forward_kwargs), seq_len, n_repeats)


def icl_positions(n_ctx: int, late: int = 500, early: int = 50, ref_ctx: int = 512) -> tuple[int, int]:
    """Olsson et al.'s token 500 vs token 50 of a 512-token context, scaled to ``n_ctx``
    (125 and 12 for our n_ctx=128)."""
    if n_ctx < 2:
        raise ValueError(f"n_ctx={n_ctx} is too short for an in-context-learning score; it needs at least 2 tokens")
    for name, p in (("late", late), ("early", early)):
        if not 1 <= p < ref_ctx:
            raise ValueError(f"{name}={p} is outside the reference context of {ref_ctx} tokens: use 1 <= {name} < {ref_ctx}")
    scale = lambda p: min(n_ctx - 1, max(1, round(p * n_ctx / ref_ctx)))  # noqa: E731 (a target in 1..n_ctx-1)
    return scale(late), scale(early)


@torch.no_grad()
def in_context_learning_score(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    late: int | None = None,
    early: int | None = None,
) -> float:
    """Loss at a late position minus loss at an early one (nats; negative = the model uses context).

    Olsson et al. use token 500 minus token 50 in 512-token contexts; by default the positions are
    scaled to this model's context (``icl_positions``: 125 and 12 for n_ctx=128). Losses are means
    over ``tokens``' rows at those target positions.
    """
    late, early = _icl_check(model.cfg.n_ctx, tokens.shape[-1], late, early)
    loss_late, loss_early = loss_at_positions(model, tokens, [late, early])
    return (loss_late - loss_early).item()


@torch.no_grad()
def loss_at_positions(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], positions: Sequence[int], chunk: int = 64
) -> Float[Tensor, " k"]:
    """Mean loss of predicting the token at each of ``positions`` (1..n-1), over the batch.

    Only those positions are unembedded (``resid[-1] @ W_U``), which is most of a forward pass's
    cost in these models (``d_vocab`` = 16 x ``d_model``): the in-context-learning score over
    thousands of windows then takes seconds."""
    tokens = model.check_tokens(tokens)
    pos = torch.as_tensor(list(positions), dtype=torch.long)
    if len(pos) == 0 or pos.min() < 1 or pos.max() >= tokens.shape[1]:
        raise ValueError(f"positions must lie in 1..{tokens.shape[1] - 1} (a target needs a token before it), got {pos.tolist()}")
    total = torch.zeros(len(pos))
    for rows in tokens.split(chunk):
        _, cache = model.run_with_cache(rows)
        logp = (cache.resid[-1][:, pos - 1] @ model.W_U).log_softmax(-1)  # [batch, k, d_vocab]
        total += -logp.gather(-1, rows[:, pos, None])[..., 0].sum(0).cpu()
    return total / tokens.shape[0]


def _icl_check(n_ctx: int, n: int, late: int | None, early: int | None) -> tuple[int, int]:
    d_late, d_early = icl_positions(n_ctx)
    late, early = late if late is not None else d_late, early if early is not None else d_early
    for name, p in (("late", late), ("early", early)):
        if p >= n_ctx:
            raise ValueError(f"ICL position {name}={p} is past the context length n_ctx={n_ctx}; use 1 <= {name} < {n_ctx}")
        if not 1 <= p < n:
            raise ValueError(f"ICL position {name}={p} is outside the sequence: use 1 <= position < {n} (n_ctx={n_ctx})")
    return late, early


def icl_scores_per_row(
    nll: Float[Tensor, "batch target"], n_ctx: int, late: int | None = None, early: int | None = None
) -> Float[Tensor, " batch"]:
    """Each row's ``loss[late - 1] - loss[early - 1]`` (from :func:`per_token_loss`). Their mean is the
    in-context-learning score and their spread its error: one position of one window is a noisy
    measurement (a standard deviation of about 3 nats here), so the standard error is
    ``std / sqrt(rows)``, about 0.1 nats over 1024 windows."""
    late, early = _icl_check(n_ctx, nll.shape[-1] + 1, late, early)
    return nll[:, late - 1] - nll[:, early - 1]


def icl_score_from_loss(
    loss: Float[Tensor, "target"], n_ctx: int, late: int | None = None, early: int | None = None
) -> float:
    """The in-context-learning score from a per-position loss (:func:`per_position_loss`, entry
    ``t`` = loss of the token at position ``t + 1``): ``loss[late - 1] - loss[early - 1]``."""
    late, early = _icl_check(n_ctx, len(loss) + 1, late, early)
    return (loss[late - 1] - loss[early - 1]).item()


# ----------------------------------------------------------------------------------------------
# Ablations
# ----------------------------------------------------------------------------------------------

AblationMode = Literal["zero", "pattern"]


def zero_ablation(model: AttnOnlyTransformer, heads: Head | Iterable[Head]) -> dict:
    """Forward keyword arguments that zero the output of ``heads``: ``model(tokens, **zero_ablation(...))``.

    Downstream heads then see a residual stream without these heads, so their attention patterns can
    change too (a previous-token head's removal changes what an induction head's keys say)."""
    return {"ablate": {h: 0.0 for h in as_heads(model, heads)}}


@torch.no_grad()
def pattern_preserving_ablation(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    heads: Head | Iterable[Head],
    cache: ActivationCache | None = None,
) -> dict:
    """Forward keyword arguments for Olsson et al.'s pattern-preserving ablation of ``heads``.

    The heads' outputs are zeroed, but every head's attention pattern is frozen to its value on the
    clean run of ``tokens``. What is removed is then only what the heads *write* (their OV side,
    directly to the logits and into later heads' values), not their effect on later heads' queries
    and keys. Ablating an induction head this way measures its own contribution to the loss.
    ``cache`` is the clean run of ``tokens`` if you already have it."""
    heads = as_heads(model, heads)
    if cache is None:
        _, cache = model.run_with_cache(tokens)
    frozen = {(l, h): cache.pattern[l][:, h] for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)}
    return {"ablate": {h: 0.0 for h in heads}, "patterns": frozen}


@torch.no_grad()
def ablated_loss(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    heads: Head | Iterable[Head] = (),
    mode: AblationMode = "zero",
    per_token: bool = False,
    cache: ActivationCache | None = None,
):
    """The model's loss on ``tokens`` with ``heads`` ablated (``mode``: ``"zero"`` or ``"pattern"``;
    ``cache``, the clean run of ``tokens``, saves a forward pass in pattern mode)."""
    tokens = model.check_tokens(tokens)
    heads = as_heads(model, heads) if heads else []
    if mode == "zero":
        kwargs = zero_ablation(model, heads)
    elif mode == "pattern":
        kwargs = pattern_preserving_ablation(model, tokens, heads, cache)
    else:
        raise ValueError(f"unknown ablation mode {mode!r}; use 'zero' or 'pattern'")
    nll = loss_fn(model(tokens, **kwargs), tokens, per_token=True)
    return nll.cpu() if per_token else nll.mean().item()


@torch.no_grad()
def ablation_effects(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"],
    mode: AblationMode = "zero",
    targets: slice | Sequence[int] | None = None,
    heads: Head | Iterable[Head] | None = None,
) -> Float[Tensor, "layer head"]:
    """Loss increase (nats) when each head alone is ablated; ``targets`` picks the target positions
    averaged (index into the per-token loss, e.g. the second copy of a repeated sequence).
    ``heads`` limits the work to some heads (the others are NaN); default: every head."""
    if mode not in ("zero", "pattern"):
        raise ValueError(f"unknown ablation mode {mode!r}; use 'zero' or 'pattern'")
    tokens = model.check_tokens(tokens)
    targets = slice(None) if targets is None else targets
    logits, cache = model.run_with_cache(tokens)
    base = loss_fn(logits, tokens, per_token=True)[:, targets].mean()
    if heads is None:
        heads = [(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    out = torch.full((model.cfg.n_layers, model.cfg.n_heads), float("nan"))
    for l, h in as_heads(model, heads):
        nll = ablated_loss(model, tokens, (l, h), mode, per_token=True, cache=cache)
        out[l, h] = nll[:, targets].mean() - base.cpu()
    return out


# ----------------------------------------------------------------------------------------------
# Value-weighted attention
# ----------------------------------------------------------------------------------------------


def value_weighted_pattern(
    model: AttnOnlyTransformer, cache: ActivationCache, layer: int, head: int
) -> Float[Tensor, "batch q k"]:
    """Attention weighted by how much each source position writes: ``A[q, k] · |v_k W_O|``,
    renormalised per query row. A head that attends to a position whose value is near zero moves no
    information from it; this weighting (the paper's, for its induction-head figures) hides those."""
    model.check_head(layer, head)
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
    t = torch.as_tensor(tokens).flatten()
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
    if not 0 < frac < 1:
        raise ValueError(f"frac={frac} must be between 0 and 1 (0.5: the midpoint of the rise)")
    best = [max(v[layer]) for v in history[key] if v is not None]
    steps = [s for s, v in zip(history["step"], history[key]) if v is not None]
    if len(best) < 2 or best[-1] <= best[0]:
        raise ValueError(f"the best layer-{layer} {key!r} score never rises in this history; there is no phase change to locate")
    level = best[0] + frac * (best[-1] - best[0])
    return next(s for s, b in zip(steps, best) if b >= level)
