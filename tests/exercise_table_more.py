"""Rows of the exercise table for chapters 2, 3, 4, 6, 7 and 9 from answers nobody had written
before: the wrong layer where every case had one layer (``model.blocks[-1]`` for head 0.h, the
last layer's W_Q for layer 1's head), a threshold argument ignored, layer 0 or every layer but the
last left out, sqrt(d_model) for sqrt(d_head), a hook left on the caller's model, and slips whose
messages only said "values differ" (a repeated pair written once, torch.roll wrapping around, the
first key's missing neighbour, the second copy's queries off by one). Added to
``exercise_table.ROWS`` by :func:`add`.
"""

from __future__ import annotations

import functools
import math

import torch

from attncircuits.analysis import scores
from attncircuits.analysis.circuits import full_ov_circuit, full_qk_circuit


def add(wrong, right, sol) -> None:
    """Append the rows (``wrong(check, label, fn, words, cls, avoid=...)``, ``right(...)``)."""
    _one_layer_only(wrong, right, sol)
    _induction_heads(wrong, right, sol)
    _messages(wrong, right, sol)
    _what_the_text_allows(wrong, right, sol)


def _last(m) -> int:
    return m.cfg.n_layers - 1


def _head_term(m, t, h, layer):
    """head_logit_term with ``model.blocks[layer]``."""
    b, n = m.blocks[layer], t.shape[1]
    x = m.W_E[t] + m.W_pos[:n]
    s = (x @ b.W_Q[h]) @ (x @ b.W_K[h]).transpose(-1, -2) / m.cfg.d_head ** 0.5
    pattern = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    return pattern @ (m.W_E[t] @ b.W_V[h]) @ b.W_O[h] @ m.W_U


def _skip_score(m, h, s, d, o, n, layer):
    qk = full_qk_circuit(m, layer, h).centered(-1).rows([d])[0]
    ov = full_ov_circuit(m, layer, h).centered(-1).rows([s])[0]
    e = qk[s].exp()
    return float(e / (e + n - 1) * ov[o])


def _top(m, h, tokens, k, layer):
    n, n_keys = len(tokens), m.cfg.n_ctx // 2
    qk = full_qk_circuit(m, layer, h).centered(-1).restrict(tokens, tokens).dense()
    ov = full_ov_circuit(m, layer, h).centered(-1).restrict(tokens, tokens).dense()
    score = (qk.exp() / (qk.exp() + n_keys - 1)).T[:, :, None] * ov[:, None, :]
    best = score.flatten().topk(k).indices
    return torch.stack([tokens[best // (n * n)], tokens[best // n % n], tokens[best % n]], -1)


def _copying(m, h, layer, centre=-1):
    e = full_ov_circuit(m, layer, h).centered(centre).eigenvalues()
    return float(e.sum().real / e.abs().sum())


def _positional(m, scale, reduce="mean"):
    b, n, P = m.blocks[0], m.cfg.n_ctx, m.W_pos
    s = torch.einsum("pm,hmd->hpd", P, b.W_Q) @ torch.einsum("pm,hmd->hpd", P, b.W_K).transpose(-1, -2)
    pattern = (s / math.sqrt(scale(m.cfg))).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf).softmax(-1)
    return int(sum(getattr(pattern.diagonal(-o, -2, -1), reduce)(-1) for o in range(3)).argmax())


def _qk_terms(m, t, h, layer=1, src_layer=0, pos_first=False, scale=None):
    _, cache = m.run_with_cache(t)
    n = t.shape[1]
    emb, pos = m.W_E[t], m.W_pos[:n].expand(t.shape[0], -1, -1)
    src = torch.stack(([pos, emb] if pos_first else [emb, pos])
                      + [cache.head_out[src_layer][:, :, a] for a in range(m.cfg.n_heads)])
    b = m.blocks[layer]
    terms = torch.einsum("sbqd,tbkd->stbqk", src @ b.W_Q[h], src @ b.W_K[h])
    return terms / math.sqrt(scale or m.cfg.d_head)


def _one_layer_only(wrong, right, sol) -> None:
    """Every case of these checks had one layer (or two, for layer 1's head), so reading
    ``model.blocks[-1]`` passed: a second layer (a third) now tells it."""
    words = "model.blocks[-1]"
    wrong("ch03.check_head_logit_term", "model.blocks[-1]: the last layer, not layer 0", lambda m, t, h: _head_term(
        m, t, h, _last(m)), words, "named")
    wrong("ch03.check_ov_circuit_factors", "model.blocks[-1]", lambda m, h: (
        m.W_E @ m.blocks[-1].W_V[h], m.blocks[-1].W_O[h] @ m.W_U), words, "named")
    wrong("ch03.check_qk_circuit_factors", "model.blocks[-1]", lambda m, h: (
        m.W_E @ m.blocks[-1].W_Q[h] / m.cfg.d_head ** 0.5, (m.W_E @ m.blocks[-1].W_K[h]).T), words, "named")
    wrong("ch04.check_skip_trigram_score", "the last layer's circuits", lambda m, h, s, d, o, n: _skip_score(
        m, h, s, d, o, n, _last(m)), words, "named")
    wrong("ch04.check_top_skip_trigrams", "the last layer's circuits", lambda m, h, t, k: _top(m, h, t, k, _last(m)),
          words, "named")
    wrong("ch04.check_copying_score", "the last layer's OV circuit", lambda m, h: _copying(m, h, _last(m)), words,
          "named")
    wrong("ch06.check_qk_score_terms", "the last layer's W_Q and W_K", lambda m, t, h: _qk_terms(m, t, h, layer=-1),
          "another layer's W_Q", "named")
    wrong("ch06.check_qk_score_terms", "the sources from the layer before the last", lambda m, t, h: _qk_terms(
        m, t, h, src_layer=-2), "head sources are another layer's", "named")
    right("ch04.check_copying_score", "rows centred over the sources (PM and MP share their eigenvalues)",
          lambda m, h: _copying(m, h, 0, centre=-2))


def _induction_heads(wrong, right, sol) -> None:
    """The check called find_induction_heads with its default threshold only, on models whose
    induction heads were all in their last layer and none in layer 0."""
    C = "ch06.check_find_induction_heads"
    pm = functools.partial(scores.prefix_matching_scores, seq_len=25, n_repeats=4)

    def heads(m, threshold, keep=lambda l, m: True):
        return [(l, h) for l, h in (pm(m) > threshold).nonzero().tolist() if keep(l, m)]

    wrong(C, "the threshold argument ignored (a fixed 0.3)", lambda m, threshold=0.3: heads(m, 0.3),
          "not a fixed 0.3", "named")
    wrong(C, "layer 0 left out (no head there can do induction)", lambda m, threshold=0.3: heads(
        m, threshold, lambda l, m: l > 0), "layer 0's too", "named")
    wrong(C, "the last layer only", lambda m, threshold=0.3: heads(m, threshold, lambda l, m: l == _last(m)),
          "only at the last layer", "named")


def _messages(wrong, right, sol) -> None:
    """Wrong answers that were rejected with "values differ" or a factor that was not the mistake
    (sqrt(d_model) read as "sqrt(4), the n_heads"), now named."""
    wrong("ch03.check_qk_circuit_factors", "divided by sqrt(d_model)", lambda m, h: (
        m.W_E @ m.blocks[0].W_Q[h] / m.cfg.d_model ** 0.5, (m.W_E @ m.blocks[0].W_K[h]).T), "sqrt(d_model)", "named",
          avoid="n_heads")
    wrong("ch03.check_positional_head", "divided by sqrt(d_model)", lambda m: _positional(m, lambda c: c.d_model),
          "sqrt(d_model)", "named")
    wrong("ch03.check_positional_head", "each diagonal summed over the queries", lambda m: _positional(
        m, lambda c: c.d_head, "sum"), "summed over the queries", "named", avoid="d_head (a sum")
    wrong("ch06.check_qk_score_terms", "positions before the embedding", lambda m, t, h: _qk_terms(
        m, t, h, pos_first=True), "wrong order", "named")
    wrong("ch06.check_qk_score_terms", "divided by sqrt(d_model)", lambda m, t, h: _qk_terms(
        m, t, h, scale=m.cfg.d_model), "sqrt(d_model)", "named", avoid="n_heads")

    def written_once(t, d):
        c = torch.zeros(d, d, dtype=torch.long)
        c[t[:-1], t[1:]] += 1
        return c

    def ov_sum(m, heads):
        return sum(m.blocks[l].W_V[h] @ m.blocks[l].W_O[h] for l, h in heads)

    C = "ch06.check_copying_accuracy"
    wrong(C, "W_V W_O alone, no W_E or W_U", lambda m, hs: float((ov_sum(m, hs).argmax(-1) == torch.arange(
        m.cfg.d_model)).float().mean()), "W_V W_O alone", "named", avoid="n_heads")
    wrong(C, "a count of tokens", lambda m, hs: float(((m.W_E @ ov_sum(m, hs) @ m.W_U).argmax(-1) == torch.arange(
        m.cfg.d_vocab)).float().sum()), "divide by d_vocab", "named")

    wrong("ch02.check_bigram_counts", "C[a, b] += 1 with index tensors", written_once, "at most once", "named")
    wrong("ch02.check_bigram_counts", "the next token by torch.roll", lambda t, d: torch.bincount(
        t * d + t.roll(-1), minlength=d * d).view(d, d), "wraps around", "named")
    right("ch02.check_bigram_counts", "a sparse COO tensor, made dense", lambda t, d: torch.sparse_coo_tensor(
        torch.stack([t[:-1], t[1:]]), torch.ones(len(t) - 1, dtype=torch.long), (d, d)).to_dense())

    def smear(first):
        def f(s, w):
            masked = torch.isinf(s)
            z = s.masked_fill(masked, 0.0)
            prev = torch.cat([first(z), z[..., :-1]], -1)
            return (w[:, None, None] * z + (1 - w[:, None, None]) * prev).masked_fill(masked, float("-inf"))

        return f

    C = "ch07.check_smear_scores"
    wrong(C, "key 0's previous score taken as 0", smear(lambda z: torch.zeros_like(z[..., :1])), "not 0", "named")
    wrong(C, "torch.roll: key 0's previous is the last key", lambda s, w: smear(lambda z: z[..., -1:])(s, w),
          "wraps around", "named")

    wrong("ch09.check_induction_stripe_scores", "queries L .. 2L - 1", lambda p, L: p.diagonal(
        1 - L, -2, -1)[..., 1:1 + L].mean((0, 2)), "off by one", "named")

    def add_hook(tl, tokens, layer, head):
        tl.add_hook(f"blocks.{layer}.attn.hook_z", functools.partial(sol("zero_head_hook"), head=head))
        return tl(tokens, return_type="loss", loss_per_token=True)

    wrong("ch09.check_zero_ablated_loss", "add_hook, never removed (right values)", add_hook, "leaves 1 hook(s) on `tl`",
          "named")
    right("ch09.check_zero_ablated_loss", "the values zeroed at hook_v", lambda tl, t, l, h: tl.run_with_hooks(
        t, return_type="loss", loss_per_token=True,
        fwd_hooks=[(f"blocks.{l}.attn.hook_v", lambda v, hook: v * (torch.arange(v.shape[2]) != h)[:, None])]))


def _what_the_text_allows(wrong, right, sol) -> None:
    """Right answers in a form the exercise text allows (numpy integers where an int is asked,
    int32 counts, a numpy array where no tensor is asked), and wrong ones whose type message must
    say what the answer is (a complex number, a tensor of 16 numbers) before any fix."""
    import numpy as np

    right("ch11.check_rise_window", "numpy integers",
          lambda *a, **k: tuple(np.int64(x) for x in sol("rise_window")(*a, **k)))
    right("ch11.check_best_induction_head", "numpy integers",
          lambda *a, **k: tuple(np.int64(x) for x in sol("best_induction_head")(*a, **k)))
    wrong("ch11.check_rise_window", "a list where the text asks a tuple",
          lambda *a, **k: list(sol("rise_window")(*a, **k)), "returns a list; the exercise asks for a tuple", "named")
    wrong("ch11.check_best_induction_head", "a list where the text asks a tuple (layer, head)",
          lambda *a, **k: list(sol("best_induction_head")(*a, **k)), "returns a list; the exercise asks for a tuple",
          "named")
    wrong("ch13.check_stage_starts", "a tuple where the text asks a list",
          lambda *a, **k: tuple(sol("stage_starts")(*a, **k)), "returns a tuple; the exercise asks for a list", "named")
    wrong("ch14.check_critical_steps", "a tuple where the text asks a list",
          lambda *a, **k: tuple(sol("critical_steps")(*a, **k)), "returns a tuple; the exercise asks for a list",
          "named")
    wrong("ch14.check_trace_verdict", "the verdict in a list", lambda *a, **k: [sol("trace_verdict")(*a, **k)],
          "returns a list; the exercise asks for a str", "named")
    right("ch02.check_bigram_counts", "int32 counts", lambda *a: sol("bigram_counts")(*a).int())
    right("ch01.check_attention_pattern", "a numpy array", lambda *a: sol("attention_pattern")(*a).detach().numpy())
    wrong("ch04.check_copying_score", "complex, without .real", lambda *a: torch.tensor(complex(sol("copying_score")(*a))),
          "returns a complex 0-d tensor", "named", avoid="`float(...)` turns it into one")
    wrong("ch07.check_icl_score", "one score per row of the batch", lambda *a: torch.full((16,), float(
        sol("icl_score")(*a))), "16 numbers", "named", avoid="turns it into one")
