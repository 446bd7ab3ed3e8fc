"""A table of answers to the 55 exercise checks: wrong answers, each with the words its message
must contain, and correct answers written another way, which must pass.

Every wrong answer is one of two message classes: ``named`` (the message names the mistake) or
``symptom`` (it names what is wrong with the output: all zeros, NaN where, the wrong sign, a
shift by one, a factor of 100, another head's answer, ...). Most are built from the solved
notebooks' own solutions by one transform each, so they are the realistic slips of a learner who
had it almost right; the rest are the mistakes each exercise's text warns about.

``python tests/exercise_table.py`` prints the counts (accepted, raising, named, symptom, vague,
misleading); ``tests/test_exercise_table.py`` asserts them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import exercise_table_ch08
import exercise_table_ch13
import exercise_table_edges
import exercise_table_more

from attncircuits.course.exercises.make_learner import chapters
from attncircuits.analysis.circuit_check import model_grammar
from attncircuits.analysis.circuits import full_ov_circuit

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [path.stem for path in chapters(ROOT)]  # the one chapter list: _toc.yml's


@functools.lru_cache(maxsize=None)
def solutions() -> dict:
    """Every chapter's solution functions, from the solved notebooks' cells tagged ``solution``."""
    from attncircuits import loss_fn
    from attncircuits.analysis import scores as S
    from attncircuits.models import handbuilt

    ns = {"math": math, "functools": functools, "torch": torch, "S": S, "hb": handbuilt, "loss_fn": loss_fn}
    for ch in CHAPTERS:
        nb = json.loads((ROOT / "notebooks" / f"{ch}.ipynb").read_text())
        for c in nb["cells"]:
            if c["cell_type"] == "code" and "solution" in c["metadata"].get("tags", []):
                exec(compile("".join(c["source"]), f"<solution {ch[:2]}>", "exec"), ns)
    return ns


@dataclass
class Row:
    check: str  # "ch01.check_attention_pattern"
    label: str
    fn: Callable
    expect: str  # "pass", "named" or "symptom"
    words: str = ""  # what the message must contain (for a wrong answer)
    avoid: str = ""  # words it must not contain (a guess at a mistake this answer did not make)


def _sol(name):
    return lambda *a, **k: solutions()[name](*a, **k)


# ---- transforms of a right answer ------------------------------------------------------------------
def _map(out, f):
    if isinstance(out, torch.Tensor):
        return f(out)
    if isinstance(out, (tuple, list)):
        return type(out)(_map(o, f) for o in out)
    return f(torch.tensor(float(out))).item()


def zeros(name):
    return lambda *a: _map(solutions()[name](*a), lambda t: torch.zeros_like(t))


def negated(name):
    return lambda *a: _map(solutions()[name](*a), lambda t: -t)


def times(name, c):
    return lambda *a: _map(solutions()[name](*a), lambda t: t * c)


def with_nan(name, where="first"):
    def f(t):
        t = t.clone()
        if where == "upper":
            n = t.shape[-1]
            t[..., torch.ones(n, n, dtype=torch.bool).triu(1)] = float("nan")
        else:
            t.view(-1)[0] = float("nan")
        return t

    return lambda *a: _map(solutions()[name](*a), f)


def rolled(name, dim):
    return lambda *a: _map(solutions()[name](*a), lambda t: t.roll(1, dim))


def transposed(name):
    return lambda *a: _map(solutions()[name](*a), lambda t: t.transpose(-1, -2))


def other_arg(name, index, change):
    """The solution called with argument ``index`` changed (another head, layer, ...)."""

    def f(*a):
        a = list(a)
        a[index] = change(a[index], a)
        return solutions()[name](*a)

    return f


def in_float64(name):
    """The right answer computed in float64 (models and tensors converted)."""

    def conv(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.double()
        if isinstance(x, torch.nn.Module):
            return copy.deepcopy(x).double()
        return x

    return lambda *a: solutions()[name](*[conv(x) for x in a])


ROWS: list[Row] = []


def wrong(check, label, fn, words, cls="symptom", avoid=""):
    ROWS.append(Row(check, label, fn, cls, words, avoid))


def right(check, label, fn):
    ROWS.append(Row(check, label, fn, "pass"))


def _other_head(h, a):
    return (h + 1) % 4


def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


# ---- chapter 1 -------------------------------------------------------------------------------------
C = "ch01.check_attention_pattern"


def _pat(q, k, scale=True, mask=True, dim=-1):
    s = q @ k.transpose(-1, -2) / (math.sqrt(q.shape[-1]) if scale else 1)
    if mask:
        s = s.masked_fill(~_causal(s.shape[-1]), float("-inf"))
    return s.softmax(dim)


wrong(C, "no 1/sqrt(d_head)", lambda q, k: _pat(q, k, scale=False), "sqrt(d_head)", "named")
wrong(C, "no mask", lambda q, k: _pat(q, k, mask=False), "causal mask is missing", "named")
wrong(C, "softmax over queries", lambda q, k: _pat(q, k, dim=-2), "query axis", "named")
wrong(C, "all zeros", zeros("attention_pattern"), "all zeros")
wrong(C, "NaN in the masked entries", with_nan("attention_pattern", "upper"), "above the diagonal")
wrong(C, "scores, not softmaxed", lambda q, k: q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), "softmax over the keys",
      "named")
right(C, "torch.where and exp / sum", lambda q, k: (lambda s: s.exp() / s.exp().sum(-1, keepdim=True))(
    torch.where(_causal(q.shape[1]), q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -torch.inf)))
right(C, "in float64", in_float64("attention_pattern"))

C = "ch01.check_head_output"
wrong(C, "all zeros", zeros("head_output"), "all zeros")
wrong(C, "NaN", with_nan("head_output"), "NaN")
wrong(C, "wrong sign", negated("head_output"), "wrong sign")
wrong(C, "positions in values", lambda r, P, Q, K, V, O: solutions()["attention_pattern"](
    (r + P[: r.shape[1]]) @ Q, (r + P[: r.shape[1]]) @ K) @ ((r + P[: r.shape[1]]) @ V) @ O, "positions reach the values",
    "named")
wrong(C, "no W_pos", lambda r, P, Q, K, V, O: solutions()["attention_pattern"](r @ Q, r @ K) @ (r @ V) @ O,
      "W_pos is missing", "named")
wrong(C, "times 100", times("head_output", 100.0), "100")
right(C, "einsum", lambda r, P, Q, K, V, O: torch.einsum(
    "bqk,bkd,dm->bqm", solutions()["attention_pattern"]((r + P[: r.shape[1]]) @ Q, (r + P[: r.shape[1]]) @ K),
    r @ V, O))
right(C, "in float64", in_float64("head_output"))

C = "ch01.check_model_logits"
wrong(C, "no heads", lambda m, t: m.W_E[t] @ m.W_U, "heads are missing", "named")
wrong(C, "all zeros", zeros("model_logits"), "all zeros")
wrong(C, "NaN", with_nan("model_logits"), "NaN")
wrong(C, "wrong sign", negated("model_logits"), "wrong sign")
wrong(C, "shifted by one position", rolled("model_logits", 1), "shifted by one")
wrong(C, "in bits", times("model_logits", 1 / math.log(2)), "ln 2")
wrong(C, "the model's forward", lambda m, t: m(t), "the package's own answer", "named")
right(C, "in float64", in_float64("model_logits"))

C = "ch01.check_next_token_loss"
wrong(C, "own token", lambda lg, t: -lg.log_softmax(-1).gather(-1, t[..., None]).mean(), "its own token", "named")
wrong(C, "sum", lambda lg, t: -lg[:, :-1].log_softmax(-1).gather(-1, t[:, 1:, None]).sum(), "sum", "named")
wrong(C, "zero", lambda lg, t: 0.0, "got 0")
wrong(C, "NaN", lambda lg, t: float("nan"), "nan")
wrong(C, "negated", negated("next_token_loss"), "wrong sign")
wrong(C, "in bits", times("next_token_loss", 1 / math.log(2)), "ln 2")
right(C, "cross_entropy", lambda lg, t: torch.nn.functional.cross_entropy(lg[:, :-1].flatten(0, 1), t[:, 1:].flatten()))
right(C, "a float in float64", lambda lg, t: float(solutions()["next_token_loss"](lg.double(), t)))

# ---- chapter 2 -------------------------------------------------------------------------------------
C = "ch02.check_bigram_table"
wrong(C, "logits", lambda m: m.W_E @ m.W_U, "logits", "named")
wrong(C, "over axis 0", lambda m: (m.W_E @ m.W_U).log_softmax(0), "normalised over the current token", "named")
wrong(C, "probabilities", lambda m: (m.W_E @ m.W_U).softmax(-1), "probabilities", "named")
wrong(C, "zeros", zeros("bigram_table"), "all zeros")
wrong(C, "log2", times("bigram_table", 1 / math.log(2)), "ln 2")
wrong(C, "transposed", transposed("bigram_table"), "transposed")
right(C, "log of softmax", lambda m: (m.W_E @ m.W_U).softmax(-1).log())
right(C, "minus logsumexp", lambda m: (lambda x: x - x.logsumexp(-1, keepdim=True))(m.W_E @ m.W_U))

C = "ch02.check_bigram_counts"


def _counts(t, d):
    return torch.bincount(t[:-1] * d + t[1:], minlength=d * d).view(d, d)


def _loop_counts(t, d):
    c = torch.zeros(d, d, dtype=torch.long)
    for a, b in zip(t[:-1], t[1:]):
        c[a, b] += 1
    return c


wrong(C, "transposed", lambda t, d: _counts(t, d).T, "transposed")
wrong(C, "two apart", lambda t, d: torch.bincount(t[:-2] * d + t[2:], minlength=d * d).view(d, d), "two tokens apart",
      "named")
wrong(C, "last pair missing", lambda t, d: _counts(t[:-1], d), "last pair is missing", "named")
wrong(C, "zeros", lambda t, d: torch.zeros(d, d, dtype=torch.long), "all zeros")
wrong(C, "a per-token Python loop", _loop_counts, "loop", "named")
wrong(C, "doubled", lambda t, d: 2 * _counts(t, d), "2")
right(C, "index_put_ accumulate", lambda t, d: torch.zeros(d, d, dtype=torch.long).index_put_(
    (t[:-1], t[1:]), torch.ones(len(t) - 1, dtype=torch.long), accumulate=True))
right(C, "unique with counts", lambda t, d: (lambda u, n: torch.zeros(d * d, dtype=torch.long).index_put_(
    (u,), n))(*torch.unique(t[:-1] * d + t[1:], return_counts=True)).view(d, d))

C = "ch02.check_bigram_kl"
wrong(C, "cross-entropy", lambda lp, c: float(-(c * lp).sum() / c.sum()), "cross-entropy", "named")
wrong(C, "zero", lambda lp, c: 0.0, "got 0")
wrong(C, "NaN from 0 log 0", lambda lp, c: float((c / c.sum(-1, keepdim=True) * ((c / c.sum(-1, keepdim=True)).log()
                                                                                  - lp)).sum() / c.sum()), "nan")
wrong(C, "negated", negated("bigram_kl"), "wrong sign")
wrong(C, "in bits", times("bigram_kl", 1 / math.log(2)), "ln 2")
wrong(C, "sum over tokens", lambda lp, c: float(torch.where(c > 0, (c / c.sum(-1, keepdim=True).clamp(min=1)) * (
    (c / c.sum(-1, keepdim=True).clamp(min=1)).clamp(min=1e-300).log() - lp), 0.0).sum()), "summed", "named")
right(C, "xlogy", lambda lp, c: float((lambda p, w: ((torch.special.xlogy(p, p) - torch.where(
    c > 0, p * lp.double(), 0.0)).sum(-1) * w).sum() / w.sum())(c.double() / c.sum(-1, keepdim=True).clamp(min=1),
                                                                  c.sum(-1).double())))
right(C, "in float64 inputs", in_float64("bigram_kl"))

C = "ch02.check_bigram_correlation"
wrong(C, "unweighted", lambda lp, c: float(torch.corrcoef(torch.stack(
    [lp[c > 0], (c / c.sum(-1, keepdim=True))[c > 0].log()]))[0, 1]), "weight each by its count", "named")
wrong(C, "zero", lambda lp, c: 0.0, "got 0")
wrong(C, "NaN", lambda lp, c: float("nan"), "nan")
wrong(C, "negated", negated("bigram_correlation"), "wrong sign")
wrong(C, "a percentage", times("bigram_correlation", 100.0), "100")
right(C, "torch.cov with weights", lambda lp, c: (lambda a, b: (lambda x, y, n: float(
    (lambda m: m[0, 1] / (m[0, 0] * m[1, 1]).sqrt())(torch.cov(torch.stack([x, y]), aweights=n))))(
    lp[a, b].double(), (c[a, b].double() / c.sum(-1)[a].double()).log(), c[a, b].double()))(*c.nonzero(as_tuple=True)))
right(C, "in float64 inputs", in_float64("bigram_correlation"))

# ---- chapter 3 -------------------------------------------------------------------------------------
C = "ch03.check_direct_path_logits"
wrong(C, "W_pos added", lambda m, t: (m.W_E[t] + m.W_pos[: t.shape[1]]) @ m.W_U, "W_pos was added", "named")
wrong(C, "zeros", zeros("direct_path_logits"), "all zeros")
wrong(C, "NaN", with_nan("direct_path_logits"), "NaN")
wrong(C, "negated", negated("direct_path_logits"), "wrong sign")
wrong(C, "shifted", rolled("direct_path_logits", 1), "shifted by one")
wrong(C, "in bits", times("direct_path_logits", 1 / math.log(2)), "ln 2")
right(C, "one-hot", lambda m, t: torch.nn.functional.one_hot(t, m.cfg.d_vocab).float() @ m.W_E @ m.W_U)
right(C, "in float64", in_float64("direct_path_logits"))

C = "ch03.check_head_logit_term"
wrong(C, "another head", other_arg("head_logit_term", 2, _other_head), "answer for head", "named")
wrong(C, "zeros", zeros("head_logit_term"), "all zeros")
wrong(C, "NaN", with_nan("head_logit_term"), "NaN")
wrong(C, "negated", negated("head_logit_term"), "wrong sign")
wrong(C, "shifted", rolled("head_logit_term", 1), "shifted by one")
wrong(C, "no scale", lambda m, t, h: solutions()["head_logit_term"](m, t, h) * 0 + (lambda b, x: (
    (x @ b.W_Q[h]) @ (x @ b.W_K[h]).transpose(-1, -2)).masked_fill(~_causal(t.shape[1]), -torch.inf).softmax(-1)
    @ (m.W_E[t] @ b.W_V[h]) @ b.W_O[h] @ m.W_U)(m.blocks[0], m.W_E[t] + m.W_pos[: t.shape[1]]), "sqrt(d_head)", "named")
right(C, "from the cache", lambda m, t, h: m.run_with_cache(t)[1].head_out[0][:, :, h] @ m.W_U)
right(C, "in float64", in_float64("head_logit_term"))

C = "ch03.check_logits_from_paths"
wrong(C, "direct only", _sol("direct_path_logits"), "only the direct path", "named")
wrong(C, "no direct", lambda m, t: m(t) - m.W_E[t] @ m.W_U, "direct path is missing", "named")
wrong(C, "zeros", zeros("logits_from_paths"), "all zeros")
wrong(C, "NaN", with_nan("logits_from_paths"), "NaN")
wrong(C, "negated", negated("logits_from_paths"), "wrong sign")
wrong(C, "mean of heads", lambda m, t: solutions()["direct_path_logits"](m, t) + sum(
    solutions()["head_logit_term"](m, t, h) for h in range(m.cfg.n_heads)) / m.cfg.n_heads, "mean", "named")
right(C, "the model", lambda m, t: m(t))
right(C, "in float64", in_float64("logits_from_paths"))

C = "ch03.check_ov_circuit_factors"
wrong(C, "W_Q", lambda m, h: (m.W_E @ m.blocks[0].W_Q[h], m.blocks[0].W_O[h] @ m.W_U), "used W_Q", "named")
wrong(C, "another head", other_arg("ov_circuit_factors", 1, _other_head), "answer for head", "named")
wrong(C, "zeros", zeros("ov_circuit_factors"), "all zeros")
wrong(C, "negated", lambda m, h: (lambda a, b: (-a, b))(*solutions()["ov_circuit_factors"](m, h)), "wrong sign")
wrong(C, "NaN", with_nan("ov_circuit_factors"), "NaN")
right(C, "another split", lambda m, h: (m.W_E @ m.blocks[0].W_V[h] * 2, m.blocks[0].W_O[h] @ m.W_U / 2))
right(C, "in float64", in_float64("ov_circuit_factors"))

C = "ch03.check_qk_circuit_factors"
wrong(C, "no scale", lambda m, h: (m.W_E @ m.blocks[0].W_Q[h], (m.W_E @ m.blocks[0].W_K[h]).T), "1/sqrt(d_head)", "named")
wrong(C, "swapped", lambda m, h: (m.W_E @ m.blocks[0].W_K[h] / m.cfg.d_head ** 0.5, (m.W_E @ m.blocks[0].W_Q[h]).T),
      "swapped", "named")
wrong(C, "another head", other_arg("qk_circuit_factors", 1, _other_head), "answer for head", "named")
wrong(C, "zeros", zeros("qk_circuit_factors"), "all zeros")
wrong(C, "divided by d_head", lambda m, h: (lambda a, b: (a / m.cfg.d_head ** 0.5, b))(
    *solutions()["qk_circuit_factors"](m, h)), "sqrt")
right(C, "scale on the keys", lambda m, h: (m.W_E @ m.blocks[0].W_Q[h], (m.W_E @ m.blocks[0].W_K[h]).T / m.cfg.d_head ** 0.5))
right(C, "in float64", in_float64("qk_circuit_factors"))

C = "ch03.check_positional_head"


def _positional(m, mask=True, scale=True, dim=-1, layer=0, offsets=3, pick=torch.argmax):
    b, n, P = m.blocks[layer], m.cfg.n_ctx, m.W_pos
    s = torch.einsum("pm,hmd->hpd", P, b.W_Q) @ torch.einsum("pm,hmd->hpd", P, b.W_K).transpose(-1, -2)
    s = s / (m.cfg.d_head ** 0.5 if scale else 1)
    if mask:
        s = s.masked_fill(~_causal(n), float("-inf"))
    pat = s.softmax(dim)
    return int(pick(sum(pat.diagonal(-o, -2, -1).mean(-1) for o in range(offsets))))


wrong(C, "no causal mask", lambda m: _positional(m, mask=False), "mask", "named")
wrong(C, "softmax over queries", lambda m: _positional(m, dim=-2), "query", "named")
wrong(C, "no 1/sqrt(d_head)", lambda m: _positional(m, scale=False), "sqrt(d_head)", "named")
wrong(C, "layer 1's weights", lambda m: _positional(m, layer=m.cfg.n_layers - 1), "layer", "named")
wrong(C, "the least", lambda m: _positional(m, pick=torch.argmin), "LEAST", "named")
wrong(C, "offset 0 only", lambda m: _positional(m, offsets=1), "offset 0", "named")
right(C, "a loop over heads", lambda m: max(range(m.cfg.n_heads), key=lambda h: float(sum(
    (lambda p: p.diagonal(-o).mean())((((m.W_pos @ m.blocks[0].W_Q[h]) @ (m.W_pos @ m.blocks[0].W_K[h]).T)
                                        / m.cfg.d_head ** 0.5).masked_fill(~_causal(m.cfg.n_ctx), -torch.inf)
                                       .softmax(-1)) for o in range(3)))))
wrong(C, "a tensor index (the text asks an int)", lambda m: torch.tensor(solutions()["positional_head"](m)),
      "0-d tensor", "named")
right(C, "a numpy integer made an int", lambda m: int(__import__("numpy").int64(solutions()["positional_head"](m))))

# ---- chapter 4 -------------------------------------------------------------------------------------
C = "ch04.check_skip_trigram_score"
wrong(C, "no attention", lambda m, h, s, d, o, n: float(
    __import__("attncircuits.analysis.circuits", fromlist=["x"]).full_qk_circuit(m, 0, h).centered(-1).rows([d])[0, s]) * float(
    __import__("attncircuits.analysis.circuits", fromlist=["x"]).full_ov_circuit(m, 0, h).centered(-1).rows([s])[0, o]),
    "turn it into attention", "named")
wrong(C, "zero", lambda *a: 0.0, "got 0")
wrong(C, "NaN", lambda *a: float("nan"), "nan")
wrong(C, "negated", negated("skip_trigram_score"), "wrong sign")
wrong(C, "another head", other_arg("skip_trigram_score", 1, _other_head), "answer for head", "named")
wrong(C, "a percentage", times("skip_trigram_score", 100.0), "100")
right(C, "sigmoid", lambda m, h, s, d, o, n: float(torch.sigmoid(
    __import__("attncircuits.analysis.circuits", fromlist=["x"]).full_qk_circuit(m, 0, h).centered(-1).rows([d])[0, s]
    - math.log(n - 1)) * __import__("attncircuits.analysis.circuits", fromlist=["x"]).full_ov_circuit(m, 0, h).centered(-1)
    .rows([s])[0, o]))
wrong(C, "a 0-d tensor (the text asks a float)", lambda *a: torch.tensor(solutions()["skip_trigram_score"](*a)), "0-d tensor", "named")
right(C, "a numpy float64", lambda *a: __import__("numpy").float64(solutions()["skip_trigram_score"](*a)))

C = "ch04.check_top_skip_trigrams"
wrong(C, "columns swapped", lambda *a: solutions()["top_skip_trigrams_of_head"](*a)[:, [1, 0, 2]], "columns", "named")
wrong(C, "reversed order", lambda *a: solutions()["top_skip_trigrams_of_head"](*a).flip(0), "order", "named")
wrong(C, "another head", other_arg("top_skip_trigrams_of_head", 1, _other_head), "head", "named")
wrong(C, "scores", lambda m, h, t, k: solutions()["top_skip_trigrams_of_head"](m, h, t, k).float(), "token ids", "named")
wrong(C, "one short", lambda m, h, t, k: solutions()["top_skip_trigrams_of_head"](m, h, t, k + 1)[1:], "missing")
right(C, "a list of lists", lambda *a: solutions()["top_skip_trigrams_of_head"](*a).tolist())
right(C, "int32", lambda *a: solutions()["top_skip_trigrams_of_head"](*a).int())

C = "ch04.check_nonzero_eigenvalues"
wrong(C, "real parts", lambda A, B: torch.linalg.eigvals(B @ A).real, "complex", "named")
wrong(C, "singular values", lambda A, B: torch.linalg.svdvals(B @ A), "singular values", "named")
wrong(C, "all NaN", lambda A, B: torch.full((B.shape[0],), float("nan"), dtype=torch.complex64), "NaN")
wrong(C, "dense float32", lambda A, B: torch.linalg.eigvals(A @ B)[: B.shape[0]], "product", "named")
wrong(C, "zeros", lambda A, B: torch.zeros(B.shape[0], dtype=torch.complex64), "missing")
wrong(C, "negated", lambda A, B: -torch.linalg.eigvals(B @ A), "missing")
right(C, "complex128", lambda A, B: torch.linalg.eigvals((B @ A).double()))
right(C, "numpy", lambda A, B: torch.from_numpy(__import__("numpy").linalg.eigvals((B @ A).numpy())))

C = "ch04.check_copying_score"
wrong(C, "not centred", lambda m, h: (lambda e: float(e.sum().real / e.abs().sum()))(
    __import__("attncircuits.analysis.circuits", fromlist=["x"]).full_ov_circuit(m, 0, h).eigenvalues()), "not centred", "named")
wrong(C, "negated", negated("copying_score"), "wrong sign")
wrong(C, "zero", lambda m, h: 0.0, "got 0")
wrong(C, "NaN", lambda m, h: float("nan"), "nan")
wrong(C, "another head", other_arg("copying_score", 1, _other_head), "answer for head", "named")
wrong(C, "|Σλ| / Σ|λ|", lambda m, h: (lambda e: float(e.sum().abs() / e.abs().sum()))(
    __import__("attncircuits.analysis.circuits", fromlist=["x"]).full_ov_circuit(m, 0, h).centered(-1).eigenvalues()),
    "absolute", "named")
wrong(C, "a 0-d tensor (the text asks a float)", lambda m, h: torch.tensor(solutions()["copying_score"](m, h)), "0-d tensor", "named")
right(C, "a numpy float64", lambda m, h: __import__("numpy").float64(solutions()["copying_score"](m, h)))
right(C, "in float64", in_float64("copying_score"))

# ---- chapter 5 -------------------------------------------------------------------------------------
C = "ch05.check_composition_score"
wrong(C, "wrong order", lambda a, b: solutions()["composition_score"](b, a), "wrong order", "named")
wrong(C, "not normalised", lambda a, b: float((a @ b).norm()), "not normalised", "named")
wrong(C, "zero", lambda a, b: 0.0, "got 0")
wrong(C, "NaN", lambda a, b: float("nan"), "nan")
wrong(C, "a percentage", times("composition_score", 100.0), "100")
wrong(C, "negated", negated("composition_score"), "wrong sign")
right(C, "matrix_norm", lambda a, b: float(torch.linalg.matrix_norm(a @ b) / torch.linalg.matrix_norm(a)
                                           / torch.linalg.matrix_norm(b)))
right(C, "in float64", in_float64("composition_score"))

C = "ch05.check_k_composition_score"
wrong(C, "Q composition", lambda m, w, r: solutions()["composition_score"](
    m.blocks[0].W_V[w] @ m.blocks[0].W_O[w], m.blocks[1].W_Q[r] @ m.blocks[1].W_K[r].T), "Q-composition", "named")
wrong(C, "another reader", other_arg("k_composition_score", 2, _other_head), "answer for", "named")
wrong(C, "zero", lambda *a: 0.0, "got 0")
wrong(C, "NaN", lambda *a: float("nan"), "nan")
wrong(C, "negated", negated("k_composition_score"), "wrong sign")
right(C, "einsum", lambda m, w, r: (lambda ov, qk: float((ov @ qk.T).norm() / ov.norm() / qk.norm()))(
    torch.einsum("md,dn->mn", m.blocks[0].W_V[w], m.blocks[0].W_O[w]), m.blocks[1].W_Q[r] @ m.blocks[1].W_K[r].T))
right(C, "in float64", in_float64("k_composition_score"))

C = "ch05.check_random_composition_scores"


def _rcs(d_model, d_head, n, seed=0, full=False, same=False, uniform=False, order=False):
    g = torch.Generator().manual_seed(seed)
    draw = (lambda *s: torch.rand(*s, generator=g)) if uniform else (lambda *s: torch.randn(*s, generator=g))

    def mat():
        if full:
            return draw(n, d_model, d_model)
        return draw(n, d_model, d_head) @ draw(n, d_head, d_model)

    a = mat()
    b = a if same else mat()
    p = b @ a if order else a @ b
    norm = torch.linalg.matrix_norm
    return norm(p) / (norm(a) * norm(b))


wrong(C, "full-rank", lambda *a: _rcs(*a, full=True), "rank", "named")
# One matrix as writer and reader gives the same distribution of scores as two (mean and std agree
# to 1% for d_model 2-64): the check tells it by the number of Gaussian numbers drawn
wrong(C, "one matrix as writer and reader", lambda *a: _rcs(*a, same=True), "the same matrix", "named")
wrong(C, "one matrix as writer and reader, drawn with torch.normal", lambda d, h, n, s=0: (lambda g: (
    lambda m: torch.linalg.matrix_norm(m @ m) / torch.linalg.matrix_norm(m) ** 2)(torch.normal(
        0.0, 1.0, (n, d, h), generator=g) @ torch.normal(0.0, 1.0, (n, h, d), generator=g)))(
    torch.Generator().manual_seed(s)), "half of the", "named")
wrong(C, "not normalised", lambda d, h, n, s=0: _rcs(d, h, n, s) * 1000, "above 1")
wrong(C, "torch.rand", lambda *a: _rcs(*a, uniform=True), "torch.randn", "named")
wrong(C, "symmetric matrices U @ U.T", lambda d, h, n, s=0: (lambda g: (lambda a, b: torch.linalg.matrix_norm(a @ b) / (
    torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b)))(*[(lambda u: u @ u.mT)(torch.randn(n, d, h, generator=g))
                                                                  for _ in range(2)]))(torch.Generator().manual_seed(s)),
      "symmetric", "named")
wrong(C, "the global generator (no seed)", lambda d, h, n, s=0: _rcs(d, h, n, int(torch.randint(0, 10**6, (1,)))),
      "same seed gave other scores", "named")
wrong(C, "the seed ignored", lambda d, h, n, s=0: _rcs(d, h, n, 5), "the very same scores", "named")
wrong(C, "zeros", lambda d, h, n, s=0: torch.zeros(n), "same score")
wrong(C, "a percentage", lambda *a: 100 * _rcs(*a), "above 1")
wrong(C, "NaN", lambda d, h, n, s=0: torch.full((n,), float("nan")), "NaN")
wrong(C, "rank one: a column times a row", lambda d, h, n, s=0: _rcs(d, 1, n, s), "rank one", "named",
      avoid="draw each matrix as the product")
wrong(C, "the factors in the other order", lambda d, h, n, s=0: (lambda g: (lambda a, b: torch.linalg.matrix_norm(
    a @ b) / (torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b)))(*[torch.randn(n, h, d, generator=g) @ torch.randn(
        n, d, h, generator=g) for _ in range(2)]))(torch.Generator().manual_seed(s)), "the other order", "named")
wrong(C, "the spectral norm for the Frobenius", lambda d, h, n, s=0: (lambda a, b: torch.linalg.matrix_norm(a @ b, 2) / (
    torch.linalg.matrix_norm(a, 2) * torch.linalg.matrix_norm(b, 2)))(*[(lambda g: torch.randn(n, d, h, generator=g) @ torch.randn(
        n, h, d, generator=g))(torch.Generator().manual_seed(s + i)) for i in range(2)]), "check each step against the text",
      avoid="draw each matrix as the product")
right(C, "the solution", _sol("random_composition_scores"))
right(C, "n + 1 matrices, each sample two neighbours", lambda d, h, n, s=0: (lambda g: (lambda m: torch.linalg.matrix_norm(
    m[:-1] @ m[1:]) / (torch.linalg.matrix_norm(m[:-1]) * torch.linalg.matrix_norm(m[1:])))(
    torch.randn(n + 1, d, h, generator=g) @ torch.randn(n + 1, h, d, generator=g)))(torch.Generator().manual_seed(s)))
right(C, "a loop of samples", lambda d, h, n, s=0: (lambda g: torch.stack([(lambda a, b: (a @ b).norm() / (
    a.norm() * b.norm()))(torch.randn(d, h, generator=g) @ torch.randn(h, d, generator=g),
                          torch.randn(d, h, generator=g) @ torch.randn(h, d, generator=g)) for _ in range(n)]))(
    torch.Generator().manual_seed(s + 7)))
right(C, "reversed product order", lambda *a: _rcs(*a, order=True))

C = "ch05.check_virtual_ov"
wrong(C, "wrong order", lambda m, w, r: m.W_E @ (m.blocks[1].W_V[r] @ m.blocks[1].W_O[r]) @ (
    m.blocks[0].W_V[w] @ m.blocks[0].W_O[w]) @ m.W_U, "layer-1 head first", "named")
wrong(C, "another writer", other_arg("virtual_ov", 1, _other_head), "answer for", "named")
wrong(C, "zeros", zeros("virtual_ov"), "all zeros")
wrong(C, "NaN", with_nan("virtual_ov"), "NaN")
wrong(C, "negated", negated("virtual_ov"), "wrong sign")
wrong(C, "transposed", transposed("virtual_ov"), "transposed")
right(C, "FactoredMatrix", lambda m, w, r: __import__("attncircuits.analysis.circuits", fromlist=["x"]).FactoredMatrix(
    m.W_E @ m.blocks[0].W_V[w] @ m.blocks[0].W_O[w], m.blocks[1].W_V[r] @ m.blocks[1].W_O[r] @ m.W_U).dense())
right(C, "in float64", in_float64("virtual_ov"))

C = "ch05.check_first_order_loss"
wrong(C, "the model's loss", lambda m, t: __import__("attncircuits").loss_fn(m(t), t).item(), "model's own loss",
      "named")
wrong(C, "zero", lambda *a: 0.0, "got 0")
wrong(C, "NaN", lambda *a: float("nan"), "nan")
wrong(C, "negated", negated("first_order_loss"), "wrong sign")
wrong(C, "in bits", times("first_order_loss", 1 / math.log(2)), "ln 2")
wrong(C, "a 0-d tensor (the text asks a float)", lambda m, t: torch.tensor(solutions()["first_order_loss"](m, t)), "0-d tensor", "named")
right(C, "a numpy float64", lambda m, t: __import__("numpy").float64(solutions()["first_order_loss"](m, t)))
right(C, "in float64", in_float64("first_order_loss"))

# ---- chapter 6 -------------------------------------------------------------------------------------
C = "ch06.check_previous_token_score"
wrong(C, "offset 0", lambda p: p.diagonal(0, -2, -1).mean((0, 2)), "token itself", "named")
wrong(C, "sum", lambda p: p.diagonal(-1, -2, -1).sum((0, 2)), "summed", "named")
wrong(C, "zeros", zeros("previous_token_score"), "all zeros")
wrong(C, "NaN", with_nan("previous_token_score"), "NaN")
wrong(C, "percent", times("previous_token_score", 100.0), "100")
wrong(C, "negated", negated("previous_token_score"), "wrong sign")
right(C, "a loop over heads", lambda p: torch.stack([p[:, h].diagonal(-1, -2, -1).mean() for h in range(p.shape[1])]))
right(C, "in float64", in_float64("previous_token_score"))

C = "ch06.check_prefix_matching_score"
wrong(C, "the token itself", lambda p, t, L: (p * ((t[:, :, None] == t[:, None, :]) & _causal(t.shape[1]).tril(-1))
                                              [:, None]).sum(-1)[:, :, 1 + L:].mean((0, 2)), "token itself", "named")
wrong(C, "zeros", zeros("prefix_matching_score"), "all zeros")
wrong(C, "NaN", with_nan("prefix_matching_score"), "NaN")
wrong(C, "percent", times("prefix_matching_score", 100.0), "100")
wrong(C, "negated", negated("prefix_matching_score"), "wrong sign")
right(C, "scores.prefix_match_targets", lambda p, t, L: torch.einsum(
    "bhqk,bqk->bhq", p, __import__("attncircuits.analysis.scores", fromlist=["x"]).prefix_match_targets(t).float()
)[:, :, 1 + L:].mean((0, 2)))
right(C, "in float64", in_float64("prefix_matching_score"))

C = "ch06.check_find_induction_heads"
wrong(C, "layer 1 only", lambda m, thr=0.3: [(1, h) for h in range(m.cfg.n_heads)
                                             if m.cfg.n_layers > 1 and __import__("attncircuits.analysis.scores", fromlist=["x"])
                                             .prefix_matching_scores(m, seq_len=25, n_repeats=4)[1, h] > thr],
      "score every layer", "named")
wrong(C, "empty", lambda m, thr=0.3: [], "left out heads")
wrong(C, "previous-token heads", lambda m, thr=0.3: [(l, h) for l, h in (
    __import__("attncircuits.analysis.scores", fromlist=["x"]).previous_token_scores(
        m, __import__("attncircuits.analysis.losses", fromlist=["x"]).repeated_tokens(m, 25, 4, batch_size=4)) > thr
).nonzero().tolist()], "previous-token", "named")
wrong(C, "threshold 0.03", lambda m, thr=0.3: solutions()["find_induction_heads"](m, 0.03), "below 0.3", "named")
wrong(C, "threshold 0.95", lambda m, thr=0.3: solutions()["find_induction_heads"](m, 0.95), "above 0.3", "named")
wrong(C, "heads numbered from 1", lambda m, thr=0.3: [(l + 1, h + 1) for l, h in solutions()["find_induction_heads"](m)],
      "heads 0-", "named")
wrong(C, "head, layer", lambda m, thr=0.3: [(h, l) for l, h in solutions()["find_induction_heads"](m)], "(layer, head)",
      "named")
right(C, "tuples of tensors", lambda m, thr=0.3: [tuple(x) for x in (
    __import__("attncircuits.analysis.scores", fromlist=["x"]).prefix_matching_scores(m) > thr).nonzero()])
right(C, "a set", lambda m, thr=0.3: set(solutions()["find_induction_heads"](m, thr)))

C = "ch06.check_ablated_loss"
wrong(C, "increase", lambda m, t, h, mode: solutions()["ablated_loss"](m, t, h, mode) - __import__("attncircuits")
      .loss_fn(m(t), t).item(), "increase", "named")
wrong(C, "other mode", lambda m, t, h, mode: solutions()["ablated_loss"](m, t, h, "mean" if mode == "zero" else "zero"),
      "other ablation", "named")
wrong(C, "zero", lambda *a: 0.0, "got 0")
wrong(C, "NaN", lambda *a: float("nan"), "nan")
wrong(C, "the clean loss", lambda m, t, h, mode: __import__("attncircuits").loss_fn(m(t), t).item(), "no ablation",
      "named")
wrong(C, "another head", other_arg("ablated_loss", 2, lambda h, a: (h[0], (h[1] + 1) % 4)), "answer for", "named")
wrong(C, "a 0-d tensor (the text asks a float)", lambda *a: torch.tensor(solutions()["ablated_loss"](*a)), "0-d tensor", "named")
right(C, "a numpy float64", lambda *a: __import__("numpy").float64(solutions()["ablated_loss"](*a)))
right(C, "in float64", in_float64("ablated_loss"))

C = "ch06.check_qk_score_terms"
wrong(C, "swapped sources", lambda *a: solutions()["qk_score_terms"](*a).transpose(0, 1), "swapped", "named")
wrong(C, "no scale", lambda m, t, h: solutions()["qk_score_terms"](m, t, h) * m.cfg.d_head ** 0.5, "sqrt")
wrong(C, "zeros", zeros("qk_score_terms"), "all zeros")
wrong(C, "NaN", with_nan("qk_score_terms"), "NaN")
wrong(C, "negated", negated("qk_score_terms"), "wrong sign")
wrong(C, "another head", other_arg("qk_score_terms", 2, _other_head), "answer for", "named")
right(C, "masked with -inf", lambda *a: solutions()["qk_score_terms"](*a).masked_fill(
    ~_causal(a[1].shape[1]), float("-inf")))
right(C, "masked with NaN", lambda *a: solutions()["qk_score_terms"](*a).masked_fill(
    ~_causal(a[1].shape[1]), float("nan")))
right(C, "in float64", in_float64("qk_score_terms"))

C = "ch06.check_copying_accuracy"
wrong(C, "by column", lambda m, hs: float(((m.W_E @ sum(m.blocks[l].W_V[h] @ m.blocks[l].W_O[h] for l, h in hs)
                                            @ m.W_U).argmax(0) == torch.arange(m.cfg.d_vocab)).float().mean()),
      "column", "named")
wrong(C, "zero", lambda *a: 0.0, "got 0")
wrong(C, "NaN", lambda *a: float("nan"), "nan")
wrong(C, "percent", times("copying_accuracy", 100.0), "100")
wrong(C, "first head only", lambda m, hs: solutions()["copying_accuracy"](m, hs[:1]), "first", "named")
wrong(C, "a 0-d tensor (the text asks a float)", lambda *a: torch.tensor(solutions()["copying_accuracy"](*a)), "0-d tensor", "named")
right(C, "a numpy float64", lambda *a: __import__("numpy").float64(solutions()["copying_accuracy"](*a)))
right(C, "in float64", in_float64("copying_accuracy"))

# ---- chapter 7 -------------------------------------------------------------------------------------
C = "ch07.check_icl_score"
wrong(C, "off by one", lambda n, late, early: (n[:, late] - n[:, early]).mean().item(), "off by one", "named")
wrong(C, "wrong sign", negated("icl_score"), "wrong sign")
wrong(C, "zero", lambda *a: 0.0, "got 0")
wrong(C, "NaN", lambda *a: float("nan"), "nan")
wrong(C, "in bits", times("icl_score", 1 / math.log(2)), "ln 2")
right(C, "mean of each", lambda n, late, early: float(n[:, late - 1].mean() - n[:, early - 1].mean()))
right(C, "in float64", in_float64("icl_score"))

C = "ch07.check_copy_losses"
wrong(C, "first kept", lambda loss, L, n: [loss[k * L:(k + 1) * L].mean().item() for k in range(n)], "first target",
      "named")
wrong(C, "zeros", lambda loss, L, n: [0.0] * n, "got 0")
wrong(C, "NaN", lambda loss, L, n: [float("nan")] * n, "nan")
wrong(C, "reversed", lambda *a: solutions()["copy_losses"](*a)[::-1], "order", "named")
wrong(C, "one short", lambda *a: solutions()["copy_losses"](*a)[:-1], "items")
wrong(C, "in bits", lambda *a: [x / math.log(2) for x in solutions()["copy_losses"](*a)], "ln 2")
right(C, "a tensor", lambda loss, L, n: loss.view(n, L)[:, 1:].mean(1))
right(C, "a tuple", lambda *a: tuple(solutions()["copy_losses"](*a)))

C = "ch07.check_smear_scores"
wrong(C, "weights swapped", lambda s, w: solutions()["smear_scores"](s, 1 - w), "swapped", "named")
wrong(C, "zeros", lambda s, w: torch.zeros_like(s).masked_fill(torch.isinf(s), float("-inf")), "all zeros")
wrong(C, "NaN from inf - inf", lambda s, w: (lambda prev: w[None, :, None, None] * s + (1 - w[None, :, None, None]) * prev)(
    torch.cat([s[..., :1], s[..., :-1]], -1)), "gradient with respect to the weights is NaN", "named")
wrong(C, "negated", lambda s, w: (-solutions()["smear_scores"](s, w)).masked_fill(torch.isinf(s), float("-inf")),
      "wrong sign")
wrong(C, "no smear", lambda s, w: s.clone(), "smear", "named")
right(C, "torch.roll with a fixed first key", lambda s, w: (lambda z, m: (lambda p: (
    w[None, :, None, None] * z + (1 - w[None, :, None, None]) * p).masked_fill(m, -torch.inf))(
    torch.cat([z[..., :1], z.roll(1, -1)[..., 1:]], -1)))(s.masked_fill(torch.isinf(s), 0), torch.isinf(s)))
right(C, "in float64", in_float64("smear_scores"))

C = "ch07.check_logit_attribution"
wrong(C, "current token", lambda m, t: torch.stack(
    [(m.W_E[t][:, :-1] * m.W_U.T[t[:, :-1]]).sum(-1)] + [
        (o[:, :-1, h] * m.W_U.T[t[:, :-1]]).sum(-1) for o in m.run_with_cache(t)[1].head_out
        for h in range(m.cfg.n_heads)], -1), "off by one", "named")
wrong(C, "terms before positions", lambda m, t: torch.stack(
    [(m.W_E[t][:, :-1] * m.W_U.T[t[:, 1:]]).sum(-1)] + [
        (o[:, :-1, h] * m.W_U.T[t[:, 1:]]).sum(-1) for o in m.run_with_cache(t)[1].head_out
        for h in range(m.cfg.n_heads)], -1).transpose(1, 2), "axes", "symptom")
wrong(C, "zeros", zeros("logit_attribution"), "all zeros")
wrong(C, "NaN", with_nan("logit_attribution"), "NaN")
wrong(C, "negated", negated("logit_attribution"), "wrong sign")
wrong(C, "no direct term", lambda m, t: torch.cat([torch.zeros_like(solutions()["logit_attribution"](m, t)[..., :1]),
                                                   solutions()["logit_attribution"](m, t)[..., 1:]], -1), "direct",
      "named")
right(C, "a loop over terms", lambda m, t: torch.stack(
    [(m.W_E[t][:, :-1] * m.W_U.T[t[:, 1:]]).sum(-1)] + [
        (o[:, :-1, h] * m.W_U.T[t[:, 1:]]).sum(-1) for o in m.run_with_cache(t)[1].head_out
        for h in range(m.cfg.n_heads)], -1))
right(C, "in float64", in_float64("logit_attribution"))

# ---- chapter 8 -------------------------------------------------------------------------------------
C = "ch08.check_previous_token_qk"


def _prev_qk(W_pos, n_pairs, d_head, scale=30.0, sign=1.0, pairs=None, back=1):
    d_model = W_pos.shape[1]
    W_Q, W_K = torch.zeros(d_model, d_head), torch.zeros(d_model, d_head)
    for f in range(n_pairs if pairs is None else pairs):
        ang = back * math.atan2(float(W_pos[1, 2 * f]), float(W_pos[1, 2 * f + 1]))
        s, c = 2 * f, 2 * f + 1
        W_Q[s, s], W_Q[c, s] = scale * math.cos(ang), -scale * math.sin(ang)
        W_Q[s, c], W_Q[c, c] = scale * math.sin(ang), scale * math.cos(ang)
        W_K[s, s], W_K[c, c] = sign, sign
    return W_Q, W_K


wrong(C, "hard-coded to the chapter's layout", lambda W, n, d: _prev_qk(
    torch.zeros(W.shape[0], 32 + 3 * 128).index_copy_(1, torch.arange(32), W[:, :32]) if W.shape[1] != 32 + 3 * 128
    else W, 16, 128), "shape", "named")
wrong(C, "sign flip", lambda *a: _prev_qk(*a, sign=-1.0), "previous-token score", "named")
wrong(C, "one pair", lambda *a: _prev_qk(*a, pairs=1), "previous-token score", "named")
wrong(C, "the current token", lambda *a: _prev_qk(*a, back=0), "itself", "named")
wrong(C, "too soft", lambda *a: _prev_qk(*a, scale=0.3), "scale", "named")
wrong(C, "zeros", lambda W, n, d: (torch.zeros(W.shape[1], d), torch.zeros(W.shape[1], d)), "zero", "named")
right(C, "the solution", _sol("previous_token_qk"))
right(C, "scale 60 on the key", lambda *a: (lambda q, k: (q / 30, k * 60))(*_prev_qk(*a)))

C = "ch08.check_copy_ov"
wrong(C, "reversed", lambda d, h, s, t: solutions()["copy_ov"](d, h, t, s), "copies dst into src", "named")
wrong(C, "zeros", lambda d, h, s, t: (torch.zeros(d, h), torch.zeros(h, d)), "zero", "named")
wrong(C, "doubled", lambda *a: (lambda v, o: (2 * v, o))(*solutions()["copy_ov"](*a)), "2 times", "named")
wrong(C, "negated", lambda *a: (lambda v, o: (-v, o))(*solutions()["copy_ov"](*a)), "-1 times", "named")
wrong(C, "hard-coded", lambda d, h, s, t: solutions()["copy_ov"](d, h, slice(32, 160), slice(160, 288)) if d > 300
      else (torch.zeros(d, h), torch.zeros(h, d)), "identity", "named")
right(C, "a permuted basis", lambda d, h, s, t: (lambda v, o, p: (v[:, p], o[p]))(*solutions()["copy_ov"](d, h, s, t),
                                                                                     torch.randperm(h)))
right(C, "float64", lambda *a: tuple(x.double() for x in solutions()["copy_ov"](*a)))

C = "ch08.check_two_back_model"


def _two_back(layout, first="prev", n_layers=2, copy_back=1):
    hb = solutions()["hb"]
    model = hb.empty_model(layout, n_layers=n_layers)
    W_Q, W_K = hb.previous_token_qk(model.W_pos, layout.n_pos_pairs, layout.d_head)
    token, prev, out = (layout.block(n) for n in ("token", "prev", "out"))
    W_V, W_O = hb.copy_ov(layout.d_model, layout.d_head, token, prev)
    hb.set_head(model, 0, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)
    if n_layers > 1:
        W_V, W_O = hb.copy_ov(layout.d_model, layout.d_head, token if first == "token" else prev, out)
        hb.set_head(model, 1, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)
    return model


wrong(C, "layer 1 reads token", lambda L: _two_back(L, first="token"), "one back", "named")
wrong(C, "one layer", lambda L: _two_back(L, n_layers=1), "two layers", "named")
wrong(C, "the chapter's layout always", lambda L: solutions()["build_two_back"](solutions()["hb"].Layout()), "layout",
      "named")
wrong(C, "not a model", lambda L: None, "None")
wrong(C, "an empty model", lambda L: solutions()["hb"].empty_model(L, n_layers=2), "two back", "named")
right(C, "the solution", _sol("build_two_back"))
right(C, "scaled QK", lambda L: (lambda m: m)(solutions()["build_two_back"](L)))

C = "ch08.check_induction_qk"


def _ind(layout, q="token", k="prev", scale=None):
    n = layout.d_vocab
    W_Q, W_K = torch.zeros(layout.d_model, layout.d_head), torch.zeros(layout.d_model, layout.d_head)
    s = scale if scale is not None else 30 * layout.d_head ** 0.5 / layout.embed_scale ** 2
    W_Q[layout.block(q), :n] = s * torch.eye(n)
    W_K[layout.block(k), :n] = torch.eye(n)
    return W_Q, W_K


wrong(C, "key reads token", lambda L: _ind(L, k="token"), "W_K reads the token block", "named")
wrong(C, "query reads prev", lambda L: _ind(L, q="prev", k="token"), "W_Q reads the prev block", "named")
wrong(C, "too soft", lambda L: _ind(L, scale=1e-3), "scale", "named")
wrong(C, "sign flipped", lambda L: _ind(L, scale=-30 * L.d_head ** 0.5 / L.embed_scale ** 2), "sign", "named")
wrong(C, "hard-coded layout", lambda L: _ind(solutions()["hb"].Layout()), "shape", "named")
wrong(C, "zeros", lambda L: (torch.zeros(L.d_model, L.d_head), torch.zeros(L.d_model, L.d_head)), "zero", "named")
wrong(C, "a permuted identity", lambda L: (lambda q, k: (q, k[:, torch.randperm(k.shape[1], generator=torch.Generator()
                                                                                   .manual_seed(0))]))(*_ind(L)),
      "identity", "named")
right(C, "the solution", _sol("induction_qk"))
right(C, "scale on the key", lambda L: (lambda q, k: (q / 10, k * 10))(*_ind(L)))

# ---- chapter 9 -------------------------------------------------------------------------------------
C = "ch09.check_induction_stripe_scores"
wrong(C, "whole stripe", lambda p, L: p.diagonal(1 - L, -2, -1).mean((0, 2)), "whole stripe", "named")
wrong(C, "the token itself", lambda p, L: p.diagonal(-L, -2, -1)[..., 1:1 + L].mean((0, 2)), "token itself", "named")
wrong(C, "zeros", zeros("induction_stripe_scores"), "all zeros")
wrong(C, "NaN", with_nan("induction_stripe_scores"), "NaN")
wrong(C, "percent", times("induction_stripe_scores", 100.0), "100")
right(C, "a loop", lambda p, L: torch.stack([p[:, :, L + i, i + 1] for i in range(1, L + 1)], -1).mean((0, 2)))
right(C, "in float64", in_float64("induction_stripe_scores"))

C = "ch09.check_zero_ablated_loss"


def _hooked(tl, tokens, layer, head, edit):
    def hook(z, hook):
        return edit(z, head)

    return tl.run_with_hooks(tokens, return_type="loss", loss_per_token=True,
                             fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])


def _zero_pos(z, h):
    z[:, h] = 0.0


wrong(C, "zeroed a position", lambda tl, t, l, h: _hooked(tl, t, l, h, _zero_pos), "position", "named")
wrong(C, "the hook never runs", lambda tl, t, l, h: tl.run_with_hooks(
    t, return_type="loss", loss_per_token=True, fwd_hooks=[(f"blocks.{l}.attn.hook_q", lambda x, hook: x)]),
    "no ablation", "named")
wrong(C, "the mean loss", lambda tl, t, l, h: _sol("zero_ablated_loss")(tl, t, l, h).mean(), "mean loss", "named")
wrong(C, "another head", lambda tl, t, l, h: _sol("zero_ablated_loss")(tl, t, l, (h + 1) % 4), "answer for", "named")
wrong(C, "negated", negated("zero_ablated_loss"), "wrong sign")
wrong(C, "NaN", with_nan("zero_ablated_loss"), "NaN")
wrong(C, "zeros", zeros("zero_ablated_loss"), "all zeros")
right(C, "the solution: in place, returns None", _sol("zero_ablated_loss"))
right(C, "a new tensor returned, hooks() context", lambda tl, t, l, h: (lambda ctx: (ctx.__enter__(), tl(
    t, return_type="loss", loss_per_token=True), ctx.__exit__(None, None, None))[1])(tl.hooks(fwd_hooks=[(
        f"blocks.{l}.attn.hook_z", lambda z, hook: z * (torch.arange(z.shape[2]) != h)[:, None])])))

C = "ch09.check_ov_copying_scores"
wrong(C, "no abs", lambda tl: (lambda e: (e.sum(-1) / e.sum(-1).abs()).real)(
    (tl.W_E @ tl.OV @ tl.W_U).eigenvalues), "sum of |λ|", "named")
wrong(C, "zeros", zeros("ov_copying_scores"), "all zeros")
wrong(C, "NaN", with_nan("ov_copying_scores"), "NaN")
wrong(C, "negated", negated("ov_copying_scores"), "wrong sign")
wrong(C, "transposed", transposed("ov_copying_scores"), "transposed")
right(C, "float64", lambda tl: solutions()["ov_copying_scores"](tl).double())
right(C, "a loop", lambda tl: torch.stack([torch.stack([(lambda e: e.sum().real / e.abs().sum())(
    (tl.W_E @ tl.OV[l, h] @ tl.W_U).eigenvalues) for h in range(tl.cfg.n_heads)]) for l in range(tl.cfg.n_layers)]))


# ---- running the table ------------------------------------------------------------------------------
def _check(name):
    import importlib

    mod, fn = name.split(".")
    return getattr(importlib.import_module(f"attncircuits.course.exercises.{mod}"), fn)


VAGUE_RE = re.compile(
    r"^(got [^:]*, expected [^:]*|.*values differ.*|off by a constant factor.*|\d+ of \d+ entries differ.*|"
    r".*triples differ.*|expected \[.*|the eigenvalue .* is missing.*|.*could not.*|your mean is .*|"
    r"previous-token score [\d.]+ < .*|prefix-matching score .*W_Q reads.*|the token two back is the top.*)$")


# ---- chapter 10 ------------------------------------------------------------------------------------
C = "ch10.check_fold_ln_into"


def _fold(w, b_ln, W, b, centre=True, gain=True, bias=True):
    Wf = w[:, None] * W if gain else W
    if centre:
        Wf = Wf - Wf.mean(-2, keepdim=True)
    return Wf, (b + torch.einsum("d,...de->...e", b_ln, W)) if bias else b


wrong(C, "not centred", lambda *a: _fold(*a, centre=False), "not centred", "named")
wrong(C, "bias not folded", lambda *a: _fold(*a, bias=False), "bias is not folded", "named")
wrong(C, "no gain", lambda *a: _fold(*a, gain=False), "gain is missing", "named")
wrong(C, "gain on the bias", lambda w, b_ln, W, b: (_fold(w, b_ln, W, b)[0],
                                                   b + torch.einsum("d,...de->...e", w * b_ln, W)), "unscaled", "named")
wrong(C, "zeros", zeros("fold_ln_into"), "all zeros")
wrong(C, "NaN", with_nan("fold_ln_into"), "NaN")
wrong(C, "centred over d_out", lambda w, b_ln, W, b: ((lambda F: F - F.mean(-1, keepdim=True))(w[:, None] * W),
                                                     _fold(w, b_ln, W, b)[1]), "wrong axis", "named")
right(C, "centre first, then scale", lambda w, b_ln, W, b: (
    w[:, None] * W - (w[:, None] * W).mean(-2, keepdim=True), b + b_ln @ W))
right(C, "in float64", in_float64("fold_ln_into"))
right(C, "a list", lambda *a: list(solutions()["fold_ln_into"](*a)))

C = "ch10.check_frozen_ln"
wrong(C, "own scale", lambda comps, resid: (lambda c: c / (c.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())(
    comps - comps.mean(-1, keepdim=True)), "its own scale", "named")
wrong(C, "not centred", lambda comps, resid: comps / ((resid - resid.mean(-1, keepdim=True)).pow(2).mean(
    -1, keepdim=True) + 1e-5).sqrt(), "not centred", "named")
wrong(C, "unbiased variance", lambda comps, resid: (comps - comps.mean(-1, keepdim=True)) / (
    resid.var(-1, keepdim=True) + 1e-5).sqrt(), "unbiased", "named")
wrong(C, "no division", lambda comps, resid: comps - comps.mean(-1, keepdim=True), "not divided", "named")
wrong(C, "zeros", zeros("frozen_ln"), "all zeros")
wrong(C, "negated", negated("frozen_ln"), "wrong sign")
wrong(C, "summed", lambda comps, resid: solutions()["frozen_ln"](comps, resid).sum(0), "shape")
right(C, "torch's layer_norm scale", lambda comps, resid: (comps - comps.mean(-1, keepdim=True)) / (
    resid.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt())
right(C, "in float64", in_float64("frozen_ln"))

C = "ch10.check_loss_bump"
wrong(C, "one step", lambda v: max([0.0] + [b - a for a, b in zip(*(lambda w: (w, w[1:]))(
    [x for x in v if x is not None]))]), "consecutive", "named")
wrong(C, "max minus min", lambda v: (lambda w: max(w) - min(w))([x for x in v if x is not None]), "maximum minus",
      "named")
wrong(C, "zero", lambda v: 0.0, "got 0")
wrong(C, "negated", lambda v: -solutions()["loss_bump"](v), "wrong sign")
wrong(C, "in percent", lambda v: 100 * solutions()["loss_bump"](v), "100")
wrong(C, "None as 0", lambda v: solutions()["loss_bump"]([x if x is not None else 0.0 for x in v]), "read as a loss of 0",
      "named")
right(C, "a running minimum with itertools", lambda v: float(max(
    [0.0] + [x - m for x, m in zip([x for x in v if x is not None], __import__("itertools").accumulate(
        [x for x in v if x is not None], min))])))

# ---- chapter 11 ------------------------------------------------------------------------------------
C = "ch11.check_rise_window"


def _rise(steps, values, lo=0.2, hi=0.8, base=None, strict=False, index=False, scale=None):
    first = values[0] if base is None else base(values)
    top = max(values)

    def reach(f):
        level = f * top if scale else first + f * (top - first)
        return next(i for i, v in enumerate(values) if (v > level if strict else v >= level))

    a, b = reach(lo), reach(hi)
    return (a, b) if index else (steps[a], steps[b])


wrong(C, "from the minimum", lambda s, v, lo=0.2, hi=0.8: _rise(s, v, lo, hi, base=min), "lowest value", "named")
wrong(C, "indices", lambda s, v, lo=0.2, hi=0.8: _rise(s, v, lo, hi, index=True), "indices", "named")
wrong(C, "strictly above", lambda s, v, lo=0.2, hi=0.8: _rise(s, v, lo, hi, strict=True), ">=", "named")
wrong(C, "fractions of the top", lambda s, v, lo=0.2, hi=0.8: _rise(s, v, lo, hi, scale=True), "times the highest",
      "named")
wrong(C, "swapped", lambda s, v, lo=0.2, hi=0.8: _rise(s, v, lo, hi)[::-1], "swapped", "named")
wrong(C, "last crossing", lambda s, v, lo=0.2, hi=0.8: (lambda last: (s[last(v[0] + lo * (max(v) - v[0]))],
      s[last(v[0] + hi * (max(v) - v[0]))]))(lambda lev: min(len(v) - 1, max([i for i, x in enumerate(v) if x < lev],
                                                                          default=-1) + 1)),
      "last times", "named")
wrong(C, "defaults ignored", lambda s, v, lo=0.2, hi=0.8: _rise(s, v), "lo=0.5")
right(C, "with numpy", lambda s, v, lo=0.2, hi=0.8: tuple(int(s[int(__import__("numpy").argmax(
    __import__("numpy").asarray(v) >= v[0] + f * (max(v) - v[0])))]) for f in (lo, hi)))
right(C, "the solution", _sol("rise_window"))

C = "ch11.check_best_induction_head"
wrong(C, "layer 0 included", lambda pm: tuple(int(i) for i in divmod(int(torch.as_tensor(pm).amax(0).argmax()),
                                                                     torch.as_tensor(pm).shape[2])), "layer 0", "named")
wrong(C, "last evaluation", lambda pm: (lambda b: (int(b.argmax()) // b.shape[1] + 1, int(b.argmax()) % b.shape[1]))(
    torch.as_tensor(pm)[-1, 1:]), "last evaluation", "named")
wrong(C, "no offset", lambda pm: (lambda b: (int(b.argmax()) // b.shape[1], int(b.argmax()) % b.shape[1]))(
    torch.as_tensor(pm)[:, 1:].amax(0)), "one too low", "named")
wrong(C, "transposed (head, layer)", lambda pm: _sol("best_induction_head")(pm)[::-1], "in that order", "named")
wrong(C, "flat index", lambda pm: (lambda lh: lh[0] * torch.as_tensor(pm).shape[2] + lh[1])(
    _sol("best_induction_head")(pm)), "a tuple of 2")
wrong(C, "another head: the lowest", lambda pm: (lambda b: (int(b.argmin()) // b.shape[1] + 1, int(b.argmin()) % b.shape[1]))(
    torch.as_tensor(pm)[:, 1:].amax(0)), "expected")
right(C, "with numpy", lambda pm: (lambda a: (int(a[0]) + 1, int(a[1])))(__import__("numpy").unravel_index(
    __import__("numpy").argmax(__import__("numpy").asarray(pm)[:, 1:].max(0)), __import__("numpy").asarray(pm)[:, 1:].shape[1:])))
right(C, "the solution", _sol("best_induction_head"))

C = "ch11.check_loss_pca_2d"


def _pca(x, centre="col", scale=False, u_only=False, order=(0, 1)):
    x = torch.as_tensor(x).double()
    if centre == "col":
        x = x - x.mean(0)
    elif centre == "row":
        x = x - x.mean(1, keepdim=True)
    if scale:
        x = x / x.std(0).clamp_min(1e-12)
    u, s, vt = torch.linalg.svd(x, full_matrices=False)
    out = u[:, :2] if u_only else x @ vt[:2].T
    return out[:, list(order)]


wrong(C, "not centred", lambda x: _pca(x, centre=None), "centre the stack", "named")
wrong(C, "standardised", lambda x: _pca(x, scale=True), "spread", "named")
wrong(C, "rows centred", lambda x: _pca(x, centre="row"), "each snapshot", "named")
wrong(C, "U only", lambda x: _pca(x, u_only=True), "U's columns", "named")
wrong(C, "transposed components", lambda x: _pca(x, order=(1, 0)), "wrong order", "named")
wrong(C, "zeros", lambda x: torch.zeros(len(x), 2, dtype=torch.float64), "all zeros")
wrong(C, "NaN", lambda x: torch.full((len(x), 2), float("nan"), dtype=torch.float64), "NaN")
right(C, "one component negated", lambda x: _pca(x) * torch.tensor([1.0, -1.0], dtype=torch.float64))
right(C, "U times S, in float32", lambda x: (lambda u, s: u[:, :2] * s[:2])(
    *torch.linalg.svd((torch.as_tensor(x).float() - torch.as_tensor(x).float().mean(0)), full_matrices=False)[:2]))
right(C, "the solution", _sol("loss_pca_2d"))
# ---- chapter 12 ------------------------------------------------------------------------------------
C = "ch12.check_copy_attention"


def _copy(pattern, tokens, shift, over_all=False, own=False):
    n = tokens.shape[1]
    src = torch.full_like(tokens, -1)
    src[:, shift:] = tokens[:, : n - shift]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None]
    before = (k - shift <= q) if own else (k - shift < q)
    mask = (src[:, None, :] == tokens[:, :, None]) & before & (k <= q) & (tokens[:, :, None] != 0)
    has = torch.ones_like(mask.any(-1)) if over_all else mask.any(-1)
    mass = (pattern * mask[:, None]).sum(-1)
    return (mass * has[:, None]).sum((0, 2)) / has.sum().clamp(min=1)


wrong(C, "shift one too many", lambda p, t, s: _copy(p, t, s + 1), "one too many", "named")
wrong(C, "mean over every query", lambda p, t, s: _copy(p, t, s, over_all=True), "average over the queries", "named")
wrong(C, "the query's own position", lambda p, t, s: _copy(p, t, s, own=True), "own position", "named")
wrong(C, "zeros", zeros("copy_attention"), "all zeros")
wrong(C, "NaN", with_nan("copy_attention"), "NaN")
wrong(C, "times 100", times("copy_attention", 100.0), "100")
right(C, "einsum over the mask", lambda p, t, s: (lambda m: torch.einsum("bhqk,bqk->bhq", p, m.float()).mul(
    m.any(-1)[:, None]).sum((0, 2)) / m.any(-1).sum().clamp(min=1))(
    (torch.cat([torch.full_like(t[:, :s], -1), t[:, : t.shape[1] - s]], 1)[:, None, :] == t[:, :, None])
    & (torch.arange(t.shape[1])[None] - s < torch.arange(t.shape[1])[:, None])
    & (torch.arange(t.shape[1])[None] <= torch.arange(t.shape[1])[:, None]) & (t[:, :, None] != 0)))
right(C, "in float64", in_float64("copy_attention"))

C = "ch12.check_circuit_shares"
wrong(C, "faithfulness from the clean end", lambda c, n, k, x: ((k - c) / (n - c), (x - c) / (n - c)),
      "from the ablated end", "named")
wrong(C, "completeness from the ablated end", lambda c, n, k, x: ((n - k) / (n - c), (n - x) / (n - c)),
      "from the clean end", "named")
wrong(C, "swapped", lambda c, n, k, x: ((x - c) / (n - c), (n - k) / (n - c)), "swapped", "named")
wrong(C, "divided by none", lambda c, n, k, x: ((n - k) / n, (x - c) / n), "none - clean", "named")
wrong(C, "zeros", lambda c, n, k, x: (0.0, 0.0), "got 0")
wrong(C, "negated", lambda c, n, k, x: ((k - n) / (n - c), (c - x) / (n - c)), "wrong sign")
right(C, "one minus", lambda c, n, k, x: (1 - (k - c) / (n - c), 1 - (n - x) / (n - c)))
right(C, "a list", lambda c, n, k, x: [(n - k) / (n - c), (x - c) / (n - c)])


def _hyp(model, heads, comps=(), trigrams=None):
    """A hypothesis function; on mystery 2 each skip-trigram head named gets its true list
    (``_lists_2``) unless ``trigrams`` says otherwise."""
    def fn():
        said = {"model": model, "heads": dict(heads), "compositions": list(comps)}
        if model == "mystery-2" and trigrams != "none":
            said["skip_trigrams"] = {k: v for k, v in (trigrams or _lists_2()).items() if heads.get(k) == "skip-trigram"}
        return said
    return fn


@functools.lru_cache(maxsize=None)
def _lists_2() -> dict:
    """Each head of mystery 2's skip-trigrams, read from its QK and OV circuits as the chapter's
    rule 6 says (not from the package's list or the ground truth)."""
    from attncircuits.checkpoints.mysteries import load_mystery
    m = load_mystery("mystery-2")
    task, names = m.task, m.task.token_names()
    answers = torch.tensor(task.answer_tokens)
    rows = torch.tensor([[0, t, c] for c in task.cues for t in task.triggers])
    with torch.no_grad():
        _, cache = m.model.run_with_cache(rows)
        out = {}
        for h in range(m.model.cfg.n_heads):
            ov = full_ov_circuit(m.model, 0, h).AB[:, answers]
            out[f"0.{h}"] = [(names[t], names[c], names[int(answers[ov[t].argmax()])])
                             for (_, t, c), a in zip(rows.tolist(), cache.pattern[0][:, h, -1, 1]) if a > 0.5]
    return out


def _lists_2_changed(change):
    return lambda: {"model": "mystery-2", "heads": dict(M2), "compositions": [], "skip_trigrams": change(_lists_2())}


def _grammar_lists(source):
    """The grammar table (``source``: 'model' or 'task') as each head's list: the grammar, not what
    each head does."""
    from attncircuits.checkpoints.mysteries import load_mystery
    m = load_mystery("mystery-2")
    names = m.task.token_names()
    table = model_grammar(m.model, m.task) if source == "model" else m.task.table()
    pairs = [(names[t], names[c], names[int(table[i, j])]) for i, c in enumerate(m.task.cues)
             for j, t in enumerate(m.task.triggers)]
    return lambda: {"model": "mystery-2", "heads": dict(M2), "skip_trigrams": {"0.0": pairs, "0.1": pairs}}


def _every_cue(lists):
    """Each listed trigger's answer with every cue: the OV circuit read, the QK circuit not."""
    from attncircuits.checkpoints.mysteries import load_mystery
    cues = load_mystery("mystery-2").task.token_names()[1:3]
    return {k: sorted({(t, c, a) for t, _, a in v for c in cues}) for k, v in lists.items()}


M2 = {"0.0": "skip-trigram", "0.1": "skip-trigram"}
C = "ch12.check_mystery_2"
wrong(C, "another head's answer: one head", _hyp("mystery-2", {"0.0": "skip-trigram"}),
      "the task needs heads you did not name", "named", avoid="add nothing")
wrong(C, "the role alone: both heads 'skip-trigram', the task's own name", _hyp("mystery-2", M2, trigrams="none"),
      "is named skip-trigram with no list of what it implements", "named")
wrong(C, "the two heads' lists swapped", _lists_2_changed(lambda d: {"0.0": d["0.1"], "0.1": d["0.0"]}),
      "skip-trigrams: 0.0 does not implement", "named")
wrong(C, "one skip-trigram left out", _lists_2_changed(lambda d: {**d, "0.0": d["0.0"][1:]}),
      "skip-trigrams: 0.0 implements 1 skip-trigram your list leaves out", "named")
wrong(C, "one skip-trigram with another answer", _lists_2_changed(
    lambda d: {**d, "0.0": [d["0.0"][0][:2] + ("A0" if d["0.0"][0][2] != "A0" else "A1",)] + d["0.0"][1:]}),
      "needs first", "named")
wrong(C, "the model's grammar as each head's", _grammar_lists("model"), "skip-trigrams: 0.0 does not implement",
      "named")
wrong(C, "the task's table as each head's", _grammar_lists("task"), "skip-trigrams: 0.0 does not implement",
      "named")
wrong(C, "every cue for each trigger (QK not read)", _lists_2_changed(_every_cue),
      "needs over 0.50 (its QK circuit)", "named")
wrong(C, "the cue first", _lists_2_changed(lambda d: {k: [(c, t, a) for t, c, a in v] for k, v in d.items()}),
      "is no trigger: a skip-trigram is (trigger, cue, answer)", "named")
wrong(C, "empty lists", _lists_2_changed(lambda d: {k: [] for k in d}), "your list leaves out", "named")
wrong(C, "lists as one string", _lists_2_changed(lambda d: {k: " ".join(map(str, v)) for k, v in d.items()}),
      "are a list of (trigger, cue, answer)", "named")
wrong(C, "skip-trigrams for a head not named", lambda: {"model": "mystery-2", "heads": {"0.0": "skip-trigram"},
                                                      "skip_trigrams": _lists_2()},
      "which has no role in 'heads'", "named")
wrong(C, "copying heads", _hyp("mystery-2", {k: "copying" for k in M2}), "as copying: score", "named")
wrong(C, "previous-token heads", _hyp("mystery-2", {k: "previous-token" for k in M2}), "as previous-token: score",
      "named")
wrong(C, "a composition in one layer", _hyp("mystery-2", M2, [("0.0", "0.1", "K")]), "earlier layer", "named")
wrong(C, "another mystery's", _hyp("mystery-1", M2), "this grader grades 'mystery-2'", "named")
wrong(C, "a head the model lacks", _hyp("mystery-2", {**M2, "1.0": "skip-trigram"}), "has no head 1.0", "named")
wrong(C, "no dict", lambda: [("0.0", "skip-trigram")], "should return a hypothesis dict", "named")
wrong(C, "heads as pairs of floats", lambda: {"model": "mystery-2", "heads": {(0.0, 0.4): "skip-trigram",
                                                                             (0.2, 1): "skip-trigram"}},
      "is not a head: a head is 'L.H'", "named")
wrong(C, "a role given as a list", _hyp("mystery-2", {"0.0": ["skip-trigram"], "0.1": "skip-trigram"}),
      "is not a role: a role is one string", "named", avoid="could not be compared")
wrong(C, "a role given as a dict", _hyp("mystery-2", {"0.0": {"role": "skip-trigram"}, "0.1": "skip-trigram"}),
      "is not a role: a role is one string", "named", avoid="could not be compared")
wrong(C, "compositions given as an int", lambda: {"model": "mystery-2", "heads": M2, "compositions": 0},
      "'compositions' is a list", "named", avoid="could not be compared")
wrong(C, "a head as a bool pair", _hyp("mystery-2", {(False, True): "skip-trigram", "0.0": "skip-trigram"}),
      "is not a head", "named")
right(C, "the two skip-trigram heads with their skip-trigrams", _hyp("mystery-2", M2))
right(C, "heads as pairs, no compositions key", lambda: {"model": "mystery-2", "heads": {(0, 0): "skip-trigram",
                                                                                       (0, 1): "skip-trigram"},
                                                          "skip_trigrams": _lists_2()})
right(C, "skip-trigrams as lists of token ids, in another order", _lists_2_changed(lambda d: {
    k: [[__import__("attncircuits.checkpoints.mysteries", fromlist=["x"]).load_mystery("mystery-2").task
         .token_names().index(x) for x in t] for t in reversed(v)] for k, v in d.items()}))

def _grammar_rows(change):
    """The reference grammar of mystery 2, changed."""
    return lambda model, task: change(solutions()["grammar_2"](model, task), model, task)


def _trigger_paths_only(model, task):
    answers = torch.tensor(task.answer_tokens)
    ov = sum(full_ov_circuit(model, 0, h).AB for h in range(model.cfg.n_heads))
    return answers[ov[task.triggers][:, answers].argmax(-1)].expand(len(task.cues), -1).clone()


def _direct_path_only(model, task):
    answers = torch.tensor(task.answer_tokens)
    direct = (model.W_E @ model.W_U)[task.cues][:, answers].argmax(-1)
    return answers[direct][:, None].expand(-1, len(task.triggers)).clone()


def _rows_without_bos(model, task):
    answers = torch.tensor(task.answer_tokens)
    table = torch.zeros(len(task.cues), len(task.triggers), dtype=torch.long)
    for i, cue in enumerate(task.cues):
        for j, trig in enumerate(task.triggers):
            table[i, j] = answers[model(torch.tensor([[trig, cue]]))[0, -1, answers].argmax()]
    return table


def _grammar_by_running(model, task):
    """The model's own answers on one short row per (cue, trigger) pair: BOS, the trigger, the cue."""
    answers = torch.tensor(task.answer_tokens)
    rows = torch.tensor([[0, t, c] for c in task.cues for t in task.triggers])
    with torch.no_grad():
        logits = model(rows)[:, -1, answers]
    return answers[logits.argmax(-1)].reshape(len(task.cues), len(task.triggers))


def _sum_without_start(model, task):
    """The cue's direct path and every head's paths from the trigger and the cue: BOS's left out."""
    answers = torch.tensor(task.answer_tokens)
    ov = [full_ov_circuit(model, 0, h).AB for h in range(model.cfg.n_heads)]
    table = torch.zeros(len(task.cues), len(task.triggers), dtype=torch.long)
    for i, cue in enumerate(task.cues):
        for j, trig in enumerate(task.triggers):
            row = torch.tensor([[0, trig, cue]])
            with torch.no_grad():
                _, cache = model.run_with_cache(row)
                pat = cache.pattern[0][0, :, -1]
                paths = model.W_E[cue] @ model.W_U + sum(pat[h, 1:] @ ov[h][row[0, 1:]] for h in range(len(ov)))
            table[i, j] = answers[paths[answers].argmax()]
    return table


C = "ch12.check_grammar_2"
wrong(C, "the task's own table", lambda model, task: task.table(), "the task's own table", "named")
wrong(C, "indices into the answers", _grammar_rows(lambda g, m, t: g - t.answer_tokens[0]),
      "indices into the answer tokens", "named")
wrong(C, "the trigger's paths alone", _trigger_paths_only, "trigger's OV rows alone", "named")
wrong(C, "rows without the start token", lambda model, task: _rows_without_bos(model, task), "no start token", "named")
wrong(C, "the direct path alone", _direct_path_only, "entries differ")
wrong(C, "transposed", _grammar_rows(lambda g, m, t: g.T), "transposed")
wrong(C, "the cues swapped", _grammar_rows(lambda g, m, t: g.flip(0)), "entries differ")
wrong(C, "the triggers in reverse", _grammar_rows(lambda g, m, t: g.flip(1)), "entries differ")
wrong(C, "token 0 everywhere", lambda model, task: torch.zeros(2, 6, dtype=torch.long), "all zeros")
wrong(C, "the package's model_grammar", lambda model, task: model_grammar(model, task), "the package's own answer",
      "named")
wrong(C, "the sum of paths without the start token's", _sum_without_start, "start token's path is missing", "named")
right(C, "the sum of paths on BOS, trigger, cue", _grammar_rows(lambda g, m, t: g))
right(C, "the model run on rows BOS, trigger, cue", _grammar_by_running)
wrong(C, "a list of lists", _grammar_rows(lambda g, m, t: g.tolist()), "should be a torch.Tensor", "rejected")
wrong(C, "the answers as floats", _grammar_rows(lambda g, m, t: g.float()), "dtype torch.float32")
right(C, "the answers as int32 ids", _grammar_rows(lambda g, m, t: g.int()))  # the text asks for token ids

M3 = {"0.0": "previous-token", "0.1": "previous-token", "0.2": "previous-token", "0.3": "previous-token",
      "1.0": "duplicate-token", "1.1": "duplicate-token", "1.3": "duplicate-token"}
M3V = [("0.1", "1.0", "V"), ("0.1", "1.1", "V"), ("0.1", "1.3", "V")]
M3V_EACH = [("0.0", "1.0", "V"), ("0.1", "1.3", "V"), ("0.2", "1.1", "V"), ("0.3", "1.0", "V")]
C = "ch12.check_mystery_3"
wrong(C, "another head: 1.2 for 1.3", _hyp("mystery-3", {**{k: r for k, r in M3.items() if k != "1.3"},
                                                          "1.2": "duplicate-token"}, M3V_EACH[:1] + [
    ("0.1", "1.2", "V"), ("0.2", "1.1", "V"), ("0.3", "1.0", "V")]),
      "1.2 as duplicate-token: score", "named")
wrong(C, "no composition", _hyp("mystery-3", M3), "no named head (no composition", "named")
wrong(C, "K instead of V", _hyp("mystery-3", M3, [(w, r, "K") for w, r, _ in M3V_EACH]), "K: -", "named")
wrong(C, "induction, not duplicate-token", _hyp("mystery-3", {k: ("induction" if r == "duplicate-token" else r)
                                                              for k, r in M3.items()}, M3V_EACH), "as induction: score", "named")
wrong(C, "layer 1 alone", _hyp("mystery-3", {k: r for k, r in M3.items() if k[0] == "1"}),
      "the task needs heads you did not name", "named", avoid="does 1.")
wrong(C, "layer 0 alone", _hyp("mystery-3", {k: r for k, r in M3.items() if k[0] == "0"}),
      "the task needs heads you did not name", "named", avoid="does 0.")
wrong(C, "a role the course lacks", _hyp("mystery-3", {**M3, "0.0": "mover"}, M3V_EACH), "is not a role of the course",
      "named")
wrong(C, "heads as pairs of floats, truncated into the true ones", _hyp(
    "mystery-3", {(0.9, 1.2): "previous-token", **{k: r for k, r in M3.items() if k != "0.1"}},
    [("0.0", "1.0", "V")]), "is not a head: a head is 'L.H'", "named")
wrong(C, "a composition's head as nested lists", _hyp("mystery-3", M3, [([[0], [1]], "1.0", "V")]),
      "is not a head", "named")
wrong(C, "a composition kind as an int", _hyp("mystery-3", M3, [("0.1", "1.0", 2)]),
      "is not one of 'Q', 'K', 'V'", "named", avoid="could not be compared")
wrong(C, "compositions as a dict", lambda: {"model": "mystery-3", "heads": M3, "compositions": {"0.1": "1.0"}},
      "'compositions' is a list", "named", avoid="could not be compared")
wrong(C, "three V compositions from 0.1: 0.0, 0.2, 0.3 named, feeding nothing named", _hyp("mystery-3", M3, M3V),
      "0.0 feeds no named head", "named")
wrong(C, "a V composition from 0.3 into each", _hyp("mystery-3", M3, [("0.3", r, "v") for r in ("1.0", "1.1", "1.3")]),
      "feeds no named head", "named")
right(C, "one V composition out of each previous-token head, one into each duplicate-token head",
      _hyp("mystery-3", M3, M3V_EACH))
right(C, "every V composition at 3 sd between the named heads", lambda: {
    "model": "mystery-3", "heads": dict(M3), "compositions": [
        (f"0.{w}", f"1.{r}", "V") for w in range(4) for r in (0, 1, 3)
        if __import__("attncircuits.course.grader", fromlist=["x"]).grader_for("mystery-3").z[((0, w), (1, r), "V")]
        >= 3.0]})

def _paths(change):
    """The reference answer_paths, changed."""
    return lambda model, tokens: change(*solutions()["answer_paths"](model, tokens), model, tokens)


def _paths_per_writer(model, tokens):  # each layer-0 head's virtual head scored alone, then averaged
    b0, b1 = model.blocks
    own, U = torch.arange(len(tokens)), model.W_U[:, tokens]
    with torch.no_grad():
        shares = [((model.W_E[tokens] @ b0.W_V[w] @ b0.W_O[w] @ b1.W_V @ b1.W_O @ U).argmax(-1) == own)
                  .float().mean(-1) for w in range(model.cfg.n_heads)]
    return solutions()["answer_paths"](model, tokens)[0], sum(shares) / len(shares)


def _paths_reversed(model, tokens):  # layer 1's OV applied before layer 0's
    b0, b1 = model.blocks
    own, layer0 = torch.arange(len(tokens)), (b0.W_V @ b0.W_O).sum(0)
    with torch.no_grad():
        virtual = ((model.W_E[tokens] @ b1.W_V @ b1.W_O @ layer0 @ model.W_U[:, tokens]).argmax(-1) == own)
    return solutions()["answer_paths"](model, tokens)[0], virtual.float().mean(-1)


def _paths_all_columns(model, tokens):  # the largest logit over the whole vocabulary
    b0, b1 = model.blocks
    layer0 = (b0.W_V @ b0.W_O).sum(0)
    with torch.no_grad():
        rows = model.W_E[tokens]
        out = [((r @ b1.W_V @ b1.W_O @ model.W_U).argmax(-1) == tokens).float().mean(-1) for r in (rows, rows @ layer0)]
    return tuple(out)


def _paths_by_loop(model, tokens):  # one head and one token at a time
    b0, b1 = model.blocks
    layer0 = sum(b0.W_V[w] @ b0.W_O[w] for w in range(model.cfg.n_heads))
    direct, virtual = torch.zeros(model.cfg.n_heads), torch.zeros(model.cfg.n_heads)
    with torch.no_grad():
        for h in range(model.cfg.n_heads):
            ov = b1.W_V[h] @ b1.W_O[h] @ model.W_U[:, tokens]
            for i, t in enumerate(tokens):
                direct[h] += int((model.W_E[t] @ ov).argmax() == i) / len(tokens)
                virtual[h] += int((model.W_E[t] @ layer0 @ ov).argmax() == i) / len(tokens)
    return direct, virtual


C = "ch12.check_answer_paths"
wrong(C, "direct and virtual swapped", _paths(lambda d, v, m, t: (v, d)), "are swapped", "named")
wrong(C, "each virtual head alone, averaged", _paths_per_writer, "scored alone and the shares averaged", "named")
wrong(C, "the OV circuits in the wrong order", _paths_reversed, "in the wrong order", "named")
wrong(C, "the whole vocabulary's columns", _paths_all_columns, "restrict the columns", "named")
wrong(C, "zeros", lambda model, tokens: (torch.zeros(4), torch.zeros(4)), "all zeros")
wrong(C, "NaN in the virtual shares", _paths(lambda d, v, m, t: (d, torch.where(torch.arange(len(v)) == 0, float("nan"), v))),
      "NaN")
wrong(C, "percent, not shares", _paths(lambda d, v, m, t: (100 * d, 100 * v)), "100")
wrong(C, "another head's answer: the heads rolled", _paths(lambda d, v, m, t: (d.roll(1), v.roll(1))),
      "shifted by one along axis 0")
wrong(C, "mystery 3's numbers, typed in", lambda model, tokens: (torch.tensor([0.0, 0.0, 0.35, 0.0]),
                                                                  torch.tensor([1.0, 1.0, 0.0, 0.98])), "values differ by up to")
wrong(C, "one share for the whole layer", _paths(lambda d, v, m, t: (d.mean().expand(4), v.mean().expand(4))),
      "mystery-3, 62 tokens")
wrong(C, "counts, not shares", _paths(lambda d, v, m, t: (d * len(t), v * len(t))), "the answer times 62")
right(C, "the solution", _sol("answer_paths"))
wrong(C, "the package's answer_paths", lambda model, tokens: __import__(
    "attncircuits.analysis.circuit_check", fromlist=["answer_paths"]).answer_paths(model, tokens),
      "the package's own answer", "named")
right(C, "one head and one token at a time", _paths_by_loop)
right(C, "lists of floats in a tuple", _paths(lambda d, v, m, t: (d, v)))

# ---- chapter 14 ------------------------------------------------------------------------------------
C = "ch14.check_llc_from_trace"


def _llc(t, init, nb, drop=True, mean=None):
    import numpy as np

    t = np.asarray(t, dtype=float)
    if drop:
        t = t[np.isfinite(t).all(axis=1)]
    if len(t) == 0:
        return float("nan")
    per = (np.nanmean(t, axis=1) if mean is None else mean(t)) - init
    return float((nb * per).mean())


wrong(C, "no n_beta", lambda t, init, nb: _llc(t, init, 1.0), "multiply by n_beta", "named")
wrong(C, "no init_loss", lambda t, init, nb: _llc(t, 0.0, nb), "subtract init_loss", "named")
wrong(C, "nanmean over everything", lambda t, init, nb: float(nb * (__import__("numpy").nanmean(
    __import__("numpy").asarray(t, dtype=float)) - init)), "diverged", "named")
wrong(C, "last draw only", lambda t, init, nb: _llc(t, init, nb, mean=lambda a: a[:, -1]), "last draw", "named")
wrong(C, "negated", lambda t, init, nb: -_llc(t, init, nb), "wrong sign", "named")
wrong(C, "zeros", lambda t, init, nb: 0.0, "expected")
right(C, "the solution", _sol("llc_from_trace"))
right(C, "with torch", lambda t, init, nb: (lambda x: float("nan") if not torch.isfinite(x).all(1).any() else float(
    (nb * (x[torch.isfinite(x).all(1)].mean(1) - init)).mean()))(torch.as_tensor(t, dtype=torch.float64)))

C = "ch14.check_trace_verdict"


def _verdict(t, init, order="nan first", noise=True, quarter="third", neg="mean"):
    import numpy as np

    from attncircuits.analysis.llc import batch_noise

    t = np.asarray(t, dtype=float)
    finite = np.isfinite(t).all()
    if order == "nan first" and not finite:
        return "diverged"
    if (t.mean() if neg == "mean" else t[:, -1].mean()) < init:
        return "negative"
    m = t.mean(0)
    q = max(1, len(m) // 4)
    rise = m[-q:].mean() - init
    other = m[-2 * q:-q] if quarter == "third" else m[:q]
    gap = abs(m[-q:].mean() - other.mean())
    if gap > max(0.1 * abs(rise), 3 * batch_noise(t) if noise else 0.0):
        return "not flat"
    return "flat" if finite else "diverged"


wrong(C, "NaN tested last", lambda t, init: _verdict(t, init, order="nan last"), "NaN first", "named")
wrong(C, "no noise allowance", lambda t, init: _verdict(t, init, noise=False), "batch noise", "named")
wrong(C, "against the first quarter", lambda t, init: _verdict(t, init, quarter="first"), "third quarter", "named")
wrong(C, "negative from the last draw", lambda t, init: _verdict(t, init, neg="last"), "last draw", "named")
wrong(C, "a bool: flat or not", lambda t, init: _verdict(t, init) == "flat", "str")
wrong(C, "capitalised", lambda t, init: _verdict(t, init).capitalize(), "lower case", "named")
right(C, "the solution", _sol("trace_verdict"))
right(C, "the package's rule written again with torch", lambda t, init: _verdict(
    torch.as_tensor(t, dtype=torch.float64).numpy(), float(init)))

C = "ch14.check_critical_steps"


def _turns(steps, values, k=0, indices=False, flat="skip", ends=False, only=None):
    import numpy as np

    d = np.sign(np.diff(np.asarray(values, dtype=float)))
    last = 0.0
    if flat == "every":
        idx = [i for i in range(1, len(values) - 1) if d[i - 1] != d[i]]
    else:
        idx = []
        for i, s in enumerate(d):
            if s == 0:
                continue
            if last != 0 and s != last:
                j = i
                while j > 0 and d[j - 1] == 0:
                    j -= 1
                if only is None or (only == "max") == (last > 0):
                    idx.append(j)
            last = s
    idx = [min(len(steps) - 1, max(0, i + k)) for i in idx]
    if ends:
        idx = [0, *idx, len(steps) - 1]
    return idx if indices else [int(steps[i]) for i in idx]


wrong(C, "indices", lambda s, v: _turns(s, v, indices=True), "indices", "named")
wrong(C, "one late", lambda s, v: _turns(s, v, k=1), "late", "named")
wrong(C, "one early", lambda s, v: _turns(s, v, k=-1), "early", "named")
wrong(C, "every flat point", lambda s, v: _turns(s, v, flat="every"), "should have")
wrong(C, "maxima only", lambda s, v: _turns(s, v, only="max"), "should have")
wrong(C, "ends included", lambda s, v: _turns(s, v, ends=True), "should have")
right(C, "the solution", _sol("critical_steps"))
right(C, "with torch signs", lambda s, v: _turns(list(s), torch.as_tensor(v, dtype=torch.float64).tolist()))


exercise_table_edges.add(wrong, right, lambda name: _sol(name))  # after every chapter's rows: the references come first
exercise_table_ch08.add(wrong, right, lambda name: _sol(name))
exercise_table_ch13.add(wrong, right, lambda name: _sol(name))
exercise_table_more.add(wrong, right, lambda name: _sol(name))


def outcome(row: Row) -> tuple[str, str]:
    """(class, message): class is accepted / raised / named / symptom / vague / misleading for a
    wrong answer (named or symptom only when the message has the row's words), ok / rejected for a
    right one."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            ok = _check(row.check)(row.fn)
    except BaseException as err:  # a check must never raise
        return "raised", f"{type(err).__name__}: {err}"
    text = " ".join(buf.getvalue().split())
    if row.expect == "pass":
        return ("ok" if ok is True and text.startswith("✓") else "rejected"), text
    if ok:
        return "accepted", text
    if row.avoid and row.avoid.lower() in text.lower():
        return "misleading", text
    if row.words.lower() in text.lower():
        return row.expect, text
    detail = text.split(": ", 2)[-1]
    if "0 times the answer" in detail:
        return "misleading", text
    if VAGUE_RE.match(detail) or "not attempted" in text:
        return "vague", text
    return "misleading", text


def reference_rows() -> list[Row]:
    """One right answer per check (the first in the table): the 55 checks on the reference solutions."""
    first: dict[str, Row] = {}
    for row in ROWS:
        if row.expect == "pass":
            first.setdefault(row.check, row)
    return list(first.values())


def summary(rows=None) -> dict:
    rows = ROWS if rows is None else rows
    counts: dict = {}
    for row in rows:
        cls, text = outcome(row)
        counts[cls] = counts.get(cls, 0) + 1
        if cls not in ("ok", "named", "symptom"):
            print(f"[{cls}] {row.check} / {row.label}: {text[:300]}")
    return counts


if __name__ == "__main__":
    import sys
    import time

    only = sys.argv[1:]
    t = time.perf_counter()
    rows = [r for r in ROWS if not only or any(o in r.check for o in only)]
    print(summary(rows), f"{len(rows)} rows in {time.perf_counter() - t:.0f} s")
