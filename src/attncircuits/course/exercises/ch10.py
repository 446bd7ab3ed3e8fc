"""Checks for chapter 10 (Beyond attention-only): fold a LayerNorm into the weights that read it,
split a residual stream through a LayerNorm with its scale frozen, and measure a bump in a loss
curve.

Each check runs the learner's function on the shipped ``ln-mlp-4l`` model's weights, activations or
history and on small random or hand-written inputs, against the references in
:mod:`attncircuits.deeper`, and prints one line. Those references (and TransformerLens's own
LayerNorm fold, where it is installed) are withheld while the learner's function runs.
"""

from __future__ import annotations

import functools

import torch

from attncircuits.analysis.deeper import fold_ln_into, frozen_ln, loss_bump, writers
from attncircuits.course.exercises._core import (
    Case,
    Diagnosis,
    Draw,
    Identity,
    guarded,
    random_tokens,
    run_check,
    shipped,
)

__all__ = ["check_fold_ln_into", "check_frozen_ln", "check_loss_bump"]


def _tl_fold() -> list:
    """TransformerLens's own LayerNorm fold, the gain into a weight and the bias into its bias
    (``ProcessWeights``' static methods; none where TransformerLens is not installed)."""
    try:
        from transformer_lens.weight_processing import ProcessWeights
    except ImportError:
        return []
    names = ("fold_layer_norm_weight_single", "fold_layer_norm_bias_single")
    return [(ProcessWeights, name) for name in names if name in vars(ProcessWeights)]


def _random_ln_case(seed: int, d_model: int, n_heads: int, d_head: int) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return (1 + torch.rand(d_model, generator=gen), torch.randn(d_model, generator=gen),
            torch.randn(n_heads, d_model, d_head, generator=gen), torch.randn(n_heads, d_head, generator=gen))


@guarded
def check_fold_ln_into(fn) -> bool:
    """Exercise 10.1: ``fn(w_ln, b_ln, W, b) -> (W_folded, b_folded)``; tuple items are named in
    messages."""
    model = shipped("ln-mlp-4l").model
    block, ln = model.blocks[1], model.ln_attn[1]
    cases = [
        Case("ln-mlp-4l, layer 1's LayerNorm into W_K",
             tuple(t.detach().clone() for t in (ln.w, ln.b, block.W_K, block.b_K))),
        Case("random gain and bias, 3 heads of 5", _random_ln_case(1, 12, 3, 5), kind="random"),
    ]

    def not_centred(expected, case):
        w, _, W, _ = case.args
        return w[:, None] * W, expected[1]

    def scaled_bias(expected, case):
        w, b_ln, W, b = case.args
        return expected[0], b + torch.einsum("d,...de->...e", b_ln * w, W)

    def bias_kept(expected, case):
        return expected[0], case.args[3]

    def centred_over_out(expected, case):
        w, _, W, _ = case.args
        F = w[:, None] * W
        return F - F.mean(-1, keepdim=True), expected[1]

    def bias_through_folded(expected, case):
        _, b_ln, _, b = case.args
        return expected[0], b + torch.einsum("d,...de->...e", b_ln, expected[0])

    def b_dropped(expected, case):
        return expected[0], expected[1] - case.args[3]

    def bias_subtracted(expected, case):
        return expected[0], 2 * case.args[3] - expected[1]

    def bias_centred(expected, case):
        return expected[0], expected[1] - expected[1].mean(-1, keepdim=True)

    def gain_dropped(expected, case):
        W = case.args[2]
        return W - W.mean(-2, keepdim=True), expected[1]

    return run_check(
        fn,
        cases,
        reference=fold_ln_into,
        diagnoses=[
            Diagnosis("the weight is not centred: subtract its mean over d_model (axis -2); LayerNorm's "
                      "output has mean zero, so that direction is never read", not_centred),
            Diagnosis("the LayerNorm bias is added after the gain, so it meets W unscaled: use b_ln @ W, "
                      "not (w_ln * b_ln) @ W", scaled_bias),
            Diagnosis("the LayerNorm bias is not folded: b_ln @ W adds to the bias", bias_kept),
            Diagnosis("the gain is missing: scale row i of W (the d_model axis) by w_ln[i]", gain_dropped),
            Diagnosis("centred over the wrong axis: subtract the mean over d_model (axis -2), the "
                      "direction LayerNorm's output never has; not over d_out", centred_over_out),
            Diagnosis("b_folded uses the centred W_folded: the bias meets the original W, b_ln @ W "
                      "(centring changes only what x̂ never reads, but b_ln is not x̂)", bias_through_folded),
            Diagnosis("b_folded leaves out W's own bias b: add b_ln @ W to b", b_dropped),
            Diagnosis("b_folded subtracts b_ln @ W; the LayerNorm bias is added: b + b_ln @ W", bias_subtracted),
            Diagnosis("b_folded is centred too; only the weight is: the bias is added to every output as "
                      "it is", bias_centred),
        ],
        atol=1e-5,
        rtol=1e-4,
        generate=_fold_case,
        outputs=("W_folded", "b_folded"),
        withheld=[fold_ln_into, *_tl_fold()],
    )


def _fold_case(draw: Draw):
    """Gain and bias [d_model], W [n_heads, d_model, d_out], b [n_heads, d_out]; a zero gain entry,
    a zero bias, one head of one output, and the shipped sizes among them."""
    edge = draw.edge(4)
    h, d, o = ((1, 1, 1), (1, 2, 1), (2, 3, 2), (4, 128, 32))[edge] if edge is not None else (
        draw.int(1, 3), draw.int(1, 6), draw.int(1, 4))
    w_ln = draw.rand(d, lo=0.5, hi=2.0) * (draw.rand(d) > 0.2)  # a gain of 0 switches a direction off
    b_ln = draw.randn(d) if draw.rng.random() > 0.2 else torch.zeros(d)
    return w_ln, b_ln, draw.randn(h, d, o), draw.randn(h, o) if draw.rng.random() > 0.2 else torch.zeros(h, o)


@functools.lru_cache(maxsize=None)
def _shipped_stack() -> tuple[torch.Tensor, torch.Tensor]:
    """The final residual stream of ``ln-mlp-4l`` on 2 rows of random tokens, split by writer: the
    position embedding only where it is in the stream (a "shortformer" model adds it to queries
    and keys only), so the components sum to ``resid`` as the exercise says."""
    fm = shipped("ln-mlp-4l").model.folded()
    with torch.no_grad():
        stack, _, resid = writers(fm, random_tokens(fm.cfg.d_vocab, (2, 12)))
    return stack, resid


def _sums_to_resid(components, resid) -> bool:
    return components.shape[1:] == resid.shape and bool(torch.allclose(components.sum(0), resid, atol=1e-4, rtol=1e-5))


def _stack_case(draw: Draw):
    """Components [comp, batch, pos, d_model] and their sum; edges: one component, one position,
    d_model 2, a stream of nearly constant value (variance about 1e-8, where the epsilon of the
    scale decides), a stream with one position far louder than the rest."""
    edge = draw.edge(5)
    c, b, p, d = ((1, 1, 1, 2), (3, 1, 2, 4), (2, 1, 3, 5), (4, 2, 2, 3), (5, 2, 4, 8))[edge] if edge is not None else (
        draw.int(1, 5), draw.int(1, 2), draw.int(1, 4), draw.int(2, 8))
    comps = draw.randn(c, b, p, d)
    note = ""
    if edge in (2, 3) or (edge is None and draw.rng.random() < 0.3):  # a nearly constant stream
        target = 1e-4 * draw.randn(b, p, d)  # centred already: float32 keeps its digits
        comps[-1] = target - comps[:-1].sum(0)
        note = "resid's variance over d_model is about 1e-8"
    elif edge == 4:
        comps[:, :, 0] *= 1000.0
        note = "position 0 is 1000 times louder"
    return Case(note, (comps, comps.sum(0)))


@guarded
def check_frozen_ln(fn) -> bool:
    """Exercise 10.3: ``fn(components, resid) -> [comp, ..., d_model]``."""
    gen = torch.Generator().manual_seed(4)
    parts = torch.randn(5, 3, 7, 16, generator=gen) + torch.randn(5, 1, 1, 16, generator=gen)
    cases = [
        Case("ln-mlp-4l's final residual stream, split by writer", _shipped_stack()),
        Case("5 random components of a [3, 7, 16] stream", (parts, parts.sum(0)), kind="random"),
    ]

    def own_scale(expected, case):
        comps, _ = case.args
        c = comps - comps.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()

    def not_centred(expected, case):
        comps, resid = case.args
        r = resid - resid.mean(-1, keepdim=True)
        return comps / (r.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()

    def unbiased(expected, case):
        comps, resid = case.args
        return (comps - comps.mean(-1, keepdim=True)) / (resid.var(-1, keepdim=True) + 1e-5).sqrt()

    def no_division(expected, case):
        comps, _ = case.args
        return comps - comps.mean(-1, keepdim=True)

    return run_check(
        fn,
        cases,
        reference=frozen_ln,
        diagnoses=[
            Diagnosis("each component is divided by its own scale; freeze the scale: divide every "
                      "component by the one scale of the whole residual stream, so they still sum "
                      "to LN(resid)", own_scale),
            Diagnosis("the components are not centred: subtract each one's mean over d_model first",
                      not_centred),
            Diagnosis("that is the unbiased variance (divided by d_model - 1); LayerNorm divides by "
                      "d_model (unbiased=False)", unbiased),
            Diagnosis("the components are centred but not divided by the residual stream's scale",
                      no_division),
        ],
        atol=1e-5,
        rtol=1e-4,
        generate=_stack_case,
        identities=[Identity("components sum over axis 0 to resid", _sums_to_resid)],
        withheld=[frozen_ln],
    )


@guarded
def check_loss_bump(fn) -> bool:
    """Exercise 10.2: ``fn(values) -> float``, the largest rise above the lowest value so far."""
    history = shipped("ln-mlp-4l").history
    cases = [
        Case("ln-mlp-4l's validation loss", (list(history["val_loss"]),)),
        Case("a slow rise over three evaluations", ([5.0, 4.0, 4.1, 4.2, 4.25, 3.0],), kind="hand-built"),
        Case("two bumps, the later one larger", ([5.0, 3.0, 3.2, 2.0, 2.6, 1.0],), kind="hand-built"),
        Case("a curve that only falls", ([5.0, 4.0, 3.0, 2.5],), kind="hand-built"),
        Case("a curve with a missing evaluation (None)", ([4.0, None, 4.5, 3.0],), kind="hand-built"),
    ]

    def _vals(case):
        return [v for v in case.args[0] if v is not None]

    def one_step(expected, case):
        v = _vals(case)
        return max([0.0] + [b - a for a, b in zip(v, v[1:])])

    def none_as_zero(expected, case):
        return loss_bump([0.0 if v is None else v for v in case.args[0]])

    def max_minus_min(expected, case):
        v = _vals(case)
        return max(v) - min(v)

    def first_bump(expected, case):
        v = _vals(case)  # the top of the first rise above the lowest value before it
        for j in range(1, len(v)):
            if v[j] > min(v[:j]):
                top = j
                while top + 1 < len(v) and v[top + 1] >= v[top]:
                    top += 1
                return v[top] - min(v[:j])
        return 0.0

    return run_check(
        fn,
        cases,
        reference=loss_bump,
        diagnoses=[
            Diagnosis("that is the largest rise between two consecutive evaluations; a bump can "
                      "climb over several: measure from the lowest value so far", one_step),
            Diagnosis("that is the curve's maximum minus its minimum, which ignores order (the "
                      "first value, before any learning, is the maximum): a bump is a rise after "
                      "a fall", max_minus_min),
            Diagnosis("that is the first bump only; keep going: the largest rise above the lowest "
                      "value so far", first_bump),
            Diagnosis("a missing evaluation (None) was read as a loss of 0: leave it out", none_as_zero),
        ],
        atol=1e-7,
        rtol=1e-6,  # a float32 answer holds the bump to about 1e-7
        generate=_curve,
        returns=float,
        withheld=[loss_bump],
    )


_EDGE_CURVES = (
    [3.0], [2.0, 2.0, 2.0], [5.0, 1.0, 1.3], [0.0, 0.5, 0.2], [1.0, 0.0, 0.01], [None, 3.0, 2.0, 2.05],
    [4.0, 3.0, None, None, 3.5, None], [2.0, 1.0, 1.5, 0.5, 0.6], [1.0, 2.0, 1.5], [5.0, 2.0, 3.7],
    [None, None, 1.0], [0.0, 0.0], [6.0, 1e-6, 2e-6],
)


def _curve(draw: Draw):
    """A loss curve: a list of floats and ``None``s (at least one float); the edges first: one
    value, ties, the bump at the last point, losses of 0, tiny bumps, ``None`` first, last and in
    a row, a later smaller bump after the global minimum, a bump from the first value."""
    edge = draw.edge(len(_EDGE_CURVES))
    if edge is not None:
        return (list(_EDGE_CURVES[edge]),)
    n, v, out = draw.int(1, 40), draw.rng.uniform(0.0, 6.0), []
    for _ in range(n):
        r = draw.rng.random()
        v = max(0.0, v + (draw.rng.uniform(-0.5, 0.1) if r < 0.7 else draw.rng.uniform(0.0, 1.0) if r < 0.85
                          else draw.rng.choice([0.0, 1e-3])))
        out.append(None if draw.rng.random() < 0.1 else round(v, 3))
    if all(x is None for x in out):
        out[draw.rng.randrange(n)] = round(v, 3)
    return (out,)
