"""Checks for chapter 8, circuits built by hand: the learner writes weights, the check puts them
into a :class:`Transformer` (:mod:`attncircuits.models.handbuilt` supplies the rest of the
model) and runs it. Weights that implement a circuit are far from unique, so these checks judge
what the model *does*: its previous-token score, whether it predicts the token two back, its
prefix-matching score and its loss on repeated random tokens; and when it fails, they read the
learner's matrices to say which block of the residual stream was read or written by mistake.
Where the exercise asks for one construction, they read it off the weights too: in 8.1 every
sinusoid pair turned by its own frequency (``W_Q W_Kᵀ``, the same in any basis of the head), in
8.3 the virtual head (two previous-token heads, layer 0's writing ``prev`` and layer 1's reading
it), so that a model that only happens to pass the behaviour on these layouts is not accepted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attncircuits.analysis import losses, scores
from attncircuits.analysis.circuits import mean_attention_by_offset
from attncircuits.analysis.attribution import two_back_accuracy
from attncircuits.course.exercises import ch08_weights as weights
from attncircuits.course.exercises._core import Case, Draw, Identity, guarded, random_tokens, run_check
from attncircuits.models import handbuilt
from attncircuits.models.handbuilt import Layout

__all__ = [
    "PREFIX_TARGET",
    "PREV_TARGET",
    "check_copy_ov",
    "check_induction_qk",
    "check_previous_token_qk",
    "check_two_back_model",
]

PREV_TARGET = 0.95  # previous-token score a hand-built previous-token head must reach
PREFIX_TARGET = 0.95  # prefix-matching score a hand-built induction head must reach


def _tokens(layout: Layout, batch: int = 8, seed: int = 0) -> Tensor:
    return random_tokens(layout.d_vocab, (batch, layout.n_ctx), seed=seed)


def _pair(out, what: str) -> tuple[Tensor, Tensor] | str:
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(x, Tensor) for x in out)):
        return f"return the pair ({what}) as two tensors"
    return out[0].float(), out[1].float()


def _blocks_read(W: Tensor, layout: Layout) -> list[str]:
    """The names of the residual blocks whose rows of ``W`` are not all zero."""
    names = ["pos"] + list(handbuilt.BLOCKS)
    sl = [layout.pos] + [layout.block(b) for b in handbuilt.BLOCKS]
    return [n for n, s in zip(names, sl) if W[s].abs().max() > 1e-6]


# ---- 8.1 a previous-token head from the sinusoids -------------------------------------------------
def _prev_score(layout: Layout, W_Q: Tensor, W_K: Tensor) -> tuple[float, Tensor]:
    """The previous-token score of a one-head model with these weights, and its attention by offset."""
    model = handbuilt.empty_model(layout, 1)
    handbuilt.set_head(model, 0, W_Q=W_Q, W_K=W_K)
    toks = _tokens(layout)
    _, cache = model.run_with_cache(toks)
    score = float(scores.previous_token_scores(model, toks)[0, 0])
    return score, mean_attention_by_offset(cache.pattern[0], max_offset=4)[0]


def _scale_reaches(score_of, target: float, factors=None) -> float | None:
    """The first factor (by default 2, 4, ..., 1024) by which scaling W_Q reaches ``target``; None
    when none does (then "scale up" would be wrong advice)."""
    for c in factors or (2.0**k for k in range(1, 11)):
        if score_of(c) >= target:
            return c
    return None


def _compare_prev(got, expected, case) -> str | None:
    layout: Layout = expected
    pair = _pair(got, "W_Q, W_K")
    if isinstance(pair, str):
        return pair
    W_Q, W_K = pair
    try:
        score = _prev_score(layout, W_Q, W_K)[0]
    except ValueError as err:
        return f"{err} (this case's layout has d_model {layout.d_model}: read the sizes from the arguments)"
    said = f"previous-token score {score:.3f}"
    if score < PREV_TARGET:
        for name, W in (("W_Q", W_Q), ("W_K", W_K)):
            if float(W.abs().max()) == 0:
                return f"{name} is all zeros: every score is 0 and the head attends uniformly"
        if _prev_score(layout, -W_Q, W_K)[0] >= PREV_TARGET:
            return (f"{said}: the sign is flipped (-W_Q would work); the query and the key of the previous "
                    "position must point the same way")
    problem = weights.angle_problem(W_Q, W_K, layout, said)
    if problem is not None:  # said even when this layout's score is high: on others it is not
        return problem
    if score >= PREV_TARGET:
        return None
    c = _scale_reaches(lambda c: _prev_score(layout, c * W_Q, W_K)[0], PREV_TARGET)
    if c is not None:  # scaling is advised only when it is verified to reach the target
        return f"{said} < {PREV_TARGET}: the peak is right but too soft; scale W_Q up ({c:g}x is enough)"
    peak = int(_prev_score(layout, 64 * W_Q, W_K)[1].argmax())  # where the head looks once sharp
    if peak == 0 and weights.looks_forward(W_Q, W_K, layout):
        return (f"{said}: transpose your rotation (the query must point one position back). Yours points "
                "at position i + 1, which the causal mask hides, so the head looks mostly at the token itself")
    if peak != 1:
        where = "the token itself" if peak == 0 else f"{peak} tokens back"
        return (f"{said}: the head looks mostly at {where}. Rotate the query's (sin, cos) pairs back by one "
                "position's angle, w, leave the key as it is")
    return (f"{said} < {PREV_TARGET}: the peak is at the previous token, but even 1024 times W_Q does not "
            "make it sharp: other positions score almost as high")


@guarded
def check_previous_token_qk(fn) -> bool:
    """``previous_token_qk(W_pos, n_pairs, d_head) -> (W_Q, W_K)``, each ``[d_model, d_head]``:
    judged by the previous-token score (>= 0.95) of a one-head model that uses them, on the
    chapter's layout, on a smaller one (so that sizes read from the chapter do not pass) and on
    layouts whose frequencies are far apart (so that one angle for every pair does not pass); and
    by ``W_Q W_Kᵀ``: every one of the ``n_pairs`` pairs turned by its own frequency."""
    cases = []
    for label, layout in (("the chapter's layout: 16 sinusoid pairs, d_head 128", Layout()),
                          ("a layout with 64 tokens and 12 sinusoid pairs", Layout(d_vocab=64, n_pos_pairs=12)),
                          ("a layout whose 3 sinusoid pairs turn by 1.00, 0.22 and 0.05 rad a position",
                           Layout(d_vocab=2, n_pos_pairs=3, n_ctx=32))):
        W_pos = handbuilt.empty_model(layout, 1).W_pos
        cases.append(Case(label, (W_pos, layout.n_pos_pairs, layout.d_head), kind="hand-built", expected=layout))
    return run_check(fn, cases, handbuilt.previous_token_qk, compare=_compare_prev, name="previous_token_qk",
                     n_generated=len(_PREV_LAYOUTS), generate=_prev_layout, withheld=[handbuilt.previous_token_qk])


# smaller layouts (the names of the arguments come from the package's own functions): one sinusoid
# pair over 2 positions, 2 pairs over 8, 4 over 16, 8 over 32, and layouts whose frequencies are far
# apart (a small d_model spreads them: 1.00 and 0.16 rad; 1.00 down to 0.05; 1.00 down to 0.02)
_PREV_LAYOUTS = (Layout(d_vocab=2, n_pos_pairs=1, n_ctx=2), Layout(d_vocab=4, n_pos_pairs=2, n_ctx=8),
                 Layout(d_vocab=8, n_pos_pairs=4, n_ctx=16), Layout(d_vocab=16, n_pos_pairs=8, n_ctx=32),
                 Layout(d_vocab=2, n_pos_pairs=2, n_ctx=16), Layout(d_vocab=2, n_pos_pairs=3, n_ctx=64),
                 Layout(d_vocab=2, n_pos_pairs=4, n_ctx=48), Layout(d_vocab=4, n_pos_pairs=4, n_ctx=32))


def _prev_layout(draw: Draw) -> Case:
    layout = _PREV_LAYOUTS[draw.i % len(_PREV_LAYOUTS)]
    W_pos = handbuilt.empty_model(layout, 1).W_pos
    return Case(repr(layout), (W_pos, layout.n_pos_pairs, layout.d_head), expected=layout)


# ---- 8.2 a head that copies one block into another ------------------------------------------------
def _product(out):
    pair = _pair(out, "W_V, W_O")
    return pair if isinstance(pair, str) else pair[0] @ pair[1]


def _compare_copy(got, expected, case) -> str | None:
    pair = _pair(got, "W_V, W_O")
    if isinstance(pair, str):
        return pair
    want = expected[0] @ expected[1]
    if pair[0].ndim != 2 or pair[1].ndim != 2 or pair[0].shape[1] != pair[1].shape[0] or \
            (pair[0].shape[0], pair[1].shape[1]) != tuple(want.shape):  # judged by the product, whatever its inner size
        return weights.shapes(pair, expected) or f"W_V @ W_O cannot be [d_model, d_model] = {list(want.shape)}"
    ov = pair[0] @ pair[1]
    if torch.allclose(ov, want, atol=1e-5):
        return None
    if float(ov.abs().max()) == 0:
        return "W_V @ W_O is all zeros: nothing is copied; it must be the identity from the source block to the destination"
    if torch.allclose(ov, want.T, atol=1e-5):
        return "W_V @ W_O copies dst into src: W_V reads the source block, W_O writes the destination"
    c = float((ov * want).sum() / (want * want).sum())
    if abs(c - 1) > 1e-3 and torch.allclose(ov, c * want, atol=1e-5):
        return f"W_V @ W_O is {c:.3g} times the copy: make it the identity between the two blocks"
    where = weights.where_copied(ov, case.args[2], case.args[3])
    if where:
        return f"W_V @ W_O is wrong: {where}; it must be the identity from src to dst and zero elsewhere"
    return "W_V @ W_O must be the identity from the source block to the destination block and zero elsewhere"


@guarded
def check_copy_ov(fn) -> bool:
    """``copy_ov(d_model, d_head, src, dst) -> (W_V, W_O)``: judged by ``W_V @ W_O`` (the factors
    are unique only up to a change of basis inside the head)."""
    layout = Layout()
    cases = [
        Case("token -> prev", (layout.d_model, layout.d_head, layout.block("token"), layout.block("prev")), kind="hand-built"),
        Case("prev -> out", (layout.d_model, layout.d_head, layout.block("prev"), layout.block("out")), kind="hand-built"),
        Case("a small stream: dims 2-5 -> 8-11", (12, 4, slice(2, 6), slice(8, 12)), kind="hand-built"),
    ]
    same_size = Identity("src and dst have one size, at most d_head, inside d_model, and do not overlap",
                         lambda d, h, s, t: s.stop - s.start == t.stop - t.start <= h and max(s.stop, t.stop) <= d
                         and (s.stop <= t.start or t.stop <= s.start))
    return run_check(fn, cases, handbuilt.copy_ov, compare=_compare_copy, name="copy_ov", generate=_blocks,
                     identities=[same_size], withheld=[handbuilt.copy_ov])


def _blocks(draw: Draw):
    """(d_model, d_head, src, dst) with two slices of one size, at most d_head, that do not
    overlap; edges: one dimension, the size d_head, dst before src, the last dimensions of the
    stream, the two blocks side by side filling it."""
    edge = draw.edge(5)
    if edge is not None:
        return ((3, 1, slice(0, 1), slice(2, 3)), (10, 4, slice(1, 5), slice(6, 10)), (9, 3, slice(5, 8), slice(0, 3)),
                (12, 2, slice(4, 6), slice(10, 12)), (6, 5, slice(0, 3), slice(3, 6)))[edge]
    d_head = draw.int(1, 6)
    size = draw.int(1, d_head)
    d_model = 2 * size + draw.int(0, 6)
    a = draw.int(0, d_model - 2 * size)
    b = draw.int(a + size, d_model - size)
    src, dst = (slice(a, a + size), slice(b, b + size))
    return (d_model, d_head, src, dst) if draw.rng.random() < 0.5 else (d_model, d_head, dst, src)


# ---- 8.3 the virtual head that looks two tokens back ----------------------------------------------
def _blocks_text(names: list[str]) -> str:
    """``["token", "out"]`` -> ``"the token and out blocks"``; ``"pos"`` is the positional dims."""
    parts = (["the positional dims"] if "pos" in names else []) + (
        [f"the {' and '.join(b for b in names if b != 'pos')} block{'s' * (len(names) - ('pos' in names) > 1)}"]
        if any(b != "pos" for b in names) else [])
    return " and ".join(parts) or "nothing"


def _where_it_looks(by_offset: Tensor) -> str:
    peak = int(by_offset.argmax())
    return "at the token itself" if peak == 0 else ("at the previous token" if peak == 1 else f"{peak} tokens back")


def _compare_two_back(got, expected, case) -> str | None:
    if not hasattr(got, "blocks") or not callable(got):
        return f"return the model (a Transformer), got a {type(got).__name__}"
    if got.cfg.n_layers != 2:
        return f"the virtual head needs two layers, your model has {got.cfg.n_layers}"
    layout: Layout = case.args[0]
    for field in ("d_vocab", "n_ctx", "d_model"):
        mine, want = getattr(got.cfg, field, None), getattr(layout.config(2), field)
        if mine != want:
            return (f"your model's {field} is {mine}, this case's layout has {want}: build the model from the "
                    "layout passed in (hb.empty_model(layout, 2)), not from the chapter's")
    toks = _tokens(layout)
    acc = {k: two_back_accuracy(got, toks, k) for k in (1, 2)}
    predicts = (f"your model predicts the token two back ({acc[2]:.0%}), but not through a virtual head"
                if acc[2] >= 0.99 else f"your model cannot predict the token two back ({acc[2]:.0%} of positions)")
    # the virtual head the exercise asks for: two previous-token heads, composed through the prev block
    heads = [[getattr(got.blocks[layer], w)[0].float() for w in ("W_Q", "W_K", "W_V", "W_O")] for layer in (0, 1)]
    for layer, ws in enumerate(heads):
        if all(float(w.abs().max()) == 0 for w in ws):
            return (f"layer {layer}'s head is empty (all its weights are zero): {predicts}. The virtual head "
                    "is a previous-token head in layer 0 that writes the previous token into the prev block "
                    "and a previous-token head in layer 1 that reads it (V-composition)")
    _, cache = got.run_with_cache(toks)
    prev = scores.previous_token_scores(got, toks)[:, 0]
    for layer in (0, 1):
        if float(prev[layer]) < PREV_TARGET:
            by_offset = mean_attention_by_offset(cache.pattern[layer], max_offset=4)[0]
            said = f"previous-token score {float(prev[layer]):.3f} < {PREV_TARGET}"
            if int(by_offset.argmax()) == 1:
                return (f"layer {layer}'s head looks one back, but too softly ({said}): each head of the virtual "
                        "head must be a sharp previous-token head; scale its W_Q up (hb.previous_token_qk's "
                        "weights, unscaled, are sharp enough)")
            return (f"layer {layer}'s head looks mostly {_where_it_looks(by_offset)} ({said}): {predicts}. The "
                    "virtual head is two previous-token heads, each looking one back; their composition looks "
                    "two back")
    ov = [ws[2] @ ws[3] for ws in heads]
    written, read = _blocks_read(ov[0].T, layout), _blocks_read(ov[1], layout)
    if "prev" not in written:
        return (f"layer 0's head writes {_blocks_text(written)}, not the prev block: it must copy the token it "
                "attends to into prev, for layer 1 to read")
    if "prev" not in read:
        one_back = f", so your model predicts the token one back ({acc[1]:.0%})" if acc[1] > 0.5 else ""
        return (f"layer 1's head reads {_blocks_text(read)}, not the prev block{one_back}: the layer-1 head "
                "must read the prev block, which the layer-0 head wrote (V-composition)")
    if acc[2] >= 0.99:
        return None
    if acc[1] > 0.5:
        return (
            f"your model predicts the token one back ({acc[1]:.0%}), not two back: the layer-1 head "
            "must read the prev block, which the layer-0 head wrote"
        )
    same = float((got(toks).argmax(-1) == toks).float().mean())
    if same > 0.5:
        return "your model predicts the current token: each head must copy the token of the position it attends to"
    return (f"the token two back is the top prediction at only {acc[2]:.0%} of positions (need 99%); layer 1 "
            f"writes {_blocks_text(_blocks_read(ov[1].T, layout))} (the unembedding reads the out block)")


@guarded
def check_two_back_model(fn) -> bool:
    """``build_two_back(layout) -> Transformer``: the top prediction at position ``i``
    must be the token at ``i - 2`` (>= 99% of positions, random tokens), through the virtual head:
    in each layer a previous-token head (score >= 0.95), layer 0's writing the ``prev`` block and
    layer 1's reading it (V-composition)."""
    cases = [
        Case("the chapter's layout", (Layout(),), kind="hand-built", expected=1.0),
        Case("a layout with 64 tokens and 12 pairs", (Layout(d_vocab=64, n_pos_pairs=12),), kind="hand-built", expected=1.0),
    ]
    return run_check(fn, cases, handbuilt.two_back_model, compare=_compare_two_back, name="build_two_back", n_generated=3,
                     generate=lambda draw: Case("", (_PREV_LAYOUTS[1 + draw.i % 3],), expected=1.0),
                     withheld=[handbuilt.two_back_model])


# ---- 8.4 the induction head's QK circuit (K-composition) ------------------------------------------
def _compare_induction(got, expected, case) -> str | None:
    layout: Layout = case.args[0]
    pair = _pair(got, "W_Q, W_K")
    if isinstance(pair, str):
        return pair
    model = handbuilt.induction_model(layout)
    try:
        handbuilt.set_head(model, 1, W_Q=pair[0], W_K=pair[1])
    except ValueError as err:
        return f"{err} (this case's layout has d_model {layout.d_model}: read the sizes from the layout passed in)"
    pm, loss = _induction_scores(model)
    if pm >= PREFIX_TARGET and loss.second < 0.5 * loss.first:
        return None

    def pm_with(W_Q):
        m = handbuilt.induction_model(layout)
        handbuilt.set_head(m, 1, W_Q=W_Q, W_K=pair[1])
        return _induction_scores(m)

    for name, W in (("W_Q", pair[0]), ("W_K", pair[1])):
        if float(W.abs().max()) == 0:
            return f"{name} is all zeros: every score is 0 and the head attends uniformly"
    if pm >= PREFIX_TARGET:
        said = (f"prefix-matching score {pm:.3f}, but the loss on the second copy ({loss.second:.2f}) is not "
                f"below half the first copy's ({loss.first:.2f})")
        for c in (2.0**-k for k in range(1, 9)):
            pm_c, loss_c = pm_with(c * pair[0])
            if pm_c >= PREFIX_TARGET and loss_c.second < 0.5 * loss_c.first:
                return (f"{said}: the attention is too sharp. Where the current token occurred more than once "
                        "before, the positions in the query and key break the tie between the tokens after "
                        "those copies, and all the attention goes to one, often the wrong one: lower the scale "
                        f"(W_Q {1 / c:g} times smaller passes)")
        return f"{said}: the head finds the right keys but does not copy enough"
    if pm_with(-pair[0])[0] >= PREFIX_TARGET:
        return (f"prefix-matching score {pm:.3f}: the sign is flipped (-W_Q would work), so the head "
                "avoids the token after an earlier copy instead of seeking it")
    q_reads, k_reads = _blocks_read(pair[0], layout), _blocks_read(pair[1], layout)
    if "prev" in q_reads and "token" not in q_reads:
        return "W_Q reads the prev block: the query asks about the current token (token block)"
    if "token" in k_reads and "prev" not in k_reads:
        return (
            "W_K reads the token block: that finds earlier copies of the current token, not the token "
            "after them. The key must read the prev block (K-composition)"
        )
    if "token" in q_reads and "prev" in k_reads:
        c = _scale_reaches(lambda c: pm_with(c * pair[0])[0], PREFIX_TARGET)
        if c is not None:
            return (f"prefix-matching score {pm:.3f} < {PREFIX_TARGET}: the right keys win but too softly; "
                    f"scale W_Q up ({c:g}x is enough)")
        return (f"prefix-matching score {pm:.3f}: W_Q reads the token block and W_K the prev block, but no "
                "scale makes the right key win: match each token with itself (the identity between the two "
                "blocks)")
    return (f"prefix-matching score {pm:.3f} (need {PREFIX_TARGET}): W_Q reads {_blocks_text(q_reads)}, W_K "
            f"{_blocks_text(k_reads)}; the query must read the token block and the key the prev block")


def _induction_scores(model):
    """The layer-1 head's prefix-matching score and the model's loss on repeated random tokens."""
    return float(scores.prefix_matching_scores(model, batch_size=8)[1, 0]), losses.repeated_token_loss(model, batch_size=8)


@guarded
def check_induction_qk(fn) -> bool:
    """``induction_qk(layout) -> (W_Q, W_K)`` of the layer-1 head, each ``[d_model, d_head]``:
    judged by the prefix-matching score (>= 0.95) and the loss on repeated random tokens of the
    induction model that uses them, on the chapter's layout and on a smaller one."""
    cases = [Case("the chapter's layout", (Layout(),), kind="hand-built", expected=PREFIX_TARGET),
             Case("a layout with 64 tokens and 12 sinusoid pairs", (Layout(d_vocab=64, n_pos_pairs=12),),
                  kind="hand-built", expected=PREFIX_TARGET)]
    more = (Layout(d_vocab=26, n_pos_pairs=16, n_ctx=101), Layout(d_vocab=64, n_pos_pairs=2, n_ctx=128))
    return run_check(fn, cases, handbuilt.induction_qk, compare=_compare_induction, name="induction_qk", n_generated=len(more),
                     generate=lambda draw: Case("", (more[draw.i % len(more)],), expected=PREFIX_TARGET),
                     withheld=[handbuilt.induction_qk, handbuilt.induction_model])
