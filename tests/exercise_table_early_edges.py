"""Rows of the exercise table for chapters 1-9 that only the generated cases can judge: answers
right on every fixed case but wrong at an edge the text allows (a size the fixed cases share, a
head in another layer, a token twice inside one copy, one element squeezed away, a tiny value
next to an epsilon), answers that change the caller's inputs in place, answers of the wrong
type, and answers whose message must not name a mistake they did not make (``avoid``). Added to
``exercise_table.ROWS`` by :func:`add`.
"""

from __future__ import annotations

import torch

from attncircuits.analysis.circuits import full_ov_circuit, full_qk_circuit


def add(wrong, right, sol) -> None:
    """Append the rows (``wrong(check, label, fn, words, cls, avoid=...)``, ``right(...)``)."""
    _edges(wrong, right, sol)
    _in_place(wrong, sol)
    _types(wrong, sol)
    _not_that_mistake(wrong, sol)


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
