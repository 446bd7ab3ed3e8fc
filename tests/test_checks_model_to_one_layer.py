"""The checks of chapters 1-4 (the model, zero layers, one layer): each names the typical
mistakes it is written for, and reports bad input in one line. That every chapter's own solution
passes its checks and every stub is "not attempted yet" is tested in ``test_chapters.py``.
"""

import math

import pytest
import torch

from attncircuits.analysis.circuits import full_ov_circuit, full_qk_circuit
from attncircuits.course.exercises import ch01, ch02, ch03, ch04


# ---- typical mistakes: each check names them -------------------------------------------------------
def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def _pattern(q, k, scale=True, mask=True):
    s = q @ k.transpose(-1, -2) / (math.sqrt(q.shape[-1]) if scale else 1)
    return (s.masked_fill(~_causal(s.shape[-1]), float("-inf")) if mask else s).softmax(-1)


def _head(resid, W_pos, W_Q, W_K, W_V, W_O, pos_in_values=False):
    x = resid + W_pos[: resid.shape[1]]
    return _pattern(x @ W_Q, x @ W_K) @ ((x if pos_in_values else resid) @ W_V) @ W_O


def _counts(t, d):
    return torch.bincount(t[:-1] * d + t[1:], minlength=d * d).view(d, d)


def _kl_terms(lp, c):
    row = c.sum(-1).double()
    p = c.double() / row.clamp(min=1)[:, None]
    return torch.where(c > 0, p * (p.clamp(min=1e-300).log() - lp.double()), 0.0).sum(-1), row


def _ov(m, h):
    b = m.blocks[0]
    return m.W_E @ b.W_V[h], b.W_O[h] @ m.W_U


def _copying(m, h, centered=True):
    ov = full_ov_circuit(m, 0, h)
    e = (ov.centered(-1) if centered else ov).eigenvalues()
    return float(e.sum().real / e.abs().sum())


def _positional(m, offsets=3, pick=torch.argmax):
    P, b, n = m.W_pos, m.blocks[0], m.cfg.n_ctx
    s = torch.einsum("pm,hmd->hpd", P, b.W_Q) @ torch.einsum("pm,hmd->hpd", P, b.W_K).transpose(-1, -2)
    pat = (s / m.cfg.d_head**0.5).masked_fill(~_causal(n), float("-inf")).softmax(-1)
    return int(pick(sum(pat.diagonal(-o, -2, -1).mean(-1) for o in range(offsets))))


def _triples(m, h, t, k, centered=True):
    qk, ov = full_qk_circuit(m, 0, h), full_ov_circuit(m, 0, h)
    if centered:
        qk, ov = qk.centered(-1), ov.centered(-1)
    qk, ov = qk.restrict(t, t).dense(), ov.restrict(t, t).dense()
    a = qk.exp() / (qk.exp() + m.cfg.n_ctx // 2 - 1)
    n, best = len(t), (a.T[:, :, None] * ov[:, None, :]).flatten().topk(k).indices
    return torch.stack([t[best // (n * n)], t[best // n % n], t[best % n]], -1)


MISTAKES = [
    (ch01.check_attention_pattern, lambda q, k: _pattern(q, k, scale=False), "not divided by sqrt(d_head)"),
    (ch01.check_attention_pattern, lambda q, k: _pattern(q, k, mask=False), "causal mask is missing"),
    (ch01.check_attention_pattern, lambda q, k: _pattern(q, k).transpose(-1, -2), "causal mask is missing"),
    (ch01.check_head_output, lambda *a: _head(*a, pos_in_values=True), "positions reach the values"),
    (ch01.check_head_output, lambda r, P, Q, K, V, O: _head(r, P * 0, Q, K, V, O), "W_pos is missing"),
    (ch01.check_model_logits, lambda m, t: m.W_E[t] @ m.W_U, "the heads are missing"),
    (
        ch01.check_model_logits,
        lambda m, t: (m.W_E[t] + sum(_head(m.W_E[t], m.W_pos, b.W_Q[h], b.W_K[h], b.W_V[h], b.W_O[h])
                                     for b in m.blocks for h in range(m.cfg.n_heads))) @ m.W_U,
        "every layer read the embedding",
    ),
    (ch01.check_next_token_loss, lambda lg, t: -lg.log_softmax(-1).gather(-1, t[..., None]).mean(), "its own token"),
    (ch01.check_next_token_loss, lambda lg, t: -lg[:, :-1].log_softmax(-1).gather(-1, t[:, 1:, None]).sum(), "sum"),
    (ch02.check_bigram_table, lambda m: (m.W_E @ m.W_U).log_softmax(0), "normalised over the current token"),
    (ch02.check_bigram_table, lambda m: m.W_E @ m.W_U, "these are logits"),
    (ch02.check_bigram_counts, lambda t, d: _counts(t, d).T, "transposed"),
    (ch02.check_bigram_counts, lambda t, d: _counts(t, d).float(), "dtype torch.float32, expected torch.int64"),
    (ch02.check_bigram_counts, lambda t, d: _counts(t[:-1], d), "the last pair is missing"),
    (ch02.check_bigram_kl, lambda lp, c: float(-(c * lp).sum() / c.sum()), "this is the cross-entropy"),
    (ch02.check_bigram_kl, lambda lp, c: float(_kl_terms(lp, c)[0][c.sum(-1) > 0].mean()), "unweighted mean"),
    (
        ch02.check_bigram_correlation,
        lambda lp, c: float(torch.corrcoef(torch.stack([lp[c > 0], (c / c.sum(-1, keepdim=True))[c > 0].log()]))[0, 1]),
        "weight each by its count",
    ),
    (ch02.check_bigram_correlation, lambda lp, c: float("nan"), "nan"),
    (ch03.check_direct_path_logits, lambda m, t: (m.W_E[t] + m.W_pos[: t.shape[1]]) @ m.W_U, "W_pos was added"),
    (ch03.check_direct_path_logits, lambda m, t: m.W_E[t], "expected [2, 24, 2048]"),
    (
        ch03.check_head_logit_term,
        lambda m, t, h: _head(m.W_E[t], m.W_pos, *(getattr(m.blocks[0], w)[h] for w in ("W_Q", "W_K", "W_V", "W_O"))),
        "multiply by W_U",
    ),
    (
        ch03.check_head_logit_term,
        lambda m, t, h: _head(m.W_E[t], m.W_pos, *(getattr(m.blocks[0], w)[h] for w in ("W_Q", "W_K", "W_V", "W_O")),
                              pos_in_values=True) @ m.W_U,
        "positions reach the values",
    ),
    (ch03.check_logits_from_paths, lambda m, t: m.W_E[t] @ m.W_U, "only the direct path"),
    (ch03.check_logits_from_paths, lambda m, t: m(t) - m.W_E[t] @ m.W_U, "the direct path is missing"),
    (ch03.check_ov_circuit_factors, lambda m, h: (m.W_E @ m.blocks[0].W_Q[h], m.blocks[0].W_O[h] @ m.W_U), "used W_Q"),
    (ch03.check_ov_circuit_factors, lambda m, h: (_ov(m, h)[1].T, _ov(m, h)[0].T), "transposed"),
    (
        ch03.check_qk_circuit_factors,
        lambda m, h: (m.W_E @ m.blocks[0].W_Q[h], (m.W_E @ m.blocks[0].W_K[h]).T),
        "1/sqrt(d_head) scale is missing",
    ),
    (
        ch03.check_qk_circuit_factors,
        lambda m, h: (m.W_E @ m.blocks[0].W_K[h] / m.cfg.d_head**0.5, (m.W_E @ m.blocks[0].W_Q[h]).T),
        "queries and keys are swapped",
    ),
    (ch03.check_positional_head, lambda m: _positional(m, pick=torch.argmin), "the LEAST positional attention"),
    (ch03.check_positional_head, lambda m: 2, "right on the shipped cases but wrong on"),
    (
        ch04.check_skip_trigram_score,
        lambda m, h, s, d, o, n: float(full_qk_circuit(m, 0, h).centered(-1).rows([d])[0, s])
        * float(full_ov_circuit(m, 0, h).centered(-1).rows([s])[0, o]),
        "turn it into attention",
    ),
    (
        ch04.check_skip_trigram_score,
        lambda m, h, s, d, o, n: (lambda x: x / (x + n - 1))(full_qk_circuit(m, 0, h).rows([d])[0, s].exp()).item()
        * float(full_ov_circuit(m, 0, h).rows([s])[0, o]),
        "not centred",
    ),
    (ch04.check_top_skip_trigrams, lambda m, h, t, k: _triples(m, h, t, k)[:, [1, 0, 2]], "columns in another order"),
    (ch04.check_top_skip_trigrams, lambda m, h, t, k: _triples(m, h, t, k, centered=False), "not centred"),
    (ch04.check_nonzero_eigenvalues, lambda A, B: torch.linalg.eigvals(B @ A).real, "complex"),
    (ch04.check_nonzero_eigenvalues, lambda A, B: torch.linalg.svdvals(B @ A), "singular values"),
    (ch04.check_copying_score, lambda m, h: _copying(m, h, centered=False), "not centred"),
    (ch04.check_copying_score, lambda m, h: -_copying(m, h), "wrong sign"),
]


@pytest.mark.parametrize("check, wrong, message", MISTAKES, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(MISTAKES)])
def test_each_check_names_the_mistake(capsys, check, wrong, message):
    assert check(wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("✗") and message in out.replace("\n  ", " "), out


def test_every_check_has_at_least_two_named_mistakes():
    names = [c.__name__ for c, _, _ in MISTAKES]
    for module in (ch01, ch02, ch03, ch04):
        for name in module.__all__:
            assert names.count(name) >= 2, name


# ---- bad input on a real check: one line, nothing raised -------------------------------------------
def _ok(q, k):
    return _pattern(q, k)


def _raises(q, k):
    return q @ k  # [b, p, d] @ [b, p, d]: the shapes do not fit


def _loops(q, k):
    while True:
        pass


BAD_INPUT = [
    (lambda q, k: _ok(q, k).tolist(), "should be a torch.Tensor"),
    (lambda q, k: _ok(q, k) * float("nan"), "NaN"),
    (lambda q, k: _ok(q, k).to("meta"), "on device meta, expected cpu"),
    (lambda q, k: _ok(q, k).half(), "dtype torch.float16, expected torch.float32"),
    (_raises, "raised RuntimeError at line 2 of _raises (`return q @ k"),
    (lambda q, k: None, "None: did you forget to `return`"),
    (lambda q, k: ..., "not attempted yet"),
]


@pytest.mark.parametrize("fn, message", BAD_INPUT)
def test_bad_input_is_one_line(capsys, fn, message):
    assert ch01.check_attention_pattern(fn) is False
    out = capsys.readouterr().out
    assert message in out.replace("\n  ", " ") and "Traceback" not in out, out
    assert all(len(line) <= 79 for line in out.splitlines())


def test_a_slow_function_is_stopped_and_the_next_check_runs(capsys, monkeypatch):
    monkeypatch.setattr("attncircuits.course.exercises._core.DEFAULT_TIME_LIMIT", 0.5)
    monkeypatch.setattr(ch01.run_check, "__kwdefaults__", {**ch01.run_check.__kwdefaults__, "time_limit": 0.5})
    assert ch01.check_attention_pattern(_loops) is False
    assert "too slow: stopped waiting after 0.5 s" in capsys.readouterr().out.replace("\n  ", " ")
    assert ch01.check_attention_pattern(_ok) is True
