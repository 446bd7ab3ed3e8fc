"""Head detectors: run the model and score what each head attends to (chapters 6, 7, 10, 11).

Where ``circuits`` reads weights, this module runs forward passes. Every detector is one function
of a model and one entry of :data:`DETECTORS`; each runs on every member of the family and on
chapter 10's model, through the one model interface (:mod:`attncircuits.models.interface`):

``previous_token`` (on real text), ``prefix_matching`` (Olsson et al.'s induction score: attention
to the token after an earlier copy of the query's token), ``duplicate_token`` (attention to earlier
copies of the query's own token), ``copying`` (how much a head raises the logit of the token it
attends to, through the folded weights) and ``positional`` (how alike a head's patterns are on
different random texts) — the last four on random tokens, repeated where copies are needed.

A new detector is one function and one line: ``register("name", "column", fn)``, with ``fn(model,
probe)`` returning ``[layer, head]`` (a :class:`Probe` holds the text and the random batches);
:func:`head_scores` then computes it, and :class:`HeadScores` prints it, with every other.
Also here: value-weighted attention (the paper's way of showing where information really comes
from), repeats in real text, and the phase change in a training history. The loss-based measures
(loss on repeated tokens, the in-context-learning score, ablations) are in
:mod:`attncircuits.analysis.losses`; the logit and score attributions in
:mod:`attncircuits.analysis.attribution`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from attncircuits.analysis import definitions as D
from attncircuits.core import validate
from attncircuits.core.heads import Head, head_name
from attncircuits.data import repeated_rows
from attncircuits.models.parts import ActivationCache


def _patterns(model, tokens: Tensor, **forward_kwargs) -> Float[Tensor, "layer batch head q k"]:
    _, cache = model.forward_checked(tokens, return_cache=True, **forward_kwargs)
    return torch.stack(cache.pattern)


def _device(model) -> torch.device:
    return model.W_E.device


# ---- the detectors ---------------------------------------------------------------------------


@torch.no_grad()
def previous_token_scores(model, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer head"]:
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


def _duplicate_targets(tokens: Tensor) -> Tensor:
    """``[batch, q, k]`` True where key k < q holds query q's own token."""
    n = tokens.shape[1]
    earlier = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril(-1)
    return (tokens[:, :, None] == tokens[:, None, :]) & earlier


def _repeated_batch(model, seq_len, n_repeats, batch_size, seed, tokens, what):
    validate.depth(model, "attention heads to score")
    why = f"{what} is measured on the later copies"
    seq_len, n_repeats, batch_size = validate.repeat_args(model, seq_len, n_repeats, batch_size, min_repeats=2, why=why)
    if tokens is None:
        tokens = repeated_rows(batch_size, seq_len, n_repeats, model.cfg.d_vocab, seed)
    tokens = validate.tokens(model, tokens)
    if tokens.shape[1] != 1 + seq_len * n_repeats:
        raise ValueError(
            f"tokens has {tokens.shape[1]} positions per row, but [EOT] + {n_repeats} copies of seq_len={seq_len} "
            f"are {1 + seq_len * n_repeats}; pass tokens = repeated_tokens(model, seq_len, n_repeats) or the matching seq_len"
        )
    return seq_len, tokens


def _mass_on_later_copies(model, tokens, seq_len, target, **forward_kwargs) -> Tensor:
    pat = _patterns(model, tokens, **forward_kwargs)  # [layer, batch, head, q, k]
    later = torch.zeros(tokens.shape[1], dtype=torch.bool, device=tokens.device)
    later[1 + seq_len :] = True  # queries in copies 2, 3, ...
    mass = einsum(pat, target.to(pat.dtype), "l b h q k, b q k -> l b h q")
    return mass[..., later].mean(dim=(1, 3))


@torch.no_grad()
def prefix_matching_scores(
    model,
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
    seq_len, tokens = _repeated_batch(model, seq_len, n_repeats, batch_size, seed, tokens, "prefix matching")
    return _mass_on_later_copies(model, tokens, seq_len, _prefix_targets(tokens), **forward_kwargs)


@torch.no_grad()
def duplicate_token_scores(
    model,
    seq_len: int = 25,
    n_repeats: int = 4,
    batch_size: int = 16,
    seed: int = 0,
    tokens: Int[Tensor, "batch pos"] | None = None,
    **forward_kwargs,
) -> Float[Tensor, "layer head"]:
    """The duplicate-token score: on random tokens repeated ``n_repeats`` times, the attention a
    query in a later copy pays to earlier occurrences of its own token (one position before the
    prefix-matching target). 1 for a head that looks only at earlier copies of its token.
    ``tokens`` and ``forward_kwargs`` as for :func:`prefix_matching_scores`."""
    seq_len, tokens = _repeated_batch(model, seq_len, n_repeats, batch_size, seed, tokens, "duplicate-token attention")
    return _mass_on_later_copies(model, tokens, seq_len, _duplicate_targets(tokens), **forward_kwargs)


@torch.no_grad()
def copying_scores(model, seq_len: int = 25, batch_size: int = 8, seed: int = 0) -> Float[Tensor, "layer head"]:
    """How much each head raises the logit of the token it attends to, in ``[-1, 1]``.

    Following Olsson et al.: for every source position of random tokens, take the head's direct
    effect on the logits if it attended there, ``ℓ = v W_O W_U`` (``v`` from the real residual
    stream, so a layer-1 head sees what layer 0 wrote; in a model with LayerNorm, through the folded
    weights, the final LayerNorm's scale cancelling in the score); subtract the mean over the
    vocabulary; rectify into the promoted part ``relu(ℓ)`` and the suppressed part ``relu(-ℓ)``;
    rescale each by its largest entry. The score of one source token ``t`` is
    ``relu(ℓ)[t] / max relu(ℓ) - relu(-ℓ)[t] / max relu(-ℓ)``: +1 when ``t`` is the token the head
    promotes most (perfect copying), -1 when it is the one it suppresses most, about 0 for a head
    whose output does not single ``t`` out. Heads get the mean over source tokens.
    """
    validate.depth(model, "attention heads to score")
    seq_len, _, batch_size = validate.repeat_args(model, seq_len, 1, batch_size)
    fm = model.folded()
    toks = repeated_rows(batch_size, seq_len, 1, model.cfg.d_vocab, seed).to(_device(model))
    _, cache = fm.forward_checked(toks, return_cache=True)
    src = toks[:, 1:].flatten()  # the random tokens (the start token is left out)
    out = torch.empty(model.cfg.n_layers, model.cfg.n_heads)
    W_O, W_U = fm.W_O, fm.W_U
    for layer in range(model.cfg.n_layers):
        v = cache.v[layer][:, 1:].flatten(0, 1)  # [n, head, d_head]
        out[layer] = copying_score_of_logits(einsum(v, W_O[layer], W_U, "n h dh, h dh dm, dm vocab -> n h vocab"), src)
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


@torch.no_grad()
def positional_scores(model, seq_len: int = 48, batch_size: int = 16, seed: int = 0,
                      tokens: Int[Tensor, "batch pos"] | None = None, **forward_kwargs) -> Float[Tensor, "layer head"]:
    """How much of where a head looks is decided by positions alone: on ``batch_size`` rows of
    random tokens (or ``tokens``), one minus the mean total-variation distance between a query's
    pattern and the same query's pattern averaged over the rows (queries 1 on). 1 when every text
    gets the same pattern, near 0 when the pattern follows the tokens. A head with nothing to do on
    random text often rests on the first token, and scores high too: read it beside the others."""
    validate.depth(model, "attention heads to score")
    if tokens is None:
        seq_len, _, batch_size = validate.repeat_args(model, seq_len, 1, batch_size)
        tokens = repeated_rows(batch_size, seq_len, 1, model.cfg.d_vocab, seed).to(_device(model))
    tokens = validate.tokens(model, tokens, 2, "a positional score (a query with a choice)")
    if tokens.shape[0] < 2:
        raise ValueError(f"{tokens.shape[0]} row: a positional score compares patterns across rows; use 2 or more")
    pat = _patterns(model, tokens, **forward_kwargs)[..., 1:, :]  # [layer, batch, head, q, k]
    tv = 0.5 * (pat - pat.mean(1, keepdim=True)).abs().sum(-1)  # [layer, batch, head, q]
    return (1 - tv.mean(dim=(1, 3))).cpu()


# ---- the registry, and every head's scores at once -------------------------------------------


@dataclass(frozen=True)
class Probe:
    """What the detectors run on: real-text windows and Olsson's random tokens repeated."""

    text: Tensor | None  # [batch, pos] token windows of real text (None: the text detectors are left out)
    seq_len: int = 25
    n_repeats: int = 4
    seed: int = 0


@dataclass(frozen=True)
class Detector:
    name: str  # the score's name, a HeadScores field
    column: str  # its table header
    fn: Callable[[object, Probe], Tensor]  # (model, probe) -> [layer, head]
    needs_text: bool = False


#: every head detector of the course, in table order: :func:`register` adds one
DETECTORS: dict[str, Detector] = {}


def register(name: str, column: str, fn: Callable[[object, Probe], Tensor], needs_text: bool = False) -> None:
    """Add a detector: ``fn(model, probe) -> [layer, head]`` scores, printed under ``column``."""
    if not name.isidentifier():
        raise ValueError(f"a detector's name is a HeadScores field: use a Python name, got {name!r}")
    DETECTORS[name] = Detector(name, column, fn, needs_text)


def _seq(model, probe: Probe) -> int:
    return min(probe.seq_len, model.cfg.n_ctx - 1)


register("previous_token", "prev-token", lambda m, p: previous_token_scores(m, p.text), needs_text=True)
register("prefix_matching", "prefix-match", lambda m, p: prefix_matching_scores(m, p.seq_len, p.n_repeats, seed=p.seed))
register("duplicate_token", "dup-token", lambda m, p: duplicate_token_scores(m, p.seq_len, p.n_repeats, seed=p.seed))
register("copying", "copying", lambda m, p: copying_scores(m, seq_len=_seq(m, p), seed=p.seed))
register("positional", "positional", lambda m, p: positional_scores(m, seq_len=min(48, _seq(m, p)), seed=p.seed))

#: the detectors' names (HeadScores' fields), in table order
SCORES = tuple(DETECTORS)


class HeadScores:
    """The detectors' scores of every head, each ``[layer, head]``, as attributes by name
    (``scores.prefix_matching``): one per entry of :data:`DETECTORS` that was run."""

    def __init__(self, **scores: Tensor):
        unknown = sorted(set(scores) - set(DETECTORS))
        if unknown:
            raise ValueError(f"unknown scores {unknown}; the detectors are {sorted(DETECTORS)}")
        if not scores:
            raise ValueError("HeadScores needs at least one score")
        self.scores = {name: scores[name] for name in DETECTORS if name in scores}

    def __getattr__(self, name: str) -> Tensor:
        scores = self.__dict__.get("scores", {})
        if name in scores:
            return scores[name]
        raise AttributeError(f"HeadScores has no {name!r}; it holds {sorted(scores)}")

    def __repr__(self) -> str:
        return f"HeadScores({', '.join(self.scores)})"

    def rows(self) -> list[dict]:
        """One dict per head (``head`` is its name, ``"1.4"``: see :func:`~attncircuits.core.heads.head_name`), for a table."""
        n_layers, n_heads = next(iter(self.scores.values())).shape
        return [{"head": head_name(l, h), **{k: float(v[l, h]) for k, v in self.scores.items()}}
                for l in range(n_layers) for h in range(n_heads)]

    def table(self) -> str:
        """A fixed-width text table, one row per head."""
        cols = [(name, DETECTORS[name].column) for name in self.scores]
        lines = [f"{'head':>5} " + " ".join(f"{col:>{max(len(col), 6)}}" for _, col in cols)]
        for r in self.rows():
            lines.append(f"{r['head']:>5} " + " ".join(f"{r[name]:>{max(len(col), 6)}.3f}" for name, col in cols))
        return "\n".join(lines)

    def best(self, score: str, layer: int | None = None) -> Head:
        """The ``(layer, head)`` with the highest ``score`` (optionally within one layer)."""
        if score not in self.scores:
            raise ValueError(f"unknown score {score!r}; use one of {tuple(self.scores)}")
        s = self.scores[score].clone()
        if layer is not None:
            layer = validate.layer(s.shape[0], layer)
            s[torch.arange(s.shape[0]) != layer] = -float("inf")
        idx = int(s.argmax())
        return divmod(idx, s.shape[1])


def head_scores(
    model,
    text_tokens: Int[Tensor, "batch pos"] | None,
    seq_len: int = 25,
    n_repeats: int = 4,
    seed: int = 0,
    detectors: tuple[str, ...] | None = None,
) -> HeadScores:
    """Every detector of :data:`DETECTORS` (or those named in ``detectors``) on every head: the
    text detectors on ``text_tokens`` (real text; None leaves them out), the others on ``seq_len``
    random tokens repeated ``n_repeats`` times (Olsson's 25 x 4) or once."""
    validate.depth(model, "attention heads to score")
    names = tuple(DETECTORS) if detectors is None else tuple(detectors)
    unknown = [n for n in names if n not in DETECTORS]
    if unknown:
        raise ValueError(f"unknown detectors {unknown}; the registry has {list(DETECTORS)}")
    if text_tokens is None:
        names = tuple(n for n in names if not DETECTORS[n].needs_text)
    probe = Probe(text_tokens, seq_len, n_repeats, seed)
    with torch.no_grad():  # a detector added by hand need not say so
        return HeadScores(**{n: DETECTORS[n].fn(model, probe).cpu() for n in names})


def induction_heads(model, threshold: float = D.INDUCTION_HEAD.value) -> list[Head]:
    """The heads whose prefix-matching score (25 random tokens x 4) reaches ``threshold`` (by
    default the course's definition of an induction head, :data:`definitions.INDUCTION_HEAD`)."""
    pm = prefix_matching_scores(model, batch_size=8)
    return [(int(l), int(h)) for l, h in (pm >= threshold).nonzero().tolist()]


# ---- value-weighted attention ----------------------------------------------------------------


def value_weighted_pattern(
    model, cache: ActivationCache, layer: int, head: int
) -> Float[Tensor, "batch q k"]:
    """Attention weighted by how much each source position writes: ``A[q, k] · |v_k W_O|``,
    renormalised per query row. A head that attends to a position whose value is near zero moves no
    information from it; this weighting (the paper's, for its induction-head figures) hides those."""
    layer, head = validate.head_pair(model, (layer, head))
    pat = cache.pattern[layer][:, head]  # [batch, q, k]
    norms = (cache.v[layer][:, :, head] @ model.W_O[layer][head]).norm(dim=-1)  # [batch, k]
    weighted = pat * norms[:, None, :]
    return weighted / weighted.sum(-1, keepdim=True).clamp(min=1e-12)


# ---- finding repeats in real text, and the phase change in a training history ----------------


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
