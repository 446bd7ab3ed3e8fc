"""Rows of the exercise table for chapter 8 (circuits built by hand): the wrong answers a learner
working from the stubs found accepted or badly named, and right answers written other ways.
Added to ``exercise_table.ROWS`` by :func:`add`.

- 8.1: one angle for every pair (the chapter's frequencies all lie between 0.5 and 1 rad, where
  it happens to work), half the pairs, the rotation as printed (not transposed), twice the angle;
  the score printed to 3 decimals;
- 8.2: a permutation off by one, src copied into itself, half the block, entries outside the
  block, dst or src shifted by one, a factor transposed;
- 8.3: models that predict the token two back without the virtual head (one two-back head, a
  two-back head under a self-attending one), two soft heads, the wrong blocks written or read;
- 8.4: attention too sharp, the hint's 30 without the division by sqrt(d_head), the blocks read
  named in words.
"""

from __future__ import annotations

import math

import torch

from attncircuits.models import handbuilt as hb


def add(wrong, right, sol) -> None:
    """Append the rows (``wrong(check, label, fn, words, cls, avoid=...)``, ``right(...)``)."""
    _previous_token(wrong, right, sol)
    _copy(wrong, right, sol)
    _two_back(wrong, right, sol)
    _induction(wrong, right, sol)


# ---- 8.1 -------------------------------------------------------------------------------------------
def _rotation(W_pos, n_pairs, d_head, scale=30.0, angle=None, pairs=None, back=1.0, printed=False):
    """W_Q, W_K with pair f's query turned by ``back`` times its angle (or by ``angle`` for every
    pair), over ``pairs`` (default: all); ``printed``: the rotation put in as printed, not transposed."""
    d_model = W_pos.shape[1]
    W_Q, W_K = torch.zeros(d_model, d_head), torch.zeros(d_model, d_head)
    for f in range(n_pairs) if pairs is None else pairs(n_pairs):
        a = angle if angle is not None else back * math.atan2(float(W_pos[1, 2 * f]), float(W_pos[1, 2 * f + 1]))
        c, s = math.cos(a), math.sin(a)
        block = torch.tensor([[c, -s], [s, c]]) if printed else torch.tensor([[c, s], [-s, c]])
        W_Q[2 * f : 2 * f + 2, 2 * f : 2 * f + 2] = scale * block
        W_K[2 * f : 2 * f + 2, 2 * f : 2 * f + 2] = torch.eye(2)
    return W_Q, W_K


def _formula(W_pos, n_pairs, d_head):
    """The frequencies from the sinusoids' formula (10000^(-2f/d_model)), in float64."""
    d_model = W_pos.shape[1]
    W_Q, W_K = torch.zeros(d_model, d_head), torch.zeros(d_model, d_head)
    for f in range(n_pairs):
        w = 10000.0 ** (-2 * f / d_model)
        W_Q[2 * f : 2 * f + 2, 2 * f : 2 * f + 2] = 30 * torch.tensor([[math.cos(w), math.sin(w)],
                                                                     [-math.sin(w), math.cos(w)]])
        W_K[2 * f, 2 * f] = W_K[2 * f + 1, 2 * f + 1] = 1.0
    return W_Q, W_K


def _key_forward(W_pos, n_pairs, d_head):
    """The key turned one position forward, the query left as it is: the same ``W_Q W_Kᵀ``. In
    the row convention the key's block is the rotation as printed, by +w."""
    forward, identity = _rotation(W_pos, n_pairs, d_head, scale=1.0, printed=True)
    return 30 * identity, forward


def _previous_token(wrong, right, sol) -> None:
    C = "ch08.check_previous_token_qk"
    wrong(C, "one angle, 0.7 rad, for every pair, x32", lambda *a: _rotation(*a, scale=32, angle=0.7),
          "every pair is turned by the same angle, 0.700 rad", "named")
    wrong(C, "one angle, 0.8 rad, for every pair, x64", lambda *a: _rotation(*a, scale=64, angle=0.8),
          "each pair turns by its own frequency", "named")
    wrong(C, "half the pairs, x40", lambda *a: _rotation(*a, scale=40, pairs=lambda n: range(n // 2)),
          "only 8 of the 16 sinusoid pairs (pairs 8-15 left out): use every one", "named")
    wrong(C, "every other pair, x40", lambda *a: _rotation(*a, scale=40, pairs=lambda n: range(0, n, 2)),
          "use every one of the first n_pairs pairs", "named")
    wrong(C, "the rotation as printed, not transposed", lambda *a: _rotation(*a, printed=True),
          "transpose your rotation (the query must point one position back)", "named", avoid="scale W_Q up")
    wrong(C, "twice each pair's angle", lambda *a: _rotation(*a, back=2.0), "2 positions back", "named")
    wrong(C, "too soft, the score to 3 decimals", lambda *a: _rotation(*a, scale=0.3),
          "previous-token score 0.048 < 0.95", "named")
    right(C, "the frequencies from the formula, in float64", _formula)
    right(C, "the key turned forward instead", _key_forward)
    right(C, "the head dims permuted", lambda *a: (lambda q, k, p: (q[:, p], k[:, p]))(
        *sol("previous_token_qk")(*a), torch.randperm(a[2], generator=torch.Generator().manual_seed(1))))


# ---- 8.2 -------------------------------------------------------------------------------------------
def _ov(d_model, d_head, src, dst, how):
    n = src.stop - src.start
    W_V, W_O = torch.zeros(d_model, d_head), torch.zeros(d_head, d_model)
    W_V[src, :n] = torch.eye(n)
    W_O[:n, dst] = torch.eye(n)
    if how == "permuted":
        W_O[:n, dst] = torch.eye(n).roll(1, 1)
    elif how == "into src":
        W_O[:n] = 0
        W_O[:n, src] = torch.eye(n)
    elif how == "half":
        W_V[src.start + n // 2 : src.stop] = 0
    elif how == "extra":
        W_V[0:2, :2] = 1.0
    elif how == "dst + 1":
        W_O[:n] = 0
        W_O[:n, dst.start + 1 : dst.stop + 1] = torch.eye(n)
    return W_V, W_O


def _copy(wrong, right, sol) -> None:
    C = "ch08.check_copy_ov"
    wrong(C, "a permutation off by one", lambda *a: _ov(*a, "permuted"), "a permutation shifted by +1", "named")
    wrong(C, "copies src into src itself", lambda *a: _ov(*a, "into src"), "copies src into src itself", "named")
    wrong(C, "half the block", lambda *a: _ov(*a, "half"), "64 of 128 dims copied", "named")
    wrong(C, "extra entries outside the block", lambda *a: _ov(*a, "extra"),
          "non-zero outside the src->dst block (src dims 32-159 to dst dims 160-287): reads dims 0-1", "named")
    wrong(C, "dst shifted by one", lambda *a: _ov(*a, "dst + 1"), "dst shifted by +1", "named")
    wrong(C, "W_O transposed", lambda *a: (lambda v, o: (v, o.T))(*sol("copy_ov")(*a)),
          "W_O has shape [416, 128]: it is transposed", "named", avoid="could not be compared")
    wrong(C, "W_V transposed", lambda *a: (lambda v, o: (v.T, o))(*sol("copy_ov")(*a)),
          "W_V has shape [128, 416]: it is transposed", "named")
    right(C, "a scale moved from W_O to W_V", lambda *a: (lambda v, o: (4 * v, o / 4))(*sol("copy_ov")(*a)))
    right(C, "columns and rows of an identity", lambda d, h, s, t: (
        torch.cat([torch.eye(d)[:, s], torch.zeros(d, h - (s.stop - s.start))], 1),
        torch.cat([torch.eye(d)[t], torch.zeros(h - (t.stop - t.start), d)], 0)))


# ---- 8.3 -------------------------------------------------------------------------------------------
def _qk_back(model, layout, back, scale=None):
    """A previous-token-like W_Q, W_K whose query points ``back`` positions back (0: itself)."""
    W_Q, W_K = hb.previous_token_qk(model.W_pos, layout.n_pos_pairs, layout.d_head)
    if back == 1:
        return W_Q, W_K
    Q = _rotation(model.W_pos, layout.n_pos_pairs, layout.d_head, scale=1.0, back=back)[0]
    return (scale or float(W_Q.abs().max())) * Q, W_K


def _model(layout, heads):
    """``heads``: per layer (back, src, dst) or None; back is where the query points."""
    model = hb.empty_model(layout, 2)
    for layer, head in enumerate(heads):
        if head is None:
            continue
        back, src, dst = head
        W_Q, W_K = _qk_back(model, layout, back) if isinstance(back, int) else back(model, layout)
        W_V, W_O = hb.copy_ov(layout.d_model, layout.d_head, layout.block(src), layout.block(dst))
        hb.set_head(model, layer, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)
    return model


def _soft(model, layout):
    W_Q, W_K = hb.previous_token_qk(model.W_pos, layout.n_pos_pairs, layout.d_head)
    return 0.15 * W_Q, W_K


def _own_qk(sol):
    def build(layout):
        model = hb.empty_model(layout, 2)
        W_Q, W_K = sol("previous_token_qk")(model.W_pos, layout.n_pos_pairs, layout.d_head)
        for layer, (src, dst) in enumerate((("token", "prev"), ("prev", "out"))):
            W_V, W_O = sol("copy_ov")(layout.d_model, layout.d_head, layout.block(src), layout.block(dst))
            hb.set_head(model, layer, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)
        return model

    return build


def _two_back(wrong, right, sol) -> None:
    C = "ch08.check_two_back_model"
    wrong(C, "one two-back head, in layer 1", lambda L: _model(L, [None, (2, "token", "out")]),
          "layer 0's head is empty", "named")
    wrong(C, "a two-back head under a self-attending one", lambda L: _model(L, [(2, "token", "prev"),
                                                                                 (0, "prev", "out")]),
          "layer 0's head looks mostly 2 tokens back", "named")
    wrong(C, "two soft heads", lambda L: _model(L, [(_soft, "token", "prev"), (_soft, "prev", "out")]),
          "too softly (previous-token score 0.", "named")
    wrong(C, "layer 0 writes out", lambda L: _model(L, [(1, "token", "out"), (1, "prev", "out")]),
          "layer 0's head writes the out block, not the prev block", "named")
    wrong(C, "layer 1 attends to itself", lambda L: _model(L, [(1, "token", "prev"), (0, "prev", "out")]),
          "layer 1's head looks mostly at the token itself", "named")
    right(C, "the chapter's own previous_token_qk and copy_ov", _own_qk(sol))


# ---- 8.4 -------------------------------------------------------------------------------------------
def _ind(layout, logit=30.0, k="prev", sqrt=True):
    n = layout.d_vocab
    W_Q, W_K = torch.zeros(layout.d_model, layout.d_head), torch.zeros(layout.d_model, layout.d_head)
    scale = logit * (layout.d_head**0.5 if sqrt else 1.0) / layout.embed_scale**2
    W_Q[layout.block("token"), :n] = scale * torch.eye(n)
    W_K[layout.block(k), :n] = torch.eye(n)
    return W_Q, W_K


def _induction(wrong, right, sol) -> None:
    C = "ch08.check_induction_qk"
    wrong(C, "too sharp, x10", lambda L: _ind(L, 300.0), "the attention is too sharp", "named",
          avoid="does not copy enough")
    wrong(C, "too sharp, x100", lambda L: _ind(L, 3000.0), "lower the scale", "named", avoid="does not copy enough")
    wrong(C, "30 in q . k, not divided by sqrt(d_head)", lambda L: _ind(L, sqrt=False), "scale W_Q up", "named")
    wrong(C, "W_K reads the out block", lambda L: _ind(L, k="out"), "W_Q reads the token block, W_K the out block",
          "named", avoid="[")
    right(C, "a match worth 15", lambda L: _ind(L, 15.0))
    right(C, "the head dims reversed", lambda L: (lambda q, k: (q.flip(1), k.flip(1)))(*sol("induction_qk")(L)))
