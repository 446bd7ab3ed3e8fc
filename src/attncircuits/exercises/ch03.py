"""Checks for chapter 3, one layer: the terms of the path expansion, their sum, the full OV and QK
circuits as two factors, and the positional head found from ``W_pos`` alone.

The references are :func:`~attncircuits.circuits.path_expansion`,
:func:`~attncircuits.circuits.full_ov_circuit`, :func:`~attncircuits.circuits.full_qk_circuit`,
:func:`~attncircuits.circuits.positional_attention` and
:func:`~attncircuits.circuits.mean_attention_by_offset`.
"""

from __future__ import annotations

import math

import torch

from ..circuits.factored import full_ov_circuit, full_qk_circuit, mean_attention_by_offset, positional_attention
from ..circuits.paths import path_expansion
from ..pretrained import validation_windows
from ._core import Case, Diagnosis, random_model, random_tokens, run_check, shipped
from .ch01 import head_mistakes, head_variant

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
def check_direct_path_logits(direct_path_logits) -> bool:
    """``direct_path_logits(model, tokens)`` -> ``W_E[tokens] @ W_U``, ``[batch, pos, d_vocab]``."""
    mistakes = [
        Diagnosis(
            "W_pos was added; positions never enter the residual stream in this model, only queries and keys",
            lambda e, c: (c.args[0].W_E[c.args[1]] + c.args[0].W_pos[: c.args[1].shape[1]]) @ c.args[0].W_U,
        ),
    ]
    return run_check(direct_path_logits, _text_cases(), lambda m, t: path_expansion(m, t).direct, mistakes, atol=1e-4)


# ---- Exercise 3.2 --------------------------------------------------------------------------------
def _head_term(model, tokens, head, **kw):
    b = model.blocks[0]
    out = head_variant(model.W_E[tokens], model.W_pos, b.W_Q[head], b.W_K[head], b.W_V[head], b.W_O[head], **kw)
    return out @ model.W_U


def check_head_logit_term(head_logit_term) -> bool:
    """``head_logit_term(model, tokens, head)`` -> head ``0.head``'s term of the logits,
    ``[batch, pos, d_vocab]``."""
    mistakes = head_mistakes(_head_term) + [
        Diagnosis(
            "this is the head's output in the residual stream; multiply by W_U to get logits",
            applies=lambda g, e, c: g.shape[-1] == c.args[0].cfg.d_model,
        ),
    ]
    text, m1 = validation_windows(2, 24), shipped("attn-only-1l").model
    cases = [
        Case("attn-only-1l head 0.1", (m1, text, 1)),
        Case("attn-only-1l head 0.3", (m1, text, 3)),
        Case("a random model", (random_model(n_layers=1, seed=1), random_tokens(64, (2, 12), seed=2), 2), kind="random"),
    ]
    return run_check(
        head_logit_term, cases, lambda m, t, h: path_expansion(m, t).heads[:, :, h], mistakes, atol=1e-4, rtol=1e-3
    )


# ---- Exercise 3.3 --------------------------------------------------------------------------------
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
            "one head only: sum the terms of all heads",
            applies=lambda g, e, c: any(
                torch.allclose(g, (x := path_expansion(*c.args)).direct + x.heads[:, :, h], atol=1e-3)
                for h in range(c.args[0].cfg.n_heads)
            ),
        ),
    ]
    cases = _text_cases() + [Case("another random model", (random_model(1, seed=9, n_heads=2, d_head=16), random_tokens(64, (1, 16), seed=3)), kind="random")]
    return run_check(logits_from_paths, cases, lambda m, t: m(t), mistakes, atol=1e-3, rtol=1e-3)


# ---- Exercises 3.4 and 3.5 -----------------------------------------------------------------------
def _factor_cases() -> list[Case]:
    return [
        Case("attn-only-1l head 0.0", (shipped("attn-only-1l").model, 0)),
        Case("attn-only-1l head 0.2", (shipped("attn-only-1l").model, 2)),
        Case("a random model", (random_model(n_layers=1, seed=4), 1), kind="random"),
    ]


def _product(factors):
    A, B = factors
    return A @ B


def check_ov_circuit_factors(ov_circuit_factors) -> bool:
    """``ov_circuit_factors(model, head)`` -> ``(A [d_vocab, d_head], B [d_head, d_vocab])`` with
    ``A @ B = W_E W_V W_O W_U`` for head ``0.head`` (the factors are compared by their product)."""

    def with_w(name):
        def wrong(e, c):
            model, h = c.args
            b = model.blocks[0]
            return (model.W_E @ getattr(b, name)[h], b.W_O[h] @ model.W_U)

        return wrong

    mistakes = [
        Diagnosis("used W_Q: the OV circuit reads the values, W_V", with_w("W_Q")),
        Diagnosis("used W_K: the OV circuit reads the values, W_V", with_w("W_K")),
    ]

    def reference(model, head):
        ov = full_ov_circuit(model, 0, head)
        return ov.A, ov.B

    return run_check(ov_circuit_factors, _factor_cases(), reference, mistakes, canonical=_product, atol=1e-3, rtol=1e-3)


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
    ]

    def reference(model, head):
        qk = full_qk_circuit(model, 0, head)
        return qk.A, qk.B

    return run_check(qk_circuit_factors, _factor_cases(), reference, mistakes, canonical=_product, atol=1e-3, rtol=1e-3)


# ---- Exercise 3.6 --------------------------------------------------------------------------------
def _recent_attention(model) -> torch.Tensor:
    """Per layer-0 head: attention on the last 3 tokens from positions alone, averaged over queries."""
    return mean_attention_by_offset(positional_attention(model, 0)[None], max_offset=2).sum(-1)


def _with_positional_head(seed: int, head: int):
    """A random model whose head ``head`` attends to the current token by position: its queries and
    keys read the fastest sinusoids, whose dot product peaks where the two positions are equal."""
    model = random_model(n_layers=1, seed=seed)
    with torch.no_grad():
        d_head = model.cfg.d_head
        model.blocks[0].W_Q[head] = 4 * torch.eye(model.cfg.d_model)[:, :d_head]
        model.blocks[0].W_K[head] = 4 * torch.eye(model.cfg.d_model)[:, :d_head]
    return model


def check_positional_head(positional_head) -> bool:
    """``positional_head(model)`` -> the layer-0 head (an int) whose attention from ``W_pos`` alone
    puts the most weight on the last 3 tokens (offsets 0, 1, 2)."""
    cases = [
        Case("attn-only-1l", (shipped("attn-only-1l").model,)),
        Case("attn-only-2l", (shipped("attn-only-2l").model,)),
        Case("a model with a built-in positional head 1", (_with_positional_head(5, 1),), kind="hand-built"),
        Case("a model with a built-in positional head 2", (_with_positional_head(6, 2),), kind="hand-built"),
    ]
    mistakes = [
        Diagnosis("that is the head with the LEAST positional attention", lambda e, c: int(_recent_attention(c.args[0]).argmin())),
        Diagnosis(
            "only the current token (offset 0) was counted; sum offsets 0, 1 and 2",
            lambda e, c: int(mean_attention_by_offset(positional_attention(c.args[0], 0)[None], 0)[:, 0].argmax()),
        ),
    ]
    return run_check(positional_head, cases, lambda m: int(_recent_attention(m).argmax()), mistakes)
