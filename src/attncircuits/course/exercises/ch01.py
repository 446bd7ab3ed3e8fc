"""Checks for chapter 1, the attention-only transformer: one head's pattern and output, the
logits of a whole model, and the next-token loss.

The references are the model's own forward pass (its :class:`~attncircuits.models.transformer.ActivationCache`)
and :func:`~attncircuits.models.transformer.loss_fn`.
"""

from __future__ import annotations

import math

import torch

from attncircuits.checkpoints.pretrained import validation_windows
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises._core import (
    Case,
    Diagnosis,
    Draw,
    guarded,
    random_model,
    random_tokens,
    run_check,
    shipped,
)
from attncircuits.models.parts import loss_fn

__all__ = ["check_attention_pattern", "check_head_output", "check_model_logits", "check_next_token_loss"]


def _text(n_windows: int = 2, n_pos: int = 24) -> torch.Tensor:
    return validation_windows(n_windows, n_pos)


# ---- typical mistakes, as variants of the right computation ------------------------------------
def _pattern(q, k, scale=True, mask=True, dim=-1, mask_after=False):
    scores = q @ k.transpose(-1, -2)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    if mask and not mask_after:
        scores = scores.masked_fill(~causal, float("-inf"))
    pattern = scores.softmax(dim)
    return pattern * causal if mask_after else pattern


def head_variant(resid, W_pos, W_Q, W_K, W_V, W_O, positions=True, pos_in_values=False, **pattern_kw):
    x = resid + W_pos[: resid.shape[1]] if positions else resid
    pattern = _pattern(x @ W_Q, x @ W_K, **pattern_kw)
    v = (x if pos_in_values else resid) @ W_V
    return pattern @ v @ W_O


_PATTERN_MISTAKES = [
    Diagnosis("the scores are not divided by sqrt(d_head)", lambda e, c: _pattern(*c.args, scale=False)),
    Diagnosis("the causal mask is missing: queries see later keys", lambda e, c: _pattern(*c.args, mask=False)),
    Diagnosis("these are the scores; the pattern is their softmax over the keys, after the causal mask",
              lambda e, c: c.args[0] @ c.args[1].transpose(-1, -2) / math.sqrt(c.args[0].shape[-1])),
    Diagnosis(
        "queries attend to later keys: the causal mask is missing (set scores above the diagonal to -inf)",
        applies=lambda got, e, c: bool((got.detach().float().triu(1).abs() > 1e-6).any()),
    ),
    Diagnosis(
        "the softmax runs over the query axis; each row (one query) must sum to 1 over keys",
        lambda e, c: _pattern(*c.args, dim=-2),
    ),
    Diagnosis(
        "the mask is applied after the softmax, so rows do not sum to 1; set the future scores to "
        "-inf before it",
        lambda e, c: _pattern(*c.args, mask_after=True),
    ),
]


# ---- Exercise 1.1 --------------------------------------------------------------------------------
def _pattern_case(name_or_model, layer: int, head: int, label: str, kind: str, tokens=None) -> Case:
    model = shipped(name_or_model).model if isinstance(name_or_model, str) else name_or_model
    tokens = _text() if tokens is None else tokens
    _, cache = model.run_with_cache(tokens)
    x = cache.resid[layer] + model.W_pos[: tokens.shape[1]]
    with torch.no_grad():
        q, k = x @ model.W_Q[layer, head], x @ model.W_K[layer, head]
    return Case(label, (q, k), kind=kind, expected=cache.pattern[layer][:, head])


@guarded
def check_attention_pattern(attention_pattern) -> bool:
    """``attention_pattern(q, k)``: ``[batch, pos, d_head]`` twice -> ``[batch, q_pos, k_pos]``,
    against the patterns in the model's cache."""
    rnd = random_model(n_layers=2, seed=1)
    zeros = torch.zeros(1, 6, 8)
    uniform = torch.ones(6, 6).tril() / torch.arange(1, 7)[:, None]
    cases = [
        _pattern_case("attn-only-1l", 0, 0, "attn-only-1l head 0.0", "shipped"),
        _pattern_case("attn-only-2l", 1, 2, "attn-only-2l head 1.2", "shipped"),
        _pattern_case(rnd, 1, 3, "a random model", "random", random_tokens(64, (2, 10), seed=2)),
        Case("zero queries", (zeros, torch.randn(1, 6, 8)), kind="hand-built", expected=uniform[None]),
    ]
    return run_check(attention_pattern, cases, lambda q, k: _pattern(q, k), _PATTERN_MISTAKES, atol=1e-5,
                     generate=_qk_case)


def _qk_case(draw: Draw):
    """q, k ``[batch, pos, d_head]``; edges: one position, d_head 1, the last query's largest score
    on the last key, every key equal (ties), batch 1 of the whole shipped context (128 x 32)."""
    edge = draw.edge(5)
    b, n, d = ((1, 1, 4), (2, 5, 1), (1, 6, 3), (2, 4, 2), (1, 128, 32))[edge] if edge is not None else (
        draw.int(1, 2), draw.int(1, 8), draw.int(1, 16))
    q, k = draw.randn(b, n, d), draw.randn(b, n, d)
    note = ""
    if edge == 2:
        k[:, -1] = 3 * q[:, -1]
        note = "the last query's largest score is on the last key"
    elif edge == 3:
        k[:] = k[:, :1].clone()
        note = "every key is the same"
    return Case(note, (q, k))


# ---- Exercise 1.2 --------------------------------------------------------------------------------
def _head_case(name_or_model, layer: int, head: int, label: str, kind: str, tokens=None) -> Case:
    model = shipped(name_or_model).model if isinstance(name_or_model, str) else name_or_model
    tokens = _text() if tokens is None else tokens
    _, cache = model.run_with_cache(tokens)
    b = model.blocks[layer]
    with torch.no_grad():
        weights = (b.W_Q[head], b.W_K[head], b.W_V[head], b.W_O[head])
        args = (cache.resid[layer], model.W_pos) + tuple(w.detach().clone() for w in weights)
    return Case(label, args, kind=kind, expected=cache.head_out[layer][:, :, head])


@guarded
def check_head_output(head_output) -> bool:
    """``head_output(resid, W_pos, W_Q, W_K, W_V, W_O)`` -> ``[batch, pos, d_model]``, against the
    head's output in the model's cache (layer 0 and layer 1 heads, shipped and random)."""
    rnd = random_model(n_layers=2, seed=3)
    cases = [
        _head_case("attn-only-1l", 0, 1, "attn-only-1l head 0.1", "shipped"),
        _head_case("attn-only-2l", 1, 0, "attn-only-2l head 1.0", "shipped"),
        _head_case(rnd, 1, 2, "a random model", "random", random_tokens(64, (2, 12), seed=4)),
    ]
    mistakes = head_mistakes(head_variant) + [
        Diagnosis("the softmax runs over the query axis, not over keys", lambda e, c: head_variant(*c.args, dim=-2)),
    ]
    return run_check(head_output, cases, lambda *a: head_variant(*a), mistakes, atol=1e-4, rtol=1e-3,
                     generate=_head_weights)


def _head_weights(draw: Draw):
    """resid ``[batch, pos, d_model]``, W_pos ``[n_ctx, d_model]`` and one head's weights; edges:
    one position, d_head 1, pos equal to n_ctx (every row of W_pos), batch 1 at the shipped sizes."""
    edge = draw.edge(4)
    b, n, ctx, dm, dh = ((1, 1, 4, 4, 2), (2, 5, 5, 6, 1), (1, 3, 8, 8, 4), (1, 128, 128, 128, 32))[edge] if (
        edge is not None) else (draw.int(1, 2), draw.int(1, 8), 8, 2 * draw.int(1, 6), draw.int(1, 8))
    s = dm**-0.5
    return (draw.randn(b, n, dm), draw.randn(ctx, dm), draw.randn(dm, dh, scale=s), draw.randn(dm, dh, scale=s),
            draw.randn(dm, dh, scale=s), draw.randn(dh, dm, scale=s))


def head_mistakes(variant) -> list[Diagnosis]:
    """The usual mistakes in one head's forward pass, each computed by ``variant(*case.args, **how)``
    (``head_variant``'s keywords): chapter 1's head output and chapter 3's head term share them."""
    return [
        Diagnosis(
            "positions reach the values too; in this model W_pos enters only the queries and keys",
            lambda e, c: variant(*c.args, pos_in_values=True),
        ),
        Diagnosis("W_pos is missing: add it to the query and key inputs", lambda e, c: variant(*c.args, positions=False)),
        Diagnosis("the scores are not divided by sqrt(d_head)", lambda e, c: variant(*c.args, scale=False)),
        Diagnosis("the causal mask is missing: queries see later keys", lambda e, c: variant(*c.args, mask=False)),
    ]


# ---- Exercise 1.3 --------------------------------------------------------------------------------
def _logits_without_residual(model, tokens):
    resid = model.W_E[tokens]
    outs = []
    for block in model.blocks:
        out = _head_sum(model, block, resid)
        outs.append(out)
        resid = resid + out
    return (sum(outs) if outs else resid) @ model.W_U


def _head_sum(model, block, resid):
    return sum(head_variant(resid, model.W_pos, block.W_Q[h], block.W_K[h], block.W_V[h], block.W_O[h])
               for h in range(model.cfg.n_heads))


def _logits_every_layer_reads_embedding(model, tokens):
    emb = model.W_E[tokens]
    return (emb + sum(_head_sum(model, b, emb) for b in model.blocks)) @ model.W_U


@guarded
def check_model_logits(model_logits) -> bool:
    """``model_logits(model, tokens)`` -> ``[batch, pos, d_vocab]``, against the forward pass."""
    text = _text(2, 20)
    rnd_tokens = random_tokens(64, (2, 12), seed=5)
    cases = [
        Case("attn-only-0l", (shipped("attn-only-0l").model, text)),
        Case("attn-only-1l", (shipped("attn-only-1l").model, text)),
        Case("attn-only-2l", (shipped("attn-only-2l").model, text)),
        Case("a random 2-layer model", (random_model(n_layers=2, seed=6), rnd_tokens), kind="random"),
    ]
    mistakes = [
        Diagnosis(
            "the heads are missing: each layer adds the outputs of all its heads to the residual stream",
            lambda e, c: c.args[0].W_E[c.args[1]] @ c.args[0].W_U if c.args[0].cfg.n_layers else None,
        ),
        Diagnosis(
            "the embedding is missing from the final residual stream: it is W_E[tokens] plus every "
            "head's output",
            lambda e, c: _logits_without_residual(*c.args) if c.args[0].cfg.n_layers else None,
        ),
        Diagnosis(
            "every layer read the embedding; layer 1 must read the embedding plus what layer 0 wrote",
            lambda e, c: _logits_every_layer_reads_embedding(*c.args),
        ),
    ]
    return run_check(model_logits, cases, lambda m, t: m(t), mistakes, atol=1e-3, rtol=1e-3, n_generated=_draws.MODEL_CASES,
                     generate=lambda draw: _draws.model_tokens(draw, n_layers=(0, 3)))


# ---- Exercise 1.4 --------------------------------------------------------------------------------
def _loss_variant(logits, tokens, shift=1, reduce="mean", log=True):
    lp = logits.log_softmax(-1) if log else logits
    if shift == 1:
        lp, target = lp[:, :-1], tokens[:, 1:]
    elif shift == -1:
        lp, target = lp[:, 1:], tokens[:, :-1]
    else:
        target = tokens
    nll = -lp.gather(-1, target[..., None])[..., 0]
    return float(nll.sum() if reduce == "sum" else nll.mean())


@guarded
def check_next_token_loss(next_token_loss) -> bool:
    """``next_token_loss(logits, tokens)`` -> the mean next-token cross-entropy in nats (a float or
    a 0-dimensional tensor), against :func:`attncircuits.loss_fn`."""
    text = _text(2, 32)
    with torch.no_grad():
        logits2 = shipped("attn-only-2l").model(text)
    gen = torch.Generator().manual_seed(7)
    rnd_logits, rnd_tokens = torch.randn(3, 9, 50, generator=gen), random_tokens(50, (3, 9), seed=8)
    cases = [
        Case("attn-only-2l on text", (logits2, text)),
        Case("random logits", (rnd_logits, rnd_tokens), kind="random"),
        Case("all-zero logits (the loss is ln d_vocab)", (torch.zeros(1, 5, 50), rnd_tokens[:1, :5]), kind="hand-built"),
    ]
    mistakes = [
        Diagnosis(
            "each position's logits are scored against its own token; they predict the NEXT one "
            "(drop the last position's logits and the first token)",
            lambda e, c: _loss_variant(*c.args, shift=0),
        ),
        Diagnosis(
            "shifted the wrong way: logits[:, 1:] are scored against tokens[:, :-1]",
            lambda e, c: _loss_variant(*c.args, shift=-1),
        ),
        Diagnosis("this is the sum over positions; take the mean", lambda e, c: _loss_variant(*c.args, reduce="sum")),
        Diagnosis(
            "the raw logits were used as log-probabilities; apply log_softmax over the vocabulary first",
            lambda e, c: _loss_variant(*c.args, log=False),
        ),
    ]
    return run_check(next_token_loss, cases, lambda lg, t: float(loss_fn(lg, t)), mistakes, atol=1e-4, rtol=1e-4,
                     generate=_logits_case)


def _logits_case(draw: Draw):
    """logits ``[batch, pos, d_vocab]`` and tokens; edges: one target (pos 2), every token the last
    id, all-zero logits, logits 8 times larger, the shipped sizes (128 positions, 2048 tokens)."""
    edge = draw.edge(5)
    b, n, v = ((1, 2, 3), (2, 5, 2), (1, 3, 7), (3, 4, 5), (1, 128, 2048))[edge] if edge is not None else (
        draw.int(1, 3), draw.int(2, 10), draw.int(2, 20))
    logits = draw.randn(b, n, v, scale=8.0 if edge == 3 else 2.0) * (edge != 2)
    tokens = torch.full((b, n), v - 1) if edge == 1 else torch.randint(0, v, (b, n), generator=draw.gen)
    return logits, tokens
