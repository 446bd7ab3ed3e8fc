"""The checks of chapters 5-8: each accepts a right answer and names at least two typical wrong
ones; the hand-built reference models meet the targets chapter 8 states."""

from __future__ import annotations

import math

import pytest
import torch
from einops import einsum

from attncircuits import loss_fn
from attncircuits.analysis import losses
from attncircuits.analysis import scores as S
from attncircuits.analysis import attribution
from attncircuits.analysis.circuits import copying
from attncircuits.analysis.attribution import attribution_labels, two_back_accuracy
from attncircuits.course.exercises import ch05, ch06, ch07, ch08
from attncircuits.models import handbuilt as hb
from attncircuits.models import smeared
from learner_copy import learner_copy


def run(check, fn, capsys) -> tuple[bool, str]:
    ok = check(fn)
    out = capsys.readouterr().out
    assert out.count("\n") >= 1 and out.strip(), out
    return ok, " ".join(out.split())


def accepts(check, fn, capsys):
    ok, out = run(check, fn, capsys)
    assert ok and out.startswith("✓"), out


def rejects(check, fn, capsys, *phrases):
    ok, out = run(check, fn, capsys)
    assert not ok and out.startswith("✗"), out
    for p in phrases:
        assert p in out, (p, out)


# ---- chapter 5 ----------------------------------------------------------------------------------
def comp(a, b):
    return ((a @ b).norm() / (a.norm() * b.norm())).item()


def test_composition_score(capsys):
    accepts(ch05.check_composition_score, comp, capsys)
    rejects(ch05.check_composition_score, lambda a, b: comp(b, a), capsys, "wrong order")
    rejects(ch05.check_composition_score, lambda a, b: (a @ b).norm().item(), capsys, "not normalised")


def _k(model, w, r, transpose=True):
    b0, b1 = model.blocks
    qk = b1.W_Q[r] @ b1.W_K[r].T
    return comp(b0.W_V[w] @ b0.W_O[w], qk.T if transpose else qk)


def test_k_composition_score(capsys):
    accepts(ch05.check_k_composition_score, _k, capsys)
    rejects(ch05.check_k_composition_score, lambda m, w, r: _k(m, w, r, False), capsys, "Q-composition")
    rejects(ch05.check_k_composition_score, lambda m, w, r: _k(m, r, w), capsys, "swapped")


def _random_scores(d_model, d_head, n, seed=0, rand=torch.randn, same=False):
    g = torch.Generator().manual_seed(seed)

    def draw():
        k = 1 if same else n
        a = rand(k, d_model, d_head, generator=g) @ rand(k, d_head, d_model, generator=g)
        return a.expand(n, -1, -1)

    first, second = draw(), draw()
    norm = torch.linalg.matrix_norm
    return norm(first @ second) / (norm(first) * norm(second))


def test_random_composition_scores(capsys):
    check = ch05.check_random_composition_scores
    accepts(check, _random_scores, capsys)
    rejects(check, lambda *a: _random_scores(*a, rand=torch.rand), capsys, "centred")
    rejects(check, lambda *a: _random_scores(*a, same=True), capsys, "same score")


def _virtual(m, w, r, reverse=False):
    b0, b1 = m.blocks
    ov0, ov1 = b0.W_V[w] @ b0.W_O[w], b1.W_V[r] @ b1.W_O[r]
    return m.W_E @ (ov1 @ ov0 if reverse else ov0 @ ov1) @ m.W_U


def test_virtual_ov(capsys):
    accepts(ch05.check_virtual_ov, _virtual, capsys)
    rejects(ch05.check_virtual_ov, lambda m, w, r: _virtual(m, w, r, True), capsys, "layer-1 head first")
    rejects(ch05.check_virtual_ov, lambda m, w, r: _virtual(m, w, r).T.contiguous(), capsys, "transposed")


def _first_order(model, tokens, layer0=True, layer1=True, virtual=False):
    _, cache = model.run_with_cache(tokens)
    x = model.W_E[tokens]
    resid = x + (cache.head_out[0].sum(2) if layer0 else 0)
    if virtual:
        return loss_fn(cache.resid[-1] @ model.W_U, tokens).item()
    if layer1:
        b1 = model.blocks[1]
        v1 = einsum(x, b1.W_V, "b k m, h m d -> b k h d")
        z1 = einsum(cache.pattern[1], v1, "b h q k, b k h d -> b q h d")
        resid = resid + einsum(z1, b1.W_O, "b q h d, h d m -> b q m")
    return loss_fn(resid @ model.W_U, tokens).item()


def test_first_order_loss(capsys):
    check = ch05.check_first_order_loss
    accepts(check, _first_order, capsys)
    rejects(check, lambda m, t: _first_order(m, t, virtual=True), capsys, "model's own loss")
    rejects(check, lambda m, t: _first_order(m, t, layer1=False), capsys, "layer-1 heads")


# ---- chapter 6 ----------------------------------------------------------------------------------
def test_previous_token_score(capsys):
    def prev(p, off=-1, red=torch.mean):
        return red(p.diagonal(offset=off, dim1=-2, dim2=-1), dim=(0, 2))

    check = ch06.check_previous_token_score
    accepts(check, prev, capsys)
    rejects(check, lambda p: prev(p, 0), capsys, "token itself")
    rejects(check, lambda p: prev(p, red=torch.sum), capsys, "summed")


def test_prefix_matching_score(capsys):
    check = ch06.check_prefix_matching_score
    accepts(check, ch06._prefix, capsys)
    rejects(check, ch06._duplicate, capsys, "earlier copy of the token itself")

    def all_queries(p, t, seq_len):
        return einsum(p, S.prefix_match_targets(t).to(p.dtype), "b h q k, b q k -> b h q").mean((0, 2))

    rejects(check, all_queries, capsys, "first copy too")


def test_find_induction_heads(capsys):
    check = ch06.check_find_induction_heads

    def find(model, threshold=0.3):
        pm = S.prefix_matching_scores(model)
        return [(l, h) for l, h in (pm > threshold).nonzero().tolist()]

    def by_prev(model, threshold=0.3):
        pt = S.previous_token_scores(model, losses.repeated_tokens(model, batch_size=4))
        return [(l, h) for l, h in (pt > threshold).nonzero().tolist()]

    accepts(check, find, capsys)
    rejects(check, lambda m: [(1, 0), (1, 1), (1, 3)], capsys, "on attn-only-1l", "has one layer, layer 0")
    rejects(check, by_prev, capsys, "so they are previous-token heads")


def _ablated(model, tokens, head, mode, mean_over=(0, 1), increase=False):
    layer, h = head
    value = 0.0
    if mode == "mean":
        value = model.run_with_cache(tokens)[1].head_out[layer][:, :, h].mean(dim=mean_over)
    loss = loss_fn(model(tokens, ablate={(layer, h): value}), tokens).item()
    return loss - loss_fn(model(tokens), tokens).item() if increase else loss


def test_ablated_loss(capsys):
    check = ch06.check_ablated_loss
    accepts(check, _ablated, capsys)
    other = {"zero": "mean", "mean": "zero"}
    rejects(check, lambda m, t, h, mode: _ablated(m, t, h, other[mode]), capsys, "other ablation")
    rejects(check, lambda *a: _ablated(*a, increase=True), capsys, "not its increase")
    rejects(check, lambda *a: _ablated(*a, mean_over=0), capsys, "over positions too")


def test_qk_score_terms(capsys):
    check = ch06.check_qk_score_terms
    qk_score_terms = learner_copy(attribution.qk_score_terms)
    accepts(check, qk_score_terms, capsys)
    rejects(check, lambda *a: qk_score_terms(*a).transpose(0, 1), capsys, "swapped")
    rejects(check, lambda m, t, h: qk_score_terms(m, t, h) * math.sqrt(m.cfg.d_head), capsys, "sqrt(d_head)")

    def no_positions(m, t, h):  # 5 sources instead of 6: the shape check names it
        return qk_score_terms(m, t, h)[[0, 2, 3, 4, 5]][:, [0, 2, 3, 4, 5]]

    rejects(check, no_positions, capsys, "shape")


def test_copying_accuracy(capsys):
    check = ch06.check_copying_accuracy
    ov_copying_accuracy = learner_copy(copying.ov_copying_accuracy)
    accepts(check, ov_copying_accuracy, capsys)
    rejects(check, lambda m, hs: sum(ov_copying_accuracy(m, [h]) for h in hs) / len(hs), capsys, "averaged")

    def by_column(m, hs):
        full = m.W_E @ sum(m.blocks[l].W_V[h] @ m.blocks[l].W_O[h] for l, h in hs) @ m.W_U
        return (full.argmax(0) == torch.arange(m.cfg.d_vocab)).float().mean().item()

    rejects(check, by_column, capsys, "column")


# ---- chapter 7 ----------------------------------------------------------------------------------
def test_icl_score(capsys):
    check = ch07.check_icl_score
    accepts(check, lambda n, late, early: (n[:, late - 1] - n[:, early - 1]).mean().item(), capsys)
    rejects(check, lambda n, late, early: (n[:, late] - n[:, early]).mean().item(), capsys, "off by one")
    rejects(check, lambda n, late, early: (n[:, early - 1] - n[:, late - 1]).mean().item(), capsys, "sign")


def test_copy_losses(capsys):
    def means(loss, L, n, start=1, shift=0):
        return [loss[c * L + start + shift : (c + 1) * L + shift].mean().item() for c in range(n)]

    check = ch07.check_copy_losses
    accepts(check, means, capsys)
    rejects(check, lambda *a: means(*a, start=0), capsys, "first target")
    rejects(check, lambda *a: means(*a, shift=1), capsys, "off by one")


def test_smear_scores(capsys):
    check = ch07.check_smear_scores
    smear_scores = learner_copy(smeared.smear_scores)
    accepts(check, smear_scores, capsys)
    rejects(check, lambda s, w: smear_scores(s, 1 - w), capsys, "swapped")

    def next_key(s, w):
        masked = torch.isinf(s)
        z = s.masked_fill(masked, 0.0)
        nxt = torch.cat([z[..., 1:], z[..., -1:]], dim=-1)
        ww = w[None, :, None, None]
        return (ww * z + (1 - ww) * nxt).masked_fill(masked, float("-inf"))

    rejects(check, next_key, capsys, "next")


def test_logit_attribution(capsys):
    check = ch07.check_logit_attribution
    logit_attribution = learner_copy(attribution.logit_attribution)
    accepts(check, logit_attribution, capsys)
    rejects(check, lambda m, t: logit_attribution(m, t)[..., 1:], capsys, "shape")

    def current(m, t):
        _, cache = m.run_with_cache(t)
        resid = torch.cat([m.W_E[t][:, :-1, None]] + [o[:, :-1] for o in cache.head_out], dim=2)
        return torch.einsum("btsd,dbt->bts", resid, m.W_U[:, t[:, :-1]])

    rejects(check, current, capsys, "next")


def test_logit_attribution_sums_to_the_logits():
    m = ch07.shipped("attn-only-2l").model
    toks = losses.repeated_tokens(m, 20, batch_size=2)
    parts = attribution.logit_attribution(m, toks)
    with torch.no_grad():
        logit = m(toks)[:, :-1].gather(-1, toks[:, 1:, None])[..., 0]
    assert parts.shape[-1] == len(attribution_labels(m)) == 9
    assert (parts.sum(-1) - logit).abs().max() < 1e-3


# ---- chapter 8 and the hand-built models --------------------------------------------------------
def test_the_packages_own_answers_are_refused_by_name(capsys):
    said = "the package's own answer"
    rejects(ch08.check_previous_token_qk, hb.previous_token_qk, capsys, said)
    rejects(ch08.check_copy_ov, lambda d, h, s, t: hb.copy_ov(d, h, s, t), capsys, said)
    rejects(ch08.check_two_back_model, lambda lay: hb.two_back_model(lay), capsys, said)
    rejects(ch08.check_induction_qk, lambda lay: hb.induction_qk(lay), capsys, said)


def test_previous_token_qk(capsys):
    check = ch08.check_previous_token_qk
    previous_token_qk = learner_copy(hb.previous_token_qk)
    accepts(check, previous_token_qk, capsys)

    def no_rotation(W_pos, n, d):
        W_Q, W_K = previous_token_qk(W_pos, n, d)
        return W_K * 30, W_K

    rejects(check, no_rotation, capsys, "token itself")
    rejects(check, lambda W_pos, n, d: previous_token_qk(W_pos, n, d, sharpness=0.5), capsys, "too soft")


def test_copy_ov(capsys):
    check = ch08.check_copy_ov
    copy_ov = learner_copy(hb.copy_ov)
    accepts(check, copy_ov, capsys)
    rejects(check, lambda d, h, s, t: copy_ov(d, h, t, s), capsys, "copies dst into src")
    rejects(check, lambda d, h, s, t: copy_ov(d, h, s, t, scale=2.0), capsys, "2 times")


def test_two_back_model(capsys):
    check = ch08.check_two_back_model
    two_back_model = learner_copy(hb.two_back_model)
    accepts(check, two_back_model, capsys)

    def one_back(layout):
        m = two_back_model(layout)
        W_V, W_O = hb.copy_ov(layout.d_model, layout.d_head, layout.block("token"), layout.block("out"))
        hb.set_head(m, 1, W_V=W_V, W_O=W_O)
        return m

    rejects(check, one_back, capsys, "one back")
    rejects(check, lambda layout: hb.previous_token_model(layout), capsys, "two layers")


def test_induction_qk(capsys):
    check = ch08.check_induction_qk
    induction_qk = learner_copy(hb.induction_qk)
    accepts(check, induction_qk, capsys)

    def key_reads_token(layout):
        W_Q, W_K = induction_qk(layout)
        W_K2 = torch.zeros_like(W_K)
        W_K2[layout.block("token")] = W_K[layout.block("prev")]
        return W_Q, W_K2

    rejects(check, key_reads_token, capsys, "W_K reads the token block")
    rejects(check, lambda layout: induction_qk(layout, sharpness=2.0), capsys, "too softly")


def test_handbuilt_models_meet_their_targets():
    layout = hb.Layout()
    toks = torch.randint(0, layout.d_vocab, (8, layout.n_ctx), generator=torch.Generator().manual_seed(0))
    assert S.previous_token_scores(hb.previous_token_model(layout), toks)[0, 0] > 0.99
    assert two_back_accuracy(hb.two_back_model(layout), toks, 2) > 0.99
    induction = hb.induction_model(layout)
    assert S.prefix_matching_scores(induction)[1, 0] >= ch08.PREFIX_TARGET
    loss = losses.repeated_token_loss(induction)
    assert loss.second < 0.25 * loss.first, loss
    # K-composition: without the previous-token head the induction head cannot find its keys
    assert S.prefix_matching_scores(induction, **losses.zero_ablation(induction, (0, 0)))[1, 0] < 0.1


def test_handbuilt_errors_name_the_fix():
    layout = hb.Layout()
    model = hb.empty_model(layout, 1)
    with pytest.raises(ValueError, match="must have shape"):
        hb.set_head(model, 0, W_Q=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="unknown block"):
        layout.block("tokens")
    with pytest.raises(ValueError, match="must match"):
        hb.copy_ov(10, 4, slice(0, 2), slice(4, 7))
