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
from attncircuits.course.exercises._core import Case, Diagnosis, Draw, guarded, random_model, random_tokens, run_check, shipped
from attncircuits.models.parts import loss_fn
from attncircuits.models.transformer import Transformer

__all__ = ["check_attention_pattern", "check_head_output", "check_model_logits", "check_next_token_loss"]


def _text(n_windows: int = 2, n_pos: int = 24) -> torch.Tensor:
    return validation_windows(n_windows, n_pos)


# ---- typical mistakes, as variants of the right computation ------------------------------------
def _as(variant, message: str, **how) -> Diagnosis:
    """The mistake ``variant(*case.args, **how)`` makes, named by ``message``."""
    return Diagnosis(message, lambda e, c: variant(*c.args, **how))


_SCALES = {"sqrt d_head": lambda q: math.sqrt(q.shape[-1]), "d_head": lambda q: q.shape[-1],
           "sqrt pos": lambda q: math.sqrt(q.shape[-2]), "sqrt batch": lambda q: math.sqrt(q.shape[0])}


def _pattern(q, k, scale=True, mask=True, dim=-1, mask_after=False, diagonal=0, k_q=False):
    """The pattern, or a mistake in it: ``scale`` False (none) or one of ``_SCALES``, ``mask``
    False, the softmax over ``dim``, the mask after the softmax, the mask's ``diagonal`` (-1 hides
    each query's own key), ``k_q`` the scores ``k @ q^T``."""
    scores = k @ q.transpose(-1, -2) if k_q else q @ k.transpose(-1, -2)
    if scale:
        scores = scores / _SCALES["sqrt d_head" if scale is True else scale](q)
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril(diagonal)
    if mask and not mask_after:
        scores = scores.masked_fill(~causal, float("-inf"))
    pattern = scores.softmax(dim)
    return pattern * causal if mask_after else pattern


def head_variant(resid, W_pos, W_Q, W_K, W_V, W_O, positions=True, pos_in_values=False, pos_rows=0, qk_swapped=False,
                 plus_resid=False, **pattern_kw):
    """One head's output, or a mistake in it: no ``positions``, positions in the values too,
    ``pos_rows`` the first row of W_pos used (or "last": its last ``pos`` rows), W_Q and W_K
    ``qk_swapped``, the head's input added to its output (``plus_resid``); the rest as
    :func:`_pattern`."""
    n = resid.shape[1]
    x = resid + (W_pos[-n:] if pos_rows == "last" else W_pos[pos_rows: pos_rows + n]) if positions else resid
    q, k = (x @ W_K, x @ W_Q) if qk_swapped else (x @ W_Q, x @ W_K)
    out = _pattern(q, k, **pattern_kw) @ ((x if pos_in_values else resid) @ W_V) @ W_O
    return (x if pos_in_values else resid) + out if plus_resid else out


def _masked_diagonal(got, expected, case) -> bool:
    """Whether every row but the first (which then has no key left) is the pattern of a mask that
    hides each query's own key too (``tril(-1)``), whatever the first row holds (NaN after a
    softmax over only -inf, or uniform after a large negative fill)."""
    wrong = _pattern(*case.args, diagonal=-1)
    return got.shape == wrong.shape and bool(torch.allclose(got[..., 1:, :].float(), wrong[..., 1:, :], atol=1e-5))


_PATTERN_MISTAKES = [
    _as(_pattern, "the scores are not divided by sqrt(d_head)", scale=False),
    _as(_pattern, "the scores are divided by d_head; divide them by its square root, sqrt(d_head)", scale="d_head"),
    _as(_pattern, "the scores are divided by sqrt(pos), the number of positions (q.shape[1]); the scale is "
        "sqrt(d_head), the last axis (q.shape[-1])", scale="sqrt pos"),
    _as(_pattern, "the scores are divided by sqrt(batch) (q.shape[0]); the scale is sqrt(d_head), the last axis "
        "(q.shape[-1])", scale="sqrt batch"),
    _as(_pattern, "the scores are k @ q^T, the transpose of the scores: row i must hold query i's scores against "
        "every key, q @ k.transpose(-1, -2)", k_q=True),
    Diagnosis("the mask hides each query's own key too (tril(-1)); a query attends to keys at or before it, so "
              "keep the diagonal: tril() with no offset", applies=_masked_diagonal),
    _as(_pattern, "the mask lets each query see the next key too (tril(1)); a query attends to keys at or before "
        "it: tril() with no offset", diagonal=1),
    _as(_pattern, "the causal mask is missing: queries see later keys", mask=False),
    Diagnosis("these are the scores; the pattern is their softmax over the keys, after the causal mask",
              lambda e, c: c.args[0] @ c.args[1].transpose(-1, -2) / math.sqrt(c.args[0].shape[-1])),
    Diagnosis("queries attend to later keys: the causal mask is missing (set scores above the diagonal to -inf)",
              applies=lambda got, e, c: bool((got.detach().float().triu(1).abs() > 1e-6).any())),
    _as(_pattern, "the softmax runs over the query axis; each row (one query) must sum to 1 over keys", dim=-2),
    _as(_pattern, "the mask is applied after the softmax, so rows do not sum to 1; set the future scores to -inf "
        "before it", mask_after=True),
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


def _attention_pattern(q, k):  # the reference, in the stub's names (so are the others)
    return _pattern(q, k)


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
    return run_check(attention_pattern, cases, _attention_pattern, _PATTERN_MISTAKES, atol=1e-5,
                     generate=_qk_case, axes=("batch", "query", "key"))


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


def _head_output(resid, W_pos, W_Q, W_K, W_V, W_O):
    return head_variant(resid, W_pos, W_Q, W_K, W_V, W_O)


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
        _as(head_variant, "the softmax runs over the query axis, not over keys", dim=-2),
        Diagnosis("this is resid plus the head's output; return only what the head writes (the caller adds it to "
                  "the residual stream)", lambda e, c: c.args[0] + e),
        _as(head_variant, "this is resid + W_pos plus the head's output; return only what the head writes, "
            "pattern @ values @ W_O", plus_resid=True, pos_in_values=True),
        Diagnosis("the head's output has W_pos added; the head writes only pattern @ values @ W_O (positions enter "
                  "the queries and keys)", lambda e, c: e + c.args[1][: c.args[0].shape[1]]),
        _as(head_variant, "W_pos is offset by one: position i used row i + 1; take its first pos rows, W_pos[:pos]",
            pos_rows=1),
        _as(head_variant, "these are W_pos's last pos rows; position i is row i: take W_pos[:pos]", pos_rows="last"),
        _as(head_variant, "W_Q and W_K are swapped (or the scores are k @ q^T): the queries are x @ W_Q, the keys "
            "x @ W_K", qk_swapped=True),
        _as(head_variant, "the scores are divided by d_head; divide them by its square root, sqrt(d_head)",
            scale="d_head"),
    ]
    return run_check(head_output, cases, _head_output, mistakes, atol=1e-4, rtol=1e-3,
                     generate=_head_weights, axes=("batch", "pos", "d_model"))


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
        _as(variant, "positions reach the values too; in this model W_pos enters only the queries and keys",
            pos_in_values=True),
        _as(variant, "W_pos is missing: add it to the query and key inputs", positions=False),
        _as(variant, "the scores are not divided by sqrt(d_head)", scale=False),
        _as(variant, "the causal mask is missing: queries see later keys", mask=False),
    ]


# ---- Exercise 1.3 --------------------------------------------------------------------------------
def _logits_variant(model, tokens, heads=True, within_layer=False, skip=True, pos_in_stream=False, pos_in_heads=True,
                    reads="resid", final="resid", W_U=None):
    """The logits, or a mistake in them: no ``heads``; each head reading the stream its layer's
    earlier heads already wrote to (``within_layer``); no ``skip`` connection (each layer's heads
    replace the stream); W_pos added to the stream (``pos_in_stream``; ``pos_in_heads`` False:
    and not to the queries and keys); every layer ``reads`` "embedding"; the ``final`` stream
    "heads" only (no embedding), or the embedding plus the "last" layer's or "every" layer's
    heads; another unembedding ``W_U``."""
    emb = model.W_E[tokens] + (model.W_pos[: tokens.shape[1]] if pos_in_stream else 0)
    W_pos = model.W_pos if pos_in_heads else torch.zeros_like(model.W_pos)
    resid, outs = emb, []
    for block in model.blocks if heads else ():
        read = emb if reads == "embedding" else resid
        new = read
        for h in range(model.cfg.n_heads):
            new = new + head_variant(new if within_layer else read, W_pos, block.W_Q[h], block.W_K[h], block.W_V[h],
                                     block.W_O[h])
        outs.append(new - read)
        resid = new if skip else new - read
    if outs and final != "resid":
        resid = {"heads": sum(outs), "last": emb + outs[-1], "every": emb + sum(outs)}[final]
    return resid @ (model.W_U if W_U is None else W_U)


def _model_logits(model, tokens):
    return model(tokens)


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
    stream = ("W_pos was added to the residual stream; in this model positions enter only each head's queries and "
              "keys ({}), never the stream")
    mistakes = [
        _as(_logits_variant, "the heads are missing: each layer adds the outputs of all its heads to the residual "
            "stream", heads=False),
        Diagnosis("these are probabilities (a softmax of the logits); return the logits themselves, resid @ W_U",
                  lambda e, c: e.softmax(-1)),
        Diagnosis("these are log-probabilities (a log_softmax of the logits); return the logits themselves, "
                  "resid @ W_U", lambda e, c: e.log_softmax(-1)),
        Diagnosis("the unembedding is W_E.T; this model's unembedding is its own matrix, model.W_U",
                  lambda e, c: _logits_variant(*c.args, W_U=c.args[0].W_E.T)),
        _as(_logits_variant, "the embedding is missing from the final residual stream: it is W_E[tokens] plus every "
            "head's output", final="heads"),
        _as(_logits_variant, "each layer's heads replace the residual stream; add them to it (resid = resid + "
            "heads), so the embedding and every earlier layer's output stay in it", skip=False),
        _as(_logits_variant, "every layer read the embedding; layer 1 must read the embedding plus what layer 0 "
            "wrote", reads="embedding", final="every"),
        _as(_logits_variant, "only the last layer's heads reach the logits: each layer must add its heads' outputs "
            "to resid (resid = resid + ...), and the next layer read that", reads="embedding", final="last"),
        _as(_logits_variant, "a head read the residual stream after earlier heads of its own layer had written to "
            "it; every head of a layer reads the stream from before that layer (add their outputs together after)",
            within_layer=True),
        _as(_logits_variant, stream.format("head_output adds them"), pos_in_stream=True),
        _as(_logits_variant, stream.format("resid + W_pos[:pos] as their input"), pos_in_stream=True,
            pos_in_heads=False),
    ]
    return run_check(model_logits, cases, _model_logits, mistakes, atol=1e-3, rtol=1e-3, n_generated=_draws.MODEL_CASES,
                     generate=lambda draw: _draws.model_tokens(draw, n_layers=(0, 3)), axes=("batch", "pos", "token"),
                     withheld=[(Transformer, "forward"), (Transformer, "forward_checked")])


# ---- Exercise 1.4 --------------------------------------------------------------------------------
def _nll(logits, tokens, shift=1, dim=-1, log=True):
    """Each scored position's -log p of its target, ``[batch, scored]``: position i against token
    i + ``shift`` (0: its own; -1: the one before), the log_softmax over ``dim`` (unless ``log``
    is False: the raw logits)."""
    lp = logits.log_softmax(dim) if log else logits
    if shift == 1:
        lp, target = lp[:, :-1], tokens[:, 1:]
    elif shift == -1:
        lp, target = lp[:, 1:], tokens[:, :-1]
    else:
        target = tokens
    return -lp.gather(-1, target[..., None])[..., 0]


def _loss_variant(logits, tokens, shift=1, reduce="mean", log=True, dim=-1, last=0, roll=None):
    """The loss, or a mistake in it: as :func:`_nll`, reduced by the mean, the "sum", the "sum over
    positions" or the "sum over the batch"; the ``last`` positions only; the targets ``roll``-ed
    (along "positions" or "flat"), every position scored."""
    if roll:
        tokens = tokens.roll(-1, dims=1) if roll == "positions" else tokens.roll(-1)
        shift = 0
    elif last:
        logits, tokens = logits[:, -last:], tokens[:, -last:]
    nll = _nll(logits, tokens, shift, dim, log)
    return float({"mean": nll.mean(), "sum": nll.sum(), "sum over positions": nll.sum(1).mean(),
                  "sum over the batch": nll.mean(1).sum()}[reduce])


def _smoothed(got, expected, case) -> bool:
    """Whether ``got`` is the loss with label smoothing ``eps`` for a round ``eps`` (a multiple of
    0.01 below 1): ``(1 - eps) * nll + eps * (the mean over the vocabulary of -log p)``."""
    logits, tokens = case.args
    nll, uniform = float(_nll(logits, tokens).mean()), float(-logits[:, :-1].log_softmax(-1).mean())
    if abs(uniform - nll) < 1e-3:
        return False
    eps = (float(got) - nll) / (uniform - nll)
    return 0.005 < eps < 1 and abs(100 * eps - round(100 * eps)) < 1e-2


def _next_token_loss(logits, tokens):
    return float(loss_fn(logits, tokens))


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
    roll = ("torch.roll wraps around: the last position was scored against the first token; drop it instead, "
            "pairing logits[:, :-1] with tokens[:, 1:]")
    over = "the log_softmax ran over the {} (dim={}); it runs over the vocabulary, the last axis (dim=-1)"
    mistakes = [
        _as(_loss_variant, "each position's logits are scored against its own token; they predict the NEXT one "
            "(drop the last position's logits and the first token)", shift=0),
        _as(_loss_variant, "shifted the wrong way: logits[:, 1:] are scored against tokens[:, :-1]", shift=-1),
        _as(_loss_variant, roll, roll="positions"),
        _as(_loss_variant, roll, roll="flat"),
        _as(_loss_variant, "this is the sum over positions; take the mean", reduce="sum"),
        _as(_loss_variant, "this is the sum over positions (averaged over the batch); take the mean over positions "
            "too", reduce="sum over positions"),
        _as(_loss_variant, "this is the sum over the batch (averaged over positions); take the mean over the batch "
            "too", reduce="sum over the batch"),
        _as(_loss_variant, "the raw logits were used as log-probabilities; apply log_softmax over the vocabulary "
            "first", log=False),
        _as(_loss_variant, over.format("positions", 1), dim=1),
        Diagnosis(over.format("positions", 1), lambda e, c: _loss_variant(c.args[0][:, :-1], c.args[1][:, 1:], shift=0,
                                                                          dim=1)),
        _as(_loss_variant, over.format("batch", 0), dim=0),
        _as(_loss_variant, "only the last prediction (logits[:, -2] against tokens[:, -1]) was scored; take the mean "
            "over every position that has a next token", last=2),
        _as(_loss_variant, "only the last position was scored, against its own token; score every position but the "
            "last against the token after it", last=1, shift=0),
        Diagnosis("this loss has label smoothing (cross_entropy's label_smoothing); the loss asked is the plain "
                  "cross-entropy, -log p of the next token", applies=_smoothed),
    ]
    return run_check(next_token_loss, cases, _next_token_loss, mistakes, atol=1e-4, rtol=1e-4,
                     generate=_logits_case, withheld=[loss_fn])


def _logits_case(draw: Draw):
    """logits ``[batch, pos, d_vocab]`` and tokens; edges: one target (pos 2), every token the last
    id, all-zero logits, logits 8 times larger, the shipped sizes (128 positions, 2048 tokens)."""
    edge = draw.edge(5)
    b, n, v = ((1, 2, 3), (2, 5, 2), (1, 3, 7), (3, 4, 5), (1, 128, 2048))[edge] if edge is not None else (
        draw.int(1, 3), draw.int(2, 10), draw.int(2, 20))
    logits = draw.randn(b, n, v, scale=8.0 if edge == 3 else 2.0) * (edge != 2)
    tokens = torch.full((b, n), v - 1) if edge == 1 else torch.randint(0, v, (b, n), generator=draw.gen)
    return logits, tokens
