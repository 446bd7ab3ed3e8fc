"""Checks for chapter 5, two layers: a composition score, its random baseline, K-composition
between two heads, a virtual head's OV circuit and the loss of the first-order path terms.

Each check runs the learner's function on the shipped two-layer model and on a small random
two-layer model against the package's reference (``attncircuits.analysis.circuits``) and names the typical
mistakes: the product in the wrong order, a missing normalisation, the Q- or V-composition score
in place of the K one, a virtual head read in the wrong order, the virtual terms left in.
"""

from __future__ import annotations


import torch
from torch import Tensor

from attncircuits.analysis import circuits
from attncircuits.analysis.circuits.composition import random_composition_baseline, random_composition_scores
from attncircuits.checkpoints.pretrained import validation_windows
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises import ch05_baseline as baseline
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
from attncircuits.models.transformer import Transformer

__all__ = [
    "check_composition_score",
    "check_first_order_loss",
    "check_k_composition_score",
    "check_random_composition_scores",
    "check_virtual_ov",
]


def _ov(model: Transformer, layer: int, head: int) -> Tensor:
    b = model.blocks[layer]
    return (b.W_V[head] @ b.W_O[head]).detach()


def _qk(model: Transformer, layer: int, head: int) -> Tensor:
    b = model.blocks[layer]
    return (b.W_Q[head] @ b.W_K[head].T).detach()


def _score(first: Tensor, second: Tensor) -> float:
    return float((first @ second).norm() / (first.norm() * second.norm()))


def _two_layer() -> Transformer:
    return random_model(n_layers=2, seed=5)


# ---- 5.1 the composition score of two matrices ---------------------------------------------------
@guarded
def check_composition_score(fn) -> bool:
    """``composition_score(first, second) -> float``: ``‖first @ second‖_F / (‖first‖_F ‖second‖_F)``."""
    g = torch.Generator().manual_seed(0)

    def low_rank(d: int) -> Tensor:
        return torch.randn(d, 4, generator=g) @ torch.randn(4, d, generator=g)

    a, b = low_rank(32), low_rank(32)
    m = shipped("attn-only-2l").model
    cases = [
        Case("two random rank-4 matrices, d_model=32", (a, b), kind="random"),
        Case("the same two, scaled by 3 and by 0.5", (3 * a, 0.5 * b), kind="random"),
        Case("attn-only-2l: W_OV of head 0.0, W_QK of head 1.0", (_ov(m, 0, 0), _qk(m, 1, 0))),
    ]
    return run_check(
        fn,
        cases,
        _score,
        [
            Diagnosis(
                "you multiplied in the wrong order: the writer comes first, `first @ second`",
                lambda e, c: _score(c.args[1], c.args[0]),
            ),
            Diagnosis(
                "not normalised: divide ‖first @ second‖ by ‖first‖ ‖second‖ (the score is scale-free, in [0, 1])",
                lambda e, c: float((c.args[0] @ c.args[1]).norm()),
            ),
            Diagnosis(
                "you divided by the norm of the product's factors squared; use ‖first‖ ‖second‖",
                lambda e, c: float((c.args[0] @ c.args[1]).norm() / (c.args[0].norm() ** 2 * c.args[1].norm() ** 2)),
            ),
        ],
        name="composition_score",
        atol=1e-5,
        rtol=1e-3,
        returns=float,
        generate=_matrices,
    )


def _matrices(draw: Draw):
    """Two ``[d_model, d_model]`` matrices; edges: d_model 1, a product of 0 (orthogonal ranges),
    a matrix with itself, entries about 1e-3, rank 1, the shipped d_model (128)."""
    edge = draw.edge(6)
    d = (1, 4, 5, 6, 3, 128)[edge] if edge is not None else draw.int(1, 16)
    first, second = draw.randn(d, d), draw.randn(d, d)
    note = ""
    if edge == 1:
        first, second = torch.zeros(d, d), torch.zeros(d, d)
        first[0, 0], second[1, 1] = 2.0, 3.0
        note = "first @ second = 0"
    elif edge == 2:
        second = first.clone()
    elif edge == 3:
        first, second = first * 1e-3, second * 1e-3
        note = "entries about 1e-3"
    elif edge == 4:
        first = draw.randn(d, 1) @ draw.randn(1, d)
        note = "first has rank 1"
    return Case(note, (first, second))


# ---- 5.2 K-composition between two heads ---------------------------------------------------------
def _k_score(model, writer, reader):
    return circuits.composition_score(model, "k", (0, writer), (1, reader))


@guarded
def check_k_composition_score(fn) -> bool:
    """``k_composition_score(model, writer, reader) -> float``: how much layer-1 head ``reader``
    reads, through its key, what layer-0 head ``writer`` writes."""
    m2, rnd = shipped("attn-only-2l").model, _two_layer()
    cases = [
        Case("a random 2-layer model, 0.1 -> 1.2", (rnd, 1, 2), kind="random", others=other_heads((rnd, 1, 2), 2, 4, "reader 1.{}")),
        Case("attn-only-2l, 0.2 -> 1.1", (m2, 2, 1), others=other_heads((m2, 2, 1), 2, 4, "reader 1.{}")),
        Case("attn-only-2l, 0.0 -> 1.3", (m2, 0, 3), others=other_heads((m2, 0, 3), 2, 4, "reader 1.{}")),
    ]
    return run_check(
        fn,
        cases,
        _k_score,
        [
            Diagnosis(
                "that is the Q-composition score: the key side reads through W_QK transposed, W_K W_Q^T",
                lambda e, c: circuits.composition_score(c.args[0], "q", (0, c.args[1]), (1, c.args[2])),
            ),
            Diagnosis(
                "that is the V-composition score: K-composition reads through the key, W_QK^T",
                lambda e, c: circuits.composition_score(c.args[0], "v", (0, c.args[1]), (1, c.args[2])),
            ),
            Diagnosis(
                "you multiplied in the wrong order: the writer's W_OV comes first",
                lambda e, c: _score(_qk(c.args[0], 1, c.args[2]).T, _ov(c.args[0], 0, c.args[1])),
            ),
            Diagnosis(
                "writer and reader are swapped: the writer is a layer-0 head, the reader a layer-1 head",
                lambda e, c: _k_score(c.args[0], c.args[2], c.args[1]),
            ),
        ],
        name="k_composition_score",
        atol=1e-5,
        rtol=1e-3,
        withheld=[circuits.composition_score, circuits.composition_scores],
        returns=float,
        n_generated=_draws.MODEL_CASES,
        generate=_writer_reader,
    )


def _writer_reader(draw: Draw, label: str = "reader 1.{}", vary: int = 2) -> Case:
    """A two-layer model (the chapter's: a learner may unpack ``b0, b1 = model.blocks``), a layer-0
    writer and a layer-1 reader; edges: one head of width 1, the first and the last heads."""
    edge = draw.edge(4)
    m = _draws.model(draw, 2, edge=edge)
    h = m.cfg.n_heads
    w, r = (_draws.head(draw, h, edge), _draws.head(draw, h, None if edge is None else edge + 1))
    args = (m, w, r)
    return Case("", args, others=other_heads(args, vary, h, label))


# ---- 5.3 the random baseline ---------------------------------------------------------------------
@guarded
def check_random_composition_scores(fn) -> bool:
    """``random_composition_scores(d_model, d_head, n_samples, seed) -> Tensor [n_samples]``:
    compared by their mean and their spread (they are random) with the reference's, and with
    those of the usual wrong draws (full rank, torch.rand, symmetric matrices); each case is called
    twice, and the same seed must give the same scores, another seed others."""
    cases = [
        Case("d_model=32, d_head=4, 2,000 samples, seed 1", (32, 4, 2000, 1), kind="random"),
        Case("d_model=32, d_head=4, 2,000 samples, seed 2", (32, 4, 2000, 2), kind="random"),
        Case("d_model=64, d_head=16, 1,000 samples", (64, 16, 1000, 3), kind="random"),
    ]
    for c in cases:  # the reference with many samples, so its mean and spread are a fixed target
        c.expected = baseline.target(c.args[0], c.args[1])
    baseline.SEEDED.clear()
    baseline.DRAWN.clear()
    return run_check(baseline.called_twice(fn), cases, lambda d_model, d_head, n, seed=0: baseline.target(d_model, d_head),
                     compare=baseline.compare_baseline, name="random_composition_scores",
                     withheld=[random_composition_scores, random_composition_baseline],
                     n_generated=3, generate=baseline.baseline_sizes)


# ---- 5.4 a virtual head's OV circuit -------------------------------------------------------------
def _virtual_ov(model, writer, reader):
    return circuits.virtual_ov_circuit(model, writer, reader).dense()


@guarded
def check_virtual_ov(fn) -> bool:
    """``virtual_ov(model, writer, reader) -> Tensor [d_vocab, d_vocab]``: ``W_E W_OV^{0,w} W_OV^{1,r} W_U``."""
    cases = [
        Case("a random 2-layer model, 1.2∘0.1", (rnd := _two_layer(), 1, 2), kind="random",
             others=other_heads((rnd, 1, 2), 1, 4, "writer 0.{}")),
        Case("attn-only-2l, 1.1∘0.2", (m2 := shipped("attn-only-2l").model, 2, 1),
             others=other_heads((m2, 2, 1), 1, 4, "writer 0.{}")),
    ]

    def wrong_order(e, c):
        m, w, r = c.args
        return m.W_E @ _ov(m, 1, r) @ _ov(m, 0, w) @ m.W_U

    def no_embed(e, c):
        m, w, r = c.args
        return _ov(m, 0, w) @ _ov(m, 1, r) @ m.W_U

    return run_check(
        fn,
        cases,
        _virtual_ov,
        [
            Diagnosis("you applied the layer-1 head first: the layer-0 head writes, then the layer-1 head reads", wrong_order),
            Diagnosis("rows must be source tokens: start from W_E", no_embed),
        ],
        name="virtual_ov",
        atol=1e-3,
        rtol=1e-3,
        withheld=[circuits.virtual_ov_circuit],
        n_generated=_draws.MODEL_CASES,
        generate=lambda draw: _writer_reader(draw, "writer 0.{}", 1),
    )


# ---- 5.5 term importance: the loss of the first-order terms ---------------------------------------
def _first_order(model, tokens):
    return circuits.term_importance(model, tokens).first_order


@guarded
def check_first_order_loss(fn) -> bool:
    """``first_order_loss(model, tokens) -> float``: the loss of the direct path plus every
    single-head term, all attention patterns frozen, no virtual heads."""
    m2 = shipped("attn-only-2l").model
    rnd = _two_layer()
    cases = [
        Case("a random 2-layer model, 4 x 16 random tokens", (rnd, random_tokens(rnd.cfg.d_vocab, (4, 16))), kind="random"),
        Case("attn-only-2l, 4 validation windows", (m2, validation_windows(n_ctx=m2.cfg.n_ctx)[:4])),
    ]

    def other(field: str):
        return lambda e, c: getattr(circuits.term_importance(*c.args), field)

    return run_check(
        fn,
        cases,
        _first_order,
        [
            Diagnosis(
                "that is the model's own loss: leave out the virtual heads (layer-1 values read only the embedding)",
                other("full"),
            ),
            Diagnosis("that is the direct path alone: add the single-head terms of both layers", other("direct")),
            Diagnosis("you left out the layer-1 heads' terms", other("direct_layer0")),
            Diagnosis("you left out the layer-0 heads' terms", other("direct_layer1")),
        ],
        name="first_order_loss",
        atol=1e-4,
        rtol=1e-4,
        withheld=[circuits.term_importance],
        returns=float,
        n_generated=8,
        generate=lambda draw: _draws.model_tokens(draw, 2, min_pos=2),
    )
