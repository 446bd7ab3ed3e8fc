"""Rows of the exercise table for chapters 1-9 that only the generated cases can judge: answers
right on every fixed case but wrong at an edge the text allows (a size the fixed cases share, a
head in another layer, a token twice inside one copy, one element squeezed away, a tiny value
next to an epsilon), answers that change the caller's inputs in place, answers of the wrong
type, and answers whose message must not name a mistake they did not make (``avoid``). Added to
``exercise_table.ROWS`` by :func:`add`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attncircuits.analysis.circuits import full_ov_circuit, full_qk_circuit


def add(wrong, right, sol) -> None:
    """Append the rows (``wrong(check, label, fn, words, cls, avoid=...)``, ``right(...)``)."""
    _edges(wrong, right, sol)
    _chapter_1(wrong, right)
    _in_place(wrong, sol)
    _types(wrong, sol)
    _not_that_mistake(wrong, sol)
    _package_answers(wrong)


def _heads4_logits(m, t):
    """model_logits with the chapter's four heads written in."""
    resid = m.W_E[t]
    for b in m.blocks:
        resid = resid + sum(_head(m, b, resid, h) for h in range(4))
    return resid @ m.W_U


def _head(m, b, resid, h):
    x = resid + m.W_pos[: resid.shape[1]]
    n = resid.shape[1]
    s = ((x @ b.W_Q[h]) @ (x @ b.W_K[h]).transpose(-1, -2) / b.W_Q.shape[-1] ** 0.5).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ (resid @ b.W_V[h]) @ b.W_O[h]


def _counts_from_max(t, d):
    d = int(t.max()) + 1
    return torch.bincount(t[:-1] * d + t[1:], minlength=d * d).view(d, d)


def _kl_clamped(lp, c):
    p = c.double() / c.sum(-1, keepdim=True).clamp(min=1)
    q = lp.double().exp().clamp(min=1e-8)
    kl = torch.where(c > 0, p * (p.clamp(min=1e-300).log() - q.log()), 0.0).sum(-1)
    return float((kl * c.sum(-1)).sum() / c.sum())


def _stripe_prefix(pattern, tokens, L, every=False):
    """Attention on the token after the nearest earlier copy (``every``: after each earlier copy),
    found by position, not on the keys whose previous token matches."""
    mass = [sum(pattern[:, :, q, q - j * L + 1] for j in range(1, (q // L if every else 1) + 1) if q - j * L + 1 >= 1)
            for q in range(1 + L, tokens.shape[1])]
    return torch.stack(mass, -1).mean((0, 2))


# ---- chapter 1's common mistakes, each named ---------------------------------------------------------
def _pat(q, k, scale=None, diagonal=0, k_q=False, fill=float("-inf")):
    s = k @ q.transpose(-1, -2) if k_q else q @ k.transpose(-1, -2)
    s = s / (math.sqrt(q.shape[-1]) if scale is None else scale)
    return s.masked_fill(~torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).tril(diagonal), fill).softmax(-1)


def _head1(resid, W_pos, W_Q, W_K, W_V, W_O, rows=None, swap=False, plus=False, pos_out=False):
    n = resid.shape[1]
    P = W_pos[:n] if rows is None else rows(W_pos, n)
    x = resid + P
    q, k = (x @ W_K, x @ W_Q) if swap else (x @ W_Q, x @ W_K)
    out = _pat(q, k) @ (resid @ W_V) @ W_O
    return out + (resid if plus else 0) + (P if pos_out else 0)


def _logits1(m, t, within=False, skip=True, pos=False, last=False, W_U=None, out=None):
    emb = m.W_E[t] + (m.W_pos[: t.shape[1]] if pos else 0)
    resid = emb
    for b in m.blocks:
        read = emb if last else resid
        heads = [lambda r, h=h: _head1(r, m.W_pos, b.W_Q[h], b.W_K[h], b.W_V[h], b.W_O[h]) for h in range(m.cfg.n_heads)]
        if within:
            for head in heads:
                read = read + head(read)
            resid = read
        else:
            total = sum(head(read) for head in heads)
            resid = read + total if skip else total
    logits = resid @ (m.W_U if W_U is None else W_U(m))
    return out(logits) if out else logits


def _nll1(lg, t):
    return -lg[:, :-1].log_softmax(-1).gather(-1, t[:, 1:, None])[..., 0]


def _chapter_1(wrong, right) -> None:
    C = "ch01.check_attention_pattern"
    wrong(C, "divided by d_head", lambda q, k: _pat(q, k, scale=q.shape[-1]), "divided by d_head", "named")
    wrong(C, "divided by sqrt(pos): q.shape[1]", lambda q, k: _pat(q, k, scale=math.sqrt(q.shape[1])), "sqrt(pos)", "named")
    wrong(C, "k @ q^T", lambda q, k: _pat(q, k, k_q=True), "k @ q^T", "named")
    wrong(C, "tril(-1): the diagonal masked too", lambda q, k: _pat(q, k, diagonal=-1), "tril(-1)", "named")
    wrong(C, "tril(-1) with -1e9", lambda q, k: _pat(q, k, diagonal=-1, fill=-1e9), "tril(-1)", "named")
    wrong(C, "tril(1): the next key seen", lambda q, k: _pat(q, k, diagonal=1), "tril(1)", "named")
    wrong(C, "one entry off", lambda q, k: _pat(q, k).index_put((torch.tensor(0), torch.tensor(4), torch.tensor(3)),
                                                              torch.tensor(0.5)) if q.shape[1] > 4 else _pat(q, k),
          "[batch 0, query 4, key 3]")
    right(C, "the mask filled with -1e9", lambda q, k: _pat(q, k, fill=-1e9))

    C = "ch01.check_head_output"
    wrong(C, "W_pos rows 1 to pos", lambda *a: _head1(*a, rows=lambda W, n: W[1: n + 1]), "offset by one", "named")
    wrong(C, "W_pos's last rows", lambda *a: _head1(*a, rows=lambda W, n: W[-n:]), "last pos rows", "named")
    wrong(C, "W_Q and W_K swapped", lambda *a: _head1(*a, swap=True), "swapped", "named")
    wrong(C, "resid + head", lambda *a: _head1(*a, plus=True), "resid plus the head's output", "named")
    wrong(C, "W_pos added to the output", lambda *a: _head1(*a, pos_out=True), "output has W_pos added", "named")
    wrong(C, "resid += W_pos", lambda *a: (a[0].add_(a[1][: a[0].shape[1]]), _head1(a[0], a[1] * 0, *a[2:]))[1],
          "changed `resid` in place", "named")  # a lambda *a: the stub's names

    C = "ch01.check_model_logits"
    wrong(C, "heads reading what earlier heads of their layer wrote", lambda m, t: _logits1(m, t, within=True),
          "earlier heads of its own layer", "named")
    wrong(C, "no skip connection", lambda m, t: _logits1(m, t, skip=False), "replace the residual stream", "named")
    wrong(C, "W_pos added to the stream", lambda m, t: _logits1(m, t, pos=True), "W_pos was added to the residual",
          "named")
    wrong(C, "only the last layer", lambda m, t: _logits1(m, t, last=True), "only the last layer", "named")
    wrong(C, "softmax", lambda m, t: _logits1(m, t, out=lambda x: x.softmax(-1)), "probabilities", "named")
    wrong(C, "log_softmax", lambda m, t: _logits1(m, t, out=lambda x: x.log_softmax(-1)), "log-probabilities",
          "named")
    wrong(C, "W_E.T as the unembedding", lambda m, t: _logits1(m, t, W_U=lambda m: m.W_E.T), "W_E.T", "named")
    right(C, "the heads stacked and summed", lambda m, t: _logits1(m, t))

    C = "ch01.check_next_token_loss"
    wrong(C, "torch.roll", lambda lg, t: F.cross_entropy(lg.flatten(0, 1), t.roll(-1, 1).flatten()), "torch.roll",
          "named")
    wrong(C, "log_softmax over positions", lambda lg, t: float(-lg[:, :-1].log_softmax(1).gather(-1, t[:, 1:, None])
                                                                .mean()), "over the positions", "named")
    wrong(C, "log_softmax over the batch", lambda lg, t: float(-lg[:, :-1].log_softmax(0).gather(-1, t[:, 1:, None])
                                                                .mean()), "over the batch", "named")
    wrong(C, "the last position only", lambda lg, t: F.cross_entropy(lg[:, -2], t[:, -1]), "only the last", "named")
    wrong(C, "label smoothing 0.1", lambda lg, t: F.cross_entropy(lg[:, :-1].flatten(0, 1), t[:, 1:].flatten(),
                                                                  label_smoothing=0.1), "label smoothing", "named")
    wrong(C, "summed over positions", lambda lg, t: float(_nll1(lg, t).sum(1).mean()), "sum over positions", "named")
    wrong(C, "summed over the batch", lambda lg, t: float(_nll1(lg, t).mean(1).sum()), "sum over the batch", "named")
    wrong(C, "wrong at 3 positions only", lambda logits, tokens: float(_nll1(logits, tokens).mean()) * (
        1.5 if logits.shape[1] == 3 else 1), "(logits: a 1 x 3 x 7 tensor, tokens: [[")


def _edges(wrong, right, sol) -> None:
    wrong("ch01.check_model_logits", "the chapter's four heads written in", _heads4_logits, "generated")
    wrong("ch02.check_bigram_counts", "d_vocab read from tokens.max() + 1", _counts_from_max, "expected [2048")
    wrong("ch02.check_bigram_kl", "p_table clamped at 1e-8 before the log", _kl_clamped, "generated")
    wrong("ch03.check_direct_path_logits", "squeeze() on the tokens: a batch of one loses its axis", lambda m, t: (
        m.W_E[t.squeeze()] @ m.W_U), "shape")
    wrong("ch04.check_top_skip_trigrams", "squeeze() drops the k axis when k is 1", lambda *a: sol(
        "top_skip_trigrams_of_head")(*a).squeeze(), "shape")
    wrong("ch04.check_nonzero_eigenvalues", "squeeze() leaves a 0-d tensor when k is 1", lambda A, B: torch.linalg.eigvals(
        B @ A).squeeze(), "1-D")
    wrong("ch05.check_composition_score", "1e-6 added to the denominator", lambda a, b: float(
        (a @ b).norm() / (a.norm() * b.norm() + 1e-6)), "generated")
    wrong("ch06.check_prefix_matching_score", "the nearest earlier copy's next token only", _stripe_prefix,
          "nearest earlier copy", "named")
    wrong("ch06.check_prefix_matching_score", "each earlier copy's next token, found by position",
          lambda p, t, L: _stripe_prefix(p, t, L, every=True), "twice in one copy", "named")
    wrong("ch06.check_copying_accuracy", "every head read from layer 1", lambda m, hs: float(((m.W_E @ sum(
        m.blocks[min(1, m.cfg.n_layers - 1)].W_V[h] @ m.blocks[min(1, m.cfg.n_layers - 1)].W_O[h] for _, h in hs)
        @ m.W_U).argmax(-1) == torch.arange(m.cfg.d_vocab)).float().mean()), "generated")
    wrong("ch07.check_logit_attribution", "two layers of four heads written in", lambda m, t: torch.einsum(
        "btsd,dbt->bts", torch.cat([m.W_E[t][:, :-1, None]] + [o[:, :-1, :4] for o in m.run_with_cache(t)[1].head_out[:2]],
                                   2), m.W_U[:, t[:, 1:]]), "generated")
    wrong("ch08.check_copy_ov", "an identity of size d_head, not the slice's", lambda d, h, s, t: (
        torch.zeros(d, h).index_put_((torch.arange(s.start, s.start + h).clamp(max=d - 1), torch.arange(h)),
                                     torch.ones(h)),
        torch.zeros(h, d).index_put_((torch.arange(h), torch.arange(t.start, t.start + h).clamp(max=d - 1)),
                                     torch.ones(h))), "generated")
    wrong("ch09.check_ov_copying_scores", "two layers written in", lambda tl: torch.stack([torch.stack([(
        lambda e: e.sum().real / e.abs().sum())((tl.W_E @ tl.OV[l, h] @ tl.W_U).eigenvalues)
        for h in range(tl.cfg.n_heads)]) for l in range(2)]), "generated")
    right("ch04.check_skip_trigram_score", "dense rows of the circuits, made a float", lambda m, h, s, d, o, n: (
        lambda x, y: float(torch.tensor(x).exp() / (torch.tensor(x).exp() + n - 1) * y))(
        float(full_qk_circuit(m, 0, h).centered(-1).rows([d])[0, s]), float(full_ov_circuit(m, 0, h).centered(-1)
                                                                          .rows([s])[0, o])))


def _in_place(wrong, sol) -> None:
    """Right values, but the caller's inputs are changed."""
    wrong("ch03.check_head_logit_term", "scales the model's W_Q in place", lambda m, t, h: (
        m.blocks[0].W_Q.mul_(1.0000001), sol("head_logit_term")(m, t, h))[1], "in place", "named")
    wrong("ch04.check_copying_score", "centres the model's W_U in place", lambda m, h: (
        m.W_U.sub_(m.W_U.mean(-1, keepdim=True)), sol("copying_score")(m, h))[1], "in place", "named")
    wrong("ch06.check_prefix_matching_score", "hides the [EOT] token in the caller's tokens", lambda p, t, L: (
        t.__setitem__((slice(None), 0), -1), sol("prefix_matching_score")(p, t, L))[1], "in place", "named")
    wrong("ch08.check_previous_token_qk", "normalises the rows of the caller's W_pos in place", lambda W, n, d: sol(
        "previous_token_qk")(W.div_(W.norm(dim=-1, keepdim=True)), n, d), "in place", "named")
    wrong("ch09.check_induction_stripe_scores", "zeroes the [EOT] column of the caller's pattern", lambda p, L: (
        p.__setitem__((Ellipsis, 0), 0.0), sol("induction_stripe_scores")(p, L))[1], "in place", "named")
    wrong("ch01.check_model_logits", "leaves a forward hook on the caller's model", lambda m, t: (
        m.register_forward_hook(lambda *a: None), sol("model_logits")(m, t))[1], "leaves 1 hook(s) on `m`", "named")


def _types(wrong, sol) -> None:
    """The text asks for a float: a 0-d tensor is not one."""
    for check, name in (("ch02.check_bigram_kl", "bigram_kl"), ("ch02.check_bigram_correlation", "bigram_correlation"),
                        ("ch05.check_k_composition_score", "k_composition_score"), ("ch07.check_icl_score", "icl_score")):
        wrong(check, "a 0-d tensor", lambda *a, name=name: torch.tensor(sol(name)(*a)), "0-d tensor", "named")


def _not_that_mistake(wrong, sol) -> None:
    """Wrong answers whose messages once guessed a mistake they did not make."""
    wrong("ch01.check_attention_pattern", "scores, not softmaxed (no mask either)", lambda q, k: q @ k.transpose(-1, -2)
          / q.shape[-1] ** 0.5, "softmax", "named", avoid="mask is missing")
    wrong("ch03.check_head_logit_term", "the embedding, not the head's output", lambda m, t, h: m.W_E[t], "shape",
          avoid="head's output in the residual stream")
    wrong("ch09.check_zero_ablated_loss", "the summed loss", lambda tl, t, l, h: sol("zero_ablated_loss")(tl, t, l, h).sum(),
          "shape", avoid="mean loss")


def _package_answers(wrong) -> None:
    """The package's own answer called in place of the exercise's work: refused by name."""
    from attncircuits.analysis import circuits
    from attncircuits.analysis.circuits.composition import random_composition_scores
    from attncircuits.models.parts import loss_fn

    said = "the package's own answer"
    wrong("ch01.check_model_logits", "the model's own forward pass", lambda m, t: m(t), said, "named")
    wrong("ch01.check_model_logits", "forward_checked", lambda m, t: m.forward_checked(t), said, "named")
    wrong("ch01.check_next_token_loss", "the package's loss_fn", lambda lg, t: loss_fn(lg, t), said, "named")
    # passed as the answer itself, a decorated function (torch.no_grad) among them
    wrong("ch06.check_qk_score_terms", "qk_score_terms passed as the answer",
          __import__("attncircuits.analysis.attribution", fromlist=["x"]).qk_score_terms, said, "named")
    wrong("ch01.check_next_token_loss", "loss_fn passed as the answer", loss_fn, said, "named")
    wrong("ch05.check_k_composition_score", "composition_score",
          lambda m, w, r: circuits.composition_score(m, "k", (0, w), (1, r)), said, "named")
    wrong("ch05.check_random_composition_scores", "random_composition_scores",
          lambda d, h, n, s=0: random_composition_scores(d, h, n, s), said, "named")
    wrong("ch05.check_virtual_ov", "virtual_ov_circuit",
          lambda m, w, r: circuits.virtual_ov_circuit(m, w, r).dense(), said, "named")
    wrong("ch05.check_first_order_loss", "term_importance",
          lambda m, t: circuits.term_importance(m, t).first_order, said, "named")
    hb = __import__("attncircuits.models.handbuilt", fromlist=["x"])
    wrong("ch08.check_previous_token_qk", "the package's previous_token_qk", hb.previous_token_qk, said, "named")
    wrong("ch08.check_copy_ov", "the package's copy_ov", hb.copy_ov, said, "named")
    wrong("ch08.check_two_back_model", "the package's two_back_model", lambda layout: hb.two_back_model(layout), said,
          "named")
    wrong("ch08.check_induction_qk", "the package's induction_qk", lambda layout: hb.induction_qk(layout), said,
          "named")
    _package_answers_2_to_7(wrong, said)
    _package_answers_9_to_12(wrong, said)


def _package_answers_2_to_7(wrong, said) -> None:
    from attncircuits.analysis import circuits, losses
    from attncircuits.analysis import scores as S
    from attncircuits.analysis.attribution import logit_attribution, qk_score_terms
    from attncircuits.course.exercises._core import random_model
    from attncircuits.models import smeared

    wrong("ch02.check_bigram_table", "bigram_log_probs", lambda m: circuits.bigram_log_probs(m, direct_path=True), said,
          "named")
    wrong("ch02.check_bigram_counts", "the package's count_bigrams", circuits.count_bigrams, said, "named")
    wrong("ch02.check_bigram_kl", "compare_bigram_tables' KL", lambda lp, c: circuits.compare_bigram_tables(lp, c).kl,
          said, "named")
    wrong("ch02.check_bigram_correlation", "compare_bigram_tables' Pearson",
          lambda lp, c: circuits.compare_bigram_tables(lp, c).pearson, said, "named")
    wrong("ch03.check_direct_path_logits", "path_expansion's direct term",
          lambda m, t: circuits.path_expansion(m, t).direct, said, "named")
    wrong("ch03.check_head_logit_term", "path_expansion's head term",
          lambda m, t, h: circuits.path_expansion(m, t).heads[:, :, h], said, "named")
    wrong("ch03.check_logits_from_paths", "path_expansion's total", lambda m, t: circuits.path_expansion(m, t).total,
          said, "named")
    wrong("ch03.check_ov_circuit_factors", "full_ov_circuit's factors",
          lambda m, h: (lambda ov: (ov.A, ov.B))(circuits.full_ov_circuit(m, 0, h)), said, "named")
    wrong("ch03.check_qk_circuit_factors", "full_qk_circuit's factors",
          lambda m, h: (lambda qk: (qk.A, qk.B))(circuits.full_qk_circuit(m, 0, h)), said, "named")
    wrong("ch03.check_qk_circuit_factors", "qk_circuit_parts' token-token part",
          lambda m, h: (lambda qk: (qk.A, qk.B))(circuits.qk_circuit_parts(m, 0, h).token_token), said, "named")
    wrong("ch04.check_top_skip_trigrams", "top_skip_trigrams",
          lambda m, h, t, k: circuits.top_skip_trigrams(m, 0, k, heads=[h], tokens=t).triples(h), said, "named")
    wrong("ch04.check_nonzero_eigenvalues", "FactoredMatrix.eigenvalues",
          lambda A, B: circuits.FactoredMatrix(A, B).eigenvalues(), said, "named")
    wrong("ch04.check_copying_score", "copying_summary",
          lambda m, h: float(circuits.copying_summary(m, 0, n_shuffles=0).eigen_score[h]), said, "named")
    wrong("ch06.check_previous_token_score", "previous_token_scores on a model of its own", lambda p: (
        S.previous_token_scores(random_model(n_layers=1, seed=0, n_ctx=p.shape[-1]),
                                torch.zeros(1, p.shape[-1], dtype=torch.long))[0]), said, "named")
    wrong("ch06.check_prefix_matching_score", "prefix_matching_scores on a model of its own", lambda p, t, L: (
        S.prefix_matching_scores(random_model(n_layers=1, seed=0, n_ctx=t.shape[1]), seq_len=L,
                                 n_repeats=(t.shape[1] - 1) // L)[0]), said, "named")
    wrong("ch06.check_ablated_loss", "losses.ablated_loss", lambda m, t, h, mode: losses.ablated_loss(m, t, h, "zero"),
          said, "named")
    wrong("ch06.check_qk_score_terms", "the package's qk_score_terms", lambda m, t, h: qk_score_terms(m, t, h), said,
          "named")
    wrong("ch06.check_copying_accuracy", "ov_copying_accuracy", lambda m, hs: circuits.ov_copying_accuracy(m, hs), said,
          "named")
    wrong("ch07.check_icl_score", "icl_scores_per_row", lambda n, late, early: float(
        losses.icl_scores_per_row(n, n.shape[1] + 1, late, early).mean()), said, "named")
    wrong("ch07.check_icl_score", "icl_score_from_loss", lambda n, late, early: losses.icl_score_from_loss(
        n.mean(0), n.shape[1] + 1, late, early), said, "named")
    wrong("ch07.check_copy_losses", "RepeatedLossCurve.copy_means", lambda loss, L, n: losses.RepeatedLossCurve(
        loss, L, n).copy_means(), said, "named")
    wrong("ch07.check_smear_scores", "the package's smear_scores", smeared.smear_scores, said, "named")
    wrong("ch07.check_logit_attribution", "the package's logit_attribution", lambda m, t: logit_attribution(m, t), said,
          "named")


def _package_answers_9_to_12(wrong, said) -> None:
    import functools

    import numpy as np

    from attncircuits.analysis import circuit_check as cc
    from attncircuits.analysis import deeper, phase
    from attncircuits.analysis.circuits import copying_summary
    from attncircuits.course import grader
    from attncircuits.course.exercises import ch11
    from attncircuits.models import interop

    wrong("ch09.check_induction_stripe_scores", "the package's induction_stripe_scores", interop.induction_stripe_scores,
          said, "named")
    wrong("ch09.check_zero_ablated_loss", "the package's zero_head_hook", lambda tl, t, l, h: tl.run_with_hooks(
        t, return_type="loss", loss_per_token=True,
        fwd_hooks=[(f"blocks.{l}.attn.hook_z", functools.partial(interop.zero_head_hook, head=h))]), said, "named")
    wrong("ch09.check_ov_copying_scores", "the package's ov_copying_scores", interop.ov_copying_scores, said, "named")
    wrong("ch09.check_ov_copying_scores", "copying_summary of each layer", lambda tl: (lambda m: torch.stack([
        copying_summary(m, l, n_shuffles=0).eigen_score for l in range(m.cfg.n_layers)]))(
        interop.from_transformer_lens(tl)), said, "named")
    wrong("ch10.check_fold_ln_into", "the package's fold_ln_into", deeper.fold_ln_into, said, "named")
    wrong("ch10.check_fold_ln_into", "TransformerLens's ProcessWeights", _tl_fold, said, "named")
    wrong("ch10.check_frozen_ln", "the package's frozen_ln", lambda comps, resid: deeper.frozen_ln(comps, resid), said,
          "named")
    wrong("ch10.check_loss_bump", "the package's loss_bump", deeper.loss_bump, said, "named")
    wrong("ch11.check_rise_window", "phase.rise", lambda s, v, lo=0.2, hi=0.8: (lambda r: (r.start_step, r.end_step))(
        phase.rise(s, v, lo, hi)), said, "named")
    wrong("ch11.check_rise_window", "the check's own rise_window", ch11.rise_window, said, "named")
    wrong("ch11.check_best_induction_head", "phase.phase_change's head", lambda pm: phase.phase_change(
        {"step": list(range(len(pm))), "prefix_matching": pm}, threshold=float("inf")).head, said, "named")
    wrong("ch11.check_loss_pca_2d", "phase.loss_pca", lambda x: torch.from_numpy(phase.loss_pca(
        {"all": np.asarray(x, dtype=np.float64)}).coords["all"]), said, "named")
    wrong("ch12.check_copy_attention", "the package's copy_attention", cc.copy_attention, said, "named")
    wrong("ch12.check_copy_attention", "the reference's own body: attention_to with match_targets",
          lambda pattern, tokens, shift: cc.attention_to(pattern[None], cc.match_targets(tokens, shift))[0], said,
          "named")
    wrong("ch12.check_circuit_shares", "the package's circuit_shares", cc.circuit_shares, said, "named")
    wrong("ch12.check_grammar_2", "model_grammar", lambda model, task: cc.model_grammar(model, task), said, "named")
    wrong("ch12.check_answer_paths", "the package's answer_paths", lambda model, tokens: cc.answer_paths(model, tokens),
          said, "named")
    for name, find in (("mystery-2", "derive_circuit"), ("mystery-3", "measure_ground_truth")):
        def found(name=name, find=find):  # the package's function looked up when called, as a learner's would be
            g = grader.grader_for(name)
            circuit = getattr(cc, find)(g.model, g.task)
            return {"model": name, "heads": circuit["heads"], "compositions": circuit["compositions"]}

        wrong(f"ch12.check_mystery_{name[-1]}", f"{find} of {name}", found, said, "named")
    for name in ("mystery-2", "mystery-3"):  # the ground truth shipped beside the model: read, not found
        def stored(name=name):
            from attncircuits.analysis.hypothesis import from_truth
            from attncircuits.checkpoints.mysteries import load_mystery
            return from_truth(name, load_mystery(name).ground_truth)

        def stored_file(name=name):  # through the store's own reader
            from attncircuits.analysis.hypothesis import from_truth
            from attncircuits.checkpoints import mysteries as store
            return from_truth(name, store.read_ground_truth(store.MYSTERY_DIR / name))

        wrong(f"ch12.check_mystery_{name[-1]}", f"{name}'s ground_truth", stored, "`Mystery.ground_truth`", "named")
        wrong(f"ch12.check_mystery_{name[-1]}", f"{name}'s ground truth by read_ground_truth", stored_file,
              "`read_ground_truth`", "named")

    def listed():  # the package's own skip-trigram lists of mystery 2's heads
        from attncircuits.analysis.grammar_heads import head_skip_trigrams, skip_trigram_names
        g = grader.grader_for("mystery-2")
        return {"model": "mystery-2", "heads": {"0.0": "skip-trigram", "0.1": "skip-trigram"},
                "skip_trigrams": {f"0.{h[1]}": skip_trigram_names(g.task, v)
                                  for h, v in head_skip_trigrams(g.model, g.task).items()}}

    def listed_by_grader():  # the grader's own measurement, asked for the answer
        g = grader.grader_for("mystery-2")
        return {"model": "mystery-2", "heads": {"0.0": "skip-trigram", "0.1": "skip-trigram"},
                "skip_trigrams": {f"0.{h}": [tuple(g.task.token_names()[x] for x in t) for t in g.skip_trigrams.of(h)]
                                  for h in range(2)}}

    wrong("ch12.check_mystery_2", "head_skip_trigrams", listed, said, "named")
    wrong("ch12.check_mystery_2", "the grader's SkipTrigrams.of", listed_by_grader, "`SkipTrigrams.of`", "named")


def _tl_fold(w_ln, b_ln, W, b):
    """exercise 10.1 from TransformerLens's own LayerNorm fold, then centred."""
    from transformer_lens.weight_processing import ProcessWeights

    W_f = ProcessWeights.fold_layer_norm_weight_single(W, w_ln)
    return W_f - W_f.mean(-2, keepdim=True), ProcessWeights.fold_layer_norm_bias_single(W, b, b_ln)
