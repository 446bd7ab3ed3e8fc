"""Checks for chapter 3, one layer: the terms of the path expansion, their sum, the full OV and QK
circuits as two factors, and the positional head found from ``W_pos`` alone.

The references are :func:`~attncircuits.analysis.circuits.path_expansion`,
:func:`~attncircuits.analysis.circuits.full_ov_circuit`, :func:`~attncircuits.analysis.circuits.full_qk_circuit`,
:func:`~attncircuits.analysis.circuits.positional_attention` and
:func:`~attncircuits.analysis.circuits.mean_attention_by_offset`. While the learner's function runs, the package's
own answers are withheld: ``path_expansion`` for the path terms, the full circuits (and the factored helpers
they wrap) for the factors.
"""

from __future__ import annotations

import functools
import math

import torch

from attncircuits.analysis.circuits.factored import (
    full_ov_circuit,
    full_qk_circuit,
    mean_attention_by_offset,
    ov_factors,
    positional_attention,
    qk_circuit_parts,
    qk_factors,
)
from attncircuits.analysis.circuits.paths import path_expansion
from attncircuits.checkpoints.pretrained import validation_windows
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises._core import (
    Case,
    Diagnosis,
    Draw,
    guarded,
    other_heads,
    random_model,
    random_tokens,
    run_check,
    shipped,
)
from attncircuits.course.exercises.ch01 import head_mistakes, head_variant

__all__ = [
    "check_direct_path_logits",
    "check_head_logit_term",
    "check_logits_from_paths",
    "check_ov_circuit_factors",
    "check_qk_circuit_factors",
    "check_positional_head",
]


def _text_cases() -> list[Case]:
    return [
        Case("attn-only-1l", (shipped("attn-only-1l").model, validation_windows(2, 24))),
        Case("a random 1-layer model", (random_model(n_layers=1, seed=1), random_tokens(64, (2, 12), seed=2)), kind="random"),
    ]


# ---- Exercise 3.1 --------------------------------------------------------------------------------
@guarded
def check_direct_path_logits(direct_path_logits) -> bool:
    """``direct_path_logits(model, tokens)`` -> ``W_E[tokens] @ W_U``, ``[batch, pos, d_vocab]``."""
    mistakes = [
        Diagnosis(
            "W_pos was added; positions never enter the residual stream in this model, only queries and keys",
            lambda e, c: (c.args[0].W_E[c.args[1]] + c.args[0].W_pos[: c.args[1].shape[1]]) @ c.args[0].W_U,
        ),
    ]
    return run_check(direct_path_logits, _text_cases(), lambda m, t: path_expansion(m, t).direct, mistakes, atol=1e-4,
                     n_generated=_draws.MODEL_CASES, generate=_draws.model_tokens, withheld=[path_expansion])


# ---- Exercise 3.2 --------------------------------------------------------------------------------
def _head_term(model, tokens, head, layer=0, **kw):
    b = model.blocks[layer]
    out = head_variant(model.W_E[tokens], model.W_pos, b.W_Q[head], b.W_K[head], b.W_V[head], b.W_O[head], **kw)
    return out @ model.W_U


def _last_layer(model) -> int | None:
    """The last layer when it is not layer 0 (else None: the mistake of reading it changes nothing)."""
    return model.cfg.n_layers - 1 if model.cfg.n_layers > 1 else None


_LAST_LAYER = ("these are the weights of the model's last layer (model.blocks[-1]); head 0.head is in layer 0: "
               "model.blocks[0]")


@guarded
def check_head_logit_term(head_logit_term) -> bool:
    """``head_logit_term(model, tokens, head)`` -> head ``0.head``'s term of the logits,
    ``[batch, pos, d_vocab]``."""
    mistakes = head_mistakes(_head_term) + [
        Diagnosis(
            "this is the head's output in the residual stream; multiply by W_U to get logits",
            applies=lambda g, e, c: torch.allclose(g @ c.args[0].W_U, e, atol=1e-4, rtol=1e-3),
        ),
        Diagnosis(_LAST_LAYER, lambda e, c: None if _last_layer(c.args[0]) is None else _head_term(
            *c.args, layer=_last_layer(c.args[0]))),
    ]
    text, m1, m2 = validation_windows(2, 24), shipped("attn-only-1l").model, shipped("attn-only-2l").model
    rnd = (random_model(n_layers=1, seed=1), random_tokens(64, (2, 12), seed=2), 2)
    cases = [
        Case("attn-only-1l head 0.1", (m1, text, 1), others=other_heads((m1, text, 1), 2, 4)),
        Case("attn-only-1l head 0.3", (m1, text, 3), others=other_heads((m1, text, 3), 2, 4)),
        Case("a random model", rnd, kind="random", others=other_heads(rnd, 2, 4)),
        # a second layer: model.blocks[-1] is not head 0.h's layer there (path_expansion's heads are layer 0's)
        Case("attn-only-2l head 0.2", (m2, text, 2), others=other_heads((m2, text, 2), 2, 4)),
    ]
    return run_check(
        head_logit_term, cases, lambda m, t, h: path_expansion(m, t).heads[:, :, h], mistakes, atol=1e-4, rtol=1e-3,
        n_generated=_draws.MODEL_CASES, generate=lambda draw: _draws.head_case(draw, (1, 2)), withheld=[path_expansion],
    )


# ---- Exercise 3.3 --------------------------------------------------------------------------------
@guarded
def check_logits_from_paths(logits_from_paths) -> bool:
    """``logits_from_paths(model, tokens)`` -> the direct path plus every head's term,
    ``[batch, pos, d_vocab]``: the forward pass, rebuilt from the weights."""
    mistakes = [
        Diagnosis(
            "the direct path is missing: add W_E[tokens] @ W_U to the heads' terms",
            lambda e, c: path_expansion(*c.args).heads.sum(2),
        ),
        Diagnosis(
            "only the direct path: add every head's term", lambda e, c: path_expansion(*c.args).direct
        ),
        Diagnosis(
            "the heads' terms are averaged (their mean); each head adds its whole term, so sum them",
            lambda e, c: (lambda x: x.direct + x.heads.mean(2))(path_expansion(*c.args)),
        ),
        Diagnosis(
            "one head only: sum the terms of all heads",
            applies=lambda g, e, c: any(
                torch.allclose(g, (x := path_expansion(*c.args)).direct + x.heads[:, :, h], atol=1e-3)
                for h in range(c.args[0].cfg.n_heads)
            ),
        ),
    ]
    cases = _text_cases() + [Case("another random model", (random_model(1, seed=9, n_heads=2, d_head=16), random_tokens(64, (1, 16), seed=3)), kind="random")]
    return run_check(logits_from_paths, cases, lambda m, t: m(t), mistakes, atol=1e-3, rtol=1e-3, n_generated=_draws.MODEL_CASES,
                     generate=_draws.model_tokens, withheld=[path_expansion])


# ---- Exercises 3.4 and 3.5 -----------------------------------------------------------------------
def _factor_cases() -> list[Case]:
    m1, rnd, m2 = shipped("attn-only-1l").model, random_model(n_layers=1, seed=4), shipped("attn-only-2l").model
    return [
        Case("attn-only-1l head 0.0", (m1, 0), others=other_heads((m1, 0), 1, 4)),
        Case("attn-only-1l head 0.2", (m1, 2), others=other_heads((m1, 2), 1, 4)),
        Case("a random model", (rnd, 1), kind="random", others=other_heads((rnd, 1), 1, 4)),
        Case("attn-only-2l head 0.3 (a second layer: head 0.3 is model.blocks[0]'s)", (m2, 3),
             others=other_heads((m2, 3), 1, 4)),
    ]


def _product(factors):
    A, B = factors
    return A @ B


def _model_head(draw: Draw) -> Case:
    """A model of one or two layers and a head of layer 0 (the first and the last at the edges; one
    head of width 1)."""
    edge = draw.edge(4)
    m = _draws.model(draw, (1, 2), edge=edge)
    args = (m, _draws.head(draw, m.cfg.n_heads, edge))
    return Case("", args, others=other_heads(args, 1, m.cfg.n_heads))


@guarded
def check_ov_circuit_factors(ov_circuit_factors) -> bool:
    """``ov_circuit_factors(model, head)`` -> ``(A [d_vocab, d_head], B [d_head, d_vocab])`` with
    ``A @ B = W_E W_V W_O W_U`` for head ``0.head`` (the factors are compared by their product)."""

    def with_w(name, last=False):
        def wrong(e, c):
            model, h = c.args
            if last and _last_layer(model) is None:
                return None
            b = model.blocks[_last_layer(model) if last else 0]
            return (model.W_E @ getattr(b, name)[h], b.W_O[h] @ model.W_U)

        return wrong

    mistakes = [
        Diagnosis("used W_Q: the OV circuit reads the values, W_V", with_w("W_Q")),
        Diagnosis("used W_K: the OV circuit reads the values, W_V", with_w("W_K")),
        Diagnosis(_LAST_LAYER, with_w("W_V", last=True)),
    ]

    def reference(model, head):
        ov = full_ov_circuit(model, 0, head)
        return ov.A, ov.B

    return run_check(ov_circuit_factors, _factor_cases(), reference, mistakes, canonical=_product, atol=1e-3, rtol=1e-3,
                     n_generated=_draws.MODEL_CASES, generate=_model_head, withheld=[full_ov_circuit, ov_factors])


@guarded
def check_qk_circuit_factors(qk_circuit_factors) -> bool:
    """``qk_circuit_factors(model, head)`` -> ``(A [d_vocab, d_head], B [d_head, d_vocab])`` with
    ``A @ B = W_E W_Q (W_E W_K)^T / sqrt(d_head)`` (row: query token, column: key token)."""
    mistakes = [
        Diagnosis(
            "the 1/sqrt(d_head) scale is missing: the circuit holds the scores the softmax sees",
            lambda e, c: (e[0] * math.sqrt(c.args[0].cfg.d_head), e[1]),
        ),
        Diagnosis(
            "queries and keys are swapped: rows are query (destination) tokens, columns key tokens",
            lambda e, c: (e[1].T, e[0].T),
        ),
        Diagnosis(_LAST_LAYER, lambda e, c: None if _last_layer(c.args[0]) is None else (
            lambda qk: (qk.A, qk.B))(full_qk_circuit(c.args[0], _last_layer(c.args[0]), c.args[1]))),
        Diagnosis(
            "divided by sqrt(d_model); the scale is sqrt(d_head), the width of one head's queries and keys",
            lambda e, c: (e[0] * math.sqrt(c.args[0].cfg.d_head / c.args[0].cfg.d_model), e[1])
            if c.args[0].cfg.d_model != c.args[0].cfg.d_head else None,
        ),
    ]

    def reference(model, head):
        qk = full_qk_circuit(model, 0, head)
        return qk.A, qk.B

    return run_check(qk_circuit_factors, _factor_cases(), reference, mistakes, canonical=_product, atol=1e-3, rtol=1e-3,
                     n_generated=_draws.MODEL_CASES, generate=_model_head,
                     withheld=[full_qk_circuit, qk_factors, qk_circuit_parts])


# ---- Exercise 3.6 --------------------------------------------------------------------------------
def _recent_attention(model, layer: int = 0, mask: bool = True, scale: bool | str = True, dim: int = -1,
                      offsets: int = 3, reduce: str = "mean") -> torch.Tensor:
    """Per head of ``layer``: attention on the last ``offsets`` tokens from positions alone, averaged
    over queries; the keywords give the usual mistakes (no mask, no scale or ``scale="d_model"``:
    sqrt(d_model), softmax over queries, ``reduce="sum"``: summed over queries)."""
    if mask and scale is True and dim == -1 and reduce == "mean":
        return mean_attention_by_offset(positional_attention(model, layer)[None], max_offset=offsets - 1).sum(-1)
    b, n, P = model.blocks[layer], model.cfg.n_ctx, model.W_pos
    s = torch.einsum("pm,hmd->hpd", P, b.W_Q) @ torch.einsum("pm,hmd->hpd", P, b.W_K).transpose(-1, -2)
    s = s / (math.sqrt(model.cfg.d_model if scale == "d_model" else model.cfg.d_head) if scale else 1)
    if mask:
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    pattern = s.softmax(dim)
    if reduce == "sum":
        return sum(pattern.diagonal(-o, -2, -1).sum(-1) for o in range(offsets))
    return sum(pattern.diagonal(-o, -2, -1).mean(-1) for o in range(offsets))


def _with_positional_head(seed: int, head: int):
    """A random model whose head ``head`` attends to the current token by position: its queries and
    keys read the fastest sinusoids, whose dot product peaks where the two positions are equal."""
    model = random_model(n_layers=1, seed=seed)
    with torch.no_grad():
        d_head = model.cfg.d_head
        model.blocks[0].W_Q[head] = 4 * torch.eye(model.cfg.d_model)[:, :d_head]
        model.blocks[0].W_K[head] = 4 * torch.eye(model.cfg.d_model)[:, :d_head]
    return model


def _telling(seed: int):
    """A random two-layer model (QK weights x 3) on which each usual mistake picks another head than
    the right method: seeds 30, 36 and 49 were chosen so, and seed 2 for sqrt(d_model) in place of
    sqrt(d_head) (tests/exercise_table.py and tests/exercise_table_more.py keep them so)."""
    model = random_model(n_layers=2, seed=seed)
    with torch.no_grad():
        for b in model.blocks:
            b.W_Q.mul_(3)
            b.W_K.mul_(3)
    return model


def check_positional_head(positional_head) -> bool:
    """``positional_head(model)`` -> the layer-0 head (an int) whose attention from ``W_pos`` alone
    puts the most weight on the last 3 tokens (offsets 0, 1, 2). Random models on which a missing
    mask or scale, sqrt(d_model) for sqrt(d_head), a softmax over queries or layer 1's weights each
    pick another head tell the method apart, not only the answer."""
    cases = [
        Case("attn-only-1l", (shipped("attn-only-1l").model,)),
        Case("attn-only-2l", (shipped("attn-only-2l").model,)),
        Case("a random 2-layer model (seed 30)", (_telling(30),), kind="random"),
        Case("a random 2-layer model (seed 36)", (_telling(36),), kind="random"),
        Case("a random 2-layer model (seed 49)", (_telling(49),), kind="random"),
        Case("a random 2-layer model (seed 2)", (_telling(2),), kind="random"),
        Case("a model with a built-in positional head 1", (_with_positional_head(5, 1),), kind="hand-built"),
        Case("a model with a built-in positional head 2", (_with_positional_head(6, 2),), kind="hand-built"),
    ]

    def pick(**how):
        return lambda e, c: int(_recent_attention(c.args[0], **how).argmax())

    mistakes = [
        Diagnosis("the causal mask is missing: each query may attend only to keys at or before it", pick(mask=False)),
        Diagnosis("the softmax runs over the query axis; each query's row must sum to 1 over keys", pick(dim=-2)),
        Diagnosis("the scores are not divided by sqrt(d_head)", pick(scale=False)),
        Diagnosis("the scores were divided by sqrt(d_model); the scale is sqrt(d_head), the width of one head's "
                  "queries and keys", lambda e, c: int(_recent_attention(c.args[0], scale="d_model").argmax())
                  if c.args[0].cfg.d_model != c.args[0].cfg.d_head else None),
        Diagnosis(
            "that head was found from layer 1's weights; the positional head is in layer 0 (model.blocks[0])",
            lambda e, c: int(_recent_attention(c.args[0], layer=1).argmax()) if c.args[0].cfg.n_layers > 1 else None,
        ),
        Diagnosis("that is the head with the LEAST positional attention", lambda e, c: int(_recent_attention(c.args[0]).argmin())),
        Diagnosis("only the current token (offset 0) was counted; sum offsets 0, 1 and 2", pick(offsets=1)),
        Diagnosis("each offset's attention was summed over the queries, not averaged: offset o has n_ctx - o "
                  "queries, so the sum favours offset 0; take the mean of each diagonal", pick(reduce="sum")),
    ]
    return run_check(positional_head, cases, lambda m: int(_recent_attention(m).argmax()), mistakes, returns=int,
                     n_generated=_draws.MODEL_CASES, generate=_positional_case)


@functools.lru_cache(maxsize=None)
def _built_in(n_layers: int, n_heads: int, seed: int):
    """A random model whose last head of layer 0 attends to the current position (see
    :func:`_with_positional_head`)."""
    model = random_model(n_layers=n_layers, seed=seed, d_model=8, n_heads=n_heads, d_head=4, d_vocab=5, n_ctx=12)
    with torch.no_grad():
        model.blocks[0].W_Q[-1] = 4 * torch.eye(8)[:, :4]
        model.blocks[0].W_K[-1] = 4 * torch.eye(8)[:, :4]
    return model


def _positional_case(draw: Draw):
    """A random model of 1-3 layers (n_ctx 3 or more); edges: one head, the positional head the
    last of three, three layers, two layers of one head each."""
    edge = draw.edge(4)
    if edge == 1:
        return Case("its last head attends to the current position", (_built_in(1, 3, draw.rng.randrange(100)),))
    layers = (1, None, 3, 2)[edge] if edge is not None else draw.int(1, 3)
    m = _draws.model(draw, layers, min_ctx=3, edge=edge)
    return (m,)
