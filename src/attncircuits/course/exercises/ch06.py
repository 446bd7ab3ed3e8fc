"""Checks for chapter 6, induction heads: the previous-token and prefix-matching scores from a
cache, finding induction heads in any model, zero and mean ablation, the induction head's
attention scores split by source, and the copying accuracy of the induction heads' OV circuits.

The references are the package's own functions for these quantities, in the rooms of what they
read (:mod:`attncircuits.analysis.scores`, :mod:`attncircuits.analysis.losses`, :mod:`attncircuits.analysis.circuits`); the
chapter's later cells call them, never the learner's versions. Each is withheld while the learner's function runs.
"""

from __future__ import annotations

import math

import torch
from einops import einsum
from torch import Tensor

from attncircuits.analysis import losses, scores
from attncircuits.analysis.circuits.copying import ov_copying_accuracy
from attncircuits.analysis.losses import mean_ablation
from attncircuits.analysis.attribution import qk_score_terms
from attncircuits.analysis.scores import induction_heads
from attncircuits.checkpoints.pretrained import validation_windows
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises import ch06_heads as heads
from attncircuits.course.exercises._core import (
    Case, Diagnosis, Identity, guarded, other_heads, random_model, run_check, shipped,
)
from attncircuits.models import handbuilt
from attncircuits.models.transformer import Transformer

__all__ = [
    "check_ablated_loss",
    "check_copying_accuracy",
    "check_find_induction_heads",
    "check_prefix_matching_score",
    "check_previous_token_score",
    "check_qk_score_terms",
]


# ---- inputs ---------------------------------------------------------------------------------------
def _two_layer() -> Transformer:
    """A random two-layer model with the context of the shipped ones (room for 25 x 4 repeats)."""
    return random_model(n_layers=2, seed=6, n_ctx=128)


def _text(model: Transformer, n: int = 8) -> Tensor:
    return validation_windows(n_ctx=model.cfg.n_ctx)[:n]


def _pattern(model: Transformer, tokens: Tensor, layer: int) -> Tensor:
    return model.run_with_cache(tokens)[1].pattern[layer]


def _as_number(x):
    return x.item() if isinstance(x, Tensor) and x.numel() == 1 else x


# ---- 6.1 previous-token score from a pattern ------------------------------------------------------
def _prev(pattern, offset=-1):
    return pattern.diagonal(offset=offset, dim1=-2, dim2=-1).mean((0, 2))


@guarded
def check_previous_token_score(fn) -> bool:
    """``previous_token_score(pattern [batch, head, q, k]) -> Tensor [head]``."""
    m2, rnd = shipped("attn-only-2l").model, _two_layer()
    text = _text(m2, 4)
    cases = [
        Case("attn-only-2l layer 0, 8 windows of text", (_pattern(m2, text, 0),)),
        Case("attn-only-2l layer 1, 8 windows of text", (_pattern(m2, text, 1),)),
        Case("a random 2-layer model, layer 0", (_pattern(rnd, text[:4] % rnd.cfg.d_vocab, 0),), kind="random"),
    ]
    return run_check(
        fn,
        cases,
        _prev,
        [
            Diagnosis("you measured attention to the token itself: the previous token is the diagonal at offset -1",
                      lambda e, c: _prev(c.args[0], 0)),
            Diagnosis("you measured attention two tokens back: the previous token is the diagonal at offset -1",
                      lambda e, c: _prev(c.args[0], -2)),
            Diagnosis("you summed over batch and positions: take the mean",
                      lambda e, c: c.args[0].diagonal(offset=-1, dim1=-2, dim2=-1).sum((0, 2))),
            Diagnosis("you averaged over heads too: keep one score per head (mean over batch and positions)",
                      lambda e, c: _prev(c.args[0]).mean().expand_as(e)),
        ],
        name="previous_token_score",
        withheld=[scores.previous_token_scores],
        generate=_draws.pattern_case,
        identities=[Identity("a causal pattern: each query's attention sums to 1", _draws.causal_rows)],
    )


# ---- 6.2 prefix-matching score from a pattern -----------------------------------------------------
def _prefix(pattern, tokens, seq_len):
    target = scores.prefix_match_targets(tokens).to(pattern.dtype)
    mass = einsum(pattern, target, "b h q k, b q k -> b h q")
    return mass[:, :, 1 + seq_len :].mean((0, 2))


def _by_position(pattern, tokens, seq_len, nearest=False):
    """Attention on key q - j * seq_len + 1 for each earlier copy j (``nearest``: j = 1 only):
    the targets found by position, which miss a token that comes twice in one copy."""
    n = tokens.shape[1]
    target = torch.zeros(n, n)
    for q in range(1 + seq_len, n):
        for j in range(1, 2 if nearest else q // seq_len + 1):
            if q - j * seq_len + 1 >= 1:
                target[q, q - j * seq_len + 1] = 1.0
    return einsum(pattern, target.to(pattern.dtype), "b h q k, q k -> b h q")[:, :, 1 + seq_len :].mean((0, 2))


def _duplicate(pattern, tokens, seq_len):
    n = tokens.shape[1]
    same = (tokens[:, :, None] == tokens[:, None, :]) & torch.ones(n, n, dtype=torch.bool).tril(-1)
    return einsum(pattern, same.to(pattern.dtype), "b h q k, b q k -> b h q")[:, :, 1 + seq_len :].mean((0, 2))


@guarded
def check_prefix_matching_score(fn) -> bool:
    """``prefix_matching_score(pattern, tokens, seq_len) -> Tensor [head]`` on ``[EOT]`` + copies."""
    cases = []
    for name, layer, kind in (("attn-only-2l", 1, "shipped"), ("attn-only-1l", 0, "shipped")):
        m = shipped(name).model
        toks = losses.repeated_tokens(m, 25, 4, batch_size=8)
        cases.append(Case(f"{name} layer {layer}, 25 tokens x 4", (_pattern(m, toks, layer), toks, 25), kind=kind))
    rnd = _two_layer()
    toks = losses.repeated_tokens(rnd, 20, 3, batch_size=4, seed=1)
    cases.append(Case("a random 2-layer model, 20 tokens x 3", (_pattern(rnd, toks, 1), toks, 20), kind="random"))
    return run_check(
        fn,
        cases,
        _prefix,
        [
            Diagnosis("you scored attention to the earlier copy of the token itself; the target is the token after it",
                      lambda e, c: _duplicate(*c.args)),
            Diagnosis("only the token after the nearest earlier copy counted; count the one after every earlier "
                      "copy: each key whose previous token is the query's token", lambda e, c: _by_position(*c.args, nearest=True)),
            Diagnosis("the keys were found by position; the text asks for keys whose previous token equals the "
                      "query's token, which also finds a token that comes twice in one copy",
                      lambda e, c: _by_position(*c.args)),
            Diagnosis("you averaged over the first copy too: only queries in later copies (from 1 + seq_len) count",
                      lambda e, c: einsum(c.args[0], scores.prefix_match_targets(c.args[1]).to(e.dtype),
                                          "b h q k, b q k -> b h q").mean((0, 2))),
        ],
        name="prefix_matching_score",
        withheld=[scores.prefix_matching_scores],
        generate=_draws.repeats,
        identities=[Identity("a causal pattern: each query's attention sums to 1", _draws.causal_rows),
                    Identity("tokens are [EOT] then copies of seq_len tokens", lambda p, t, L: _draws.copies(t, L))],
    )


# ---- 6.3 find the induction heads of any model ----------------------------------------------------
@guarded
def check_find_induction_heads(fn) -> bool:
    """``find_induction_heads(model, threshold=0.3) -> list[(layer, head)]``, on five models, one of
    them with its induction heads in layer 2 (so that looking only at layer 1 does not pass) and one
    with them before its last layer (so that looking only at the last does not), then with other
    thresholds passed: 0.95, above every head of attn-only-2l (so that a fixed 0.3 does not pass),
    and 0.01, which layer-0 heads of attn-only-1l pass (so that leaving out layer 0 does not)."""
    m2 = shipped("attn-only-2l").model
    cases = [
        Case("attn-only-2l", (m2,)),
        Case("attn-only-1l", (shipped("attn-only-1l").model,)),
        Case("a hand-built induction model", (handbuilt.induction_model(),), kind="hand-built"),
        Case("a random 2-layer model", (_two_layer(),), kind="random"),
        Case("attn-only-2l with an empty layer inserted (its induction heads in layer 2)",
             (heads.with_empty_layer(m2, 1),), kind="hand-built"),
        Case("attn-only-2l with an empty layer appended (its induction heads in layer 1 of 3)",
             (heads.with_empty_layer(m2, m2.cfg.n_layers),), kind="hand-built"),
        # prefix-matching scores: attn-only-2l's best is 0.91, attn-only-1l's layer-0 heads 0.0002-0.04
        Case("attn-only-2l, threshold 0.95", (m2, 0.95)),
        Case("attn-only-1l, threshold 0.01", (shipped("attn-only-1l").model, 0.01)),
    ]
    return run_check(fn, cases, induction_heads, compare=heads.compare_heads, name="find_induction_heads",
                     n_generated=2, generate=heads.more_models, withheld=[induction_heads])


# ---- 6.4 zero and mean ablation -------------------------------------------------------------------
def _ablated(model, tokens, head, mode):
    if mode == "zero":
        return losses.ablated_loss(model, tokens, head, "zero")
    return losses.per_token_loss(model, tokens, **mean_ablation(model, tokens, head)).mean().item()


@guarded
def check_ablated_loss(fn) -> bool:
    """``ablated_loss(model, tokens, head, mode) -> float`` with ``mode`` ``"zero"`` or ``"mean"``."""
    m = shipped("attn-only-2l").model
    toks = losses.repeated_tokens(m, 30, batch_size=2)
    rnd = _two_layer()
    rtoks = losses.repeated_tokens(rnd, 20, batch_size=2)
    pairs = [(l, h) for l in range(2) for h in range(4)]
    cases = [
        Case("attn-only-2l, head (0, 1), zero ablation", a := (m, toks, (0, 1), "zero"), others=other_heads(a, 2, pairs)),
        Case("attn-only-2l, head (1, 2), mean ablation", b := (m, toks, (1, 2), "mean"), others=other_heads(b, 2, pairs)),
        Case("a random 2-layer model, head (0, 3), mean ablation", (rnd, rtoks, (0, 3), "mean"), kind="random"),
    ]

    def clean(e, c):
        return losses.per_token_loss(c.args[0], c.args[1]).mean().item()

    def other_mode(e, c):
        m, t, h, mode = c.args
        return _ablated(m, t, h, "mean" if mode == "zero" else "zero")

    def increase(e, c):
        return e - losses.per_token_loss(c.args[0], c.args[1]).mean().item()

    def swapped(e, c):
        m, t, h, mode = c.args
        return _ablated(m, t, h[::-1], mode)

    def per_position_mean(e, c):
        m, t, h, mode = c.args
        if mode != "mean":
            return None
        _, cache = m.run_with_cache(t)
        mean = cache.head_out[h[0]][:, :, h[1]].mean(0)  # [pos, d_model]: still says where it is
        return losses.per_token_loss(m, t, ablate={h: mean}).mean().item()

    return run_check(
        fn,
        cases,
        _ablated,
        [
            Diagnosis("that is the other ablation: mode='zero' zeroes the output, 'mean' puts its mean in", other_mode),
            Diagnosis("return the ablated loss itself, not its increase over the clean loss", increase),
            Diagnosis("that is the clean loss, with no ablation: pass ablate={(layer, head): value} to the model",
                      clean),
            Diagnosis("you ablated the head with layer and head swapped: a head is (layer, head)", swapped),
            Diagnosis("you averaged over the batch only: average the output over positions too, to one [d_model] vector",
                      per_position_mean),
        ],
        name="ablated_loss",
        withheld=[losses.ablated_loss],
        atol=1e-3,
        returns=float,
        n_generated=8,
        generate=_draws.ablation_case,
    )


# ---- 6.5 the induction head's scores, by source ---------------------------------------------------
def _causal(x: Tensor) -> Tensor:
    n = x.shape[-1]
    return x[..., torch.ones(n, n, dtype=torch.bool).tril()]


def _any_layer(got, case, key: str, right: int) -> bool:
    """Whether ``got`` is qk_score_terms with ``key`` (the reading layer or the sources' layer) any
    layer but the ``right`` one, on the causal part."""
    return any(torch.allclose(_causal(got), _causal(_terms_variant(*case.args, **{key: layer})), atol=1e-3, rtol=1e-3)
               for layer in range(case.args[0].cfg.n_layers) if layer != right)


def _terms_variant(model, tokens, head, layer=1, src_layer=0, pos_first=False):
    """qk_score_terms with the usual slips: the reading head's weights from ``layer``, the heads'
    outputs from ``src_layer``, positions before the embedding (``pos_first``)."""
    _, cache = model.run_with_cache(tokens)
    n = tokens.shape[1]
    emb, pos = model.W_E[tokens], model.W_pos[:n].expand(tokens.shape[0], -1, -1)
    parts = [pos, emb] if pos_first else [emb, pos]
    parts += [cache.head_out[src_layer][:, :, a] for a in range(model.cfg.n_heads)]
    src = torch.stack(parts)
    blk = model.blocks[layer]
    q, k = src @ blk.W_Q[head], src @ blk.W_K[head]
    return einsum(q, k, "s b q d, t b k d -> s t b q k") / math.sqrt(model.cfg.d_head)


@guarded
def check_qk_score_terms(fn) -> bool:
    """``qk_score_terms(model, tokens, head) -> Tensor [q_source, k_source, batch, q, k]`` with the
    sources in the order embed, pos, 0.0, 0.1, ...; compared on the causal part only (the masked
    entries may hold anything: the scores, 0, -inf or NaN)."""
    m2, rnd = shipped("attn-only-2l").model, _two_layer()
    ra = (rnd, losses.repeated_tokens(rnd, 10, batch_size=2), 1)
    sa = (m2, losses.repeated_tokens(m2, 10, batch_size=2), 1)
    cases = [
        Case("a random 2-layer model, head 1.1", ra, kind="random", others=other_heads(ra, 2, 4, "head 1.{}")),
        Case("attn-only-2l, head 1.1", sa, others=other_heads(sa, 2, 4, "head 1.{}")),
    ]
    return run_check(
        fn,
        cases,
        qk_score_terms,
        [
            Diagnosis("the first axis is the query's source and the second the key's: yours are swapped",
                      lambda e, c: e.transpose(0, 1)),
            Diagnosis("divide each term by sqrt(d_head), as the model does",
                      lambda e, c: e * math.sqrt(c.args[0].cfg.d_head)),
            Diagnosis("divided by sqrt(d_model); the model divides by sqrt(d_head), the width of one head's queries",
                      lambda e, c: e * math.sqrt(c.args[0].cfg.d_head / c.args[0].cfg.d_model)
                      if c.args[0].cfg.d_model != c.args[0].cfg.d_head else None),
            Diagnosis("these are another layer's W_Q and W_K (model.blocks[0] or model.blocks[-1]?); the head is "
                      "layer 1's: model.blocks[1], whatever the model's depth",
                      applies=lambda g, e, c: _any_layer(g, c, "layer", 1)),
            Diagnosis("the head sources are another layer's outputs: what reaches layer 1 is written by layer 0, "
                      "cache.head_out[0], whatever the model's depth", applies=lambda g, e, c: _any_layer(g, c, "src_layer", 0)),
            Diagnosis("the sources are in the wrong order: embedding first, then positions, then heads 0.0, 0.1, ...",
                      lambda e, c: _terms_variant(*c.args, pos_first=True)),
        ],
        name="qk_score_terms",
        withheld=[qk_score_terms],
        canonical=_causal,
        atol=1e-3,
        rtol=1e-3,
        n_generated=8,
        generate=lambda draw: _draws.head_case(draw, (2, 3), "head 1.{}"),  # a third layer: blocks[1], not [-1]
    )


# ---- 6.6 the induction heads' OV circuit: does it copy? -------------------------------------------
@guarded
def check_copying_accuracy(fn) -> bool:
    """``copying_accuracy(model, heads) -> float``: top-1 "copies itself" of the summed OV circuit."""
    m2, rnd = shipped("attn-only-2l").model, _two_layer()
    cases = [
        Case("a random 2-layer model, heads 1.0 and 1.2", (rnd, [(1, 0), (1, 2)]), kind="random"),
        Case("attn-only-2l, heads 1.0, 1.1, 1.3", (m2, [(1, 0), (1, 1), (1, 3)])),
    ]

    def averaged(e, c):
        m, heads = c.args
        return sum(ov_copying_accuracy(m, [h]) for h in heads) / len(heads) if len(heads) > 1 else None

    def first_only(e, c):
        m, heads = c.args
        return ov_copying_accuracy(m, heads[:1]) if len(heads) > 1 else None

    def core_only(e, c):
        m, heads = c.args
        core = sum(m.blocks[l].W_V[h] @ m.blocks[l].W_O[h] for l, h in heads)
        return float((core.argmax(-1) == torch.arange(core.shape[0])).float().mean())

    def by_column(e, c):
        m, heads = c.args
        full = m.W_E @ sum(m.blocks[l].W_V[h] @ m.blocks[l].W_O[h] for l, h in heads) @ m.W_U
        return float((full.argmax(0) == torch.arange(m.cfg.d_vocab)).float().mean())

    return run_check(
        fn,
        cases,
        ov_copying_accuracy,
        [
            Diagnosis("you averaged each head's accuracy: sum the heads' OV circuits first, then take the argmax",
                      averaged),
            Diagnosis("that is the first head's accuracy alone: sum the OV circuits of all the heads given",
                      first_only),
            Diagnosis("you took the argmax down each column: a row is one source token, take the argmax along it",
                      by_column),
            Diagnosis("that is a count of tokens; return the fraction: divide by d_vocab",
                      lambda e, c: e * c.args[0].cfg.d_vocab),
            Diagnosis("you scored W_V W_O alone (d_model x d_model); the full OV circuit is W_E (Σ W_V W_O) W_U, "
                      "its rows the source tokens", core_only),
        ],
        name="copying_accuracy",
        withheld=[ov_copying_accuracy],
        atol=1e-6,
        returns=float,
        n_generated=_draws.MODEL_CASES,
        generate=_draws.head_sets,
    )

