"""Checks for chapter 4, skip-trigrams: one triple's score, the top triples of a head, the non-zero
eigenvalues of a ``d_vocab x d_vocab`` product from the small ``d_head x d_head`` one, and the
eigenvalue copying score.

The references are :func:`~attncircuits.analysis.circuits.top_skip_trigrams`,
:meth:`~attncircuits.analysis.circuits.FactoredMatrix.eigenvalues` and
:func:`~attncircuits.analysis.circuits.copying_summary`; each is withheld from the learner's function
while it runs (the package's own answer), ``FactoredMatrix.eigenvalues`` in exercise 4.3 only (4.4's
text offers it).
"""

from __future__ import annotations

import torch

from attncircuits.analysis.circuits.copying import copying_summary
from attncircuits.analysis.circuits.factored import full_ov_circuit, full_qk_circuit
from attncircuits.analysis.circuits.factored_matrix import FactoredMatrix
from attncircuits.analysis.circuits.skip_trigrams import top_skip_trigrams
from attncircuits.checkpoints.pretrained import frequent_tokens
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises._core import (
    Case,
    Diagnosis,
    Draw,
    Method,
    guarded,
    other_heads,
    random_model,
    run_check,
    shipped,
)

__all__ = ["check_skip_trigram_score", "check_top_skip_trigrams", "check_nonzero_eigenvalues", "check_copying_score"]


# ---- Exercise 4.1 --------------------------------------------------------------------------------
_LAST_LAYER = ("these are the weights of the model's last layer (model.blocks[-1]); head 0.head is in layer 0: "
               "full_qk_circuit(model, 0, head) and full_ov_circuit(model, 0, head)")


def _last_layer(model) -> int | None:
    """The last layer when it is not layer 0 (else None: the mistake of reading it changes nothing)."""
    return model.cfg.n_layers - 1 if model.cfg.n_layers > 1 else None


def _score(model, head, source, dest, output, n_keys, centered=True, attention=True, swapped=False, layer=0):
    qk, ov = full_qk_circuit(model, layer, head), full_ov_circuit(model, layer, head)
    if centered:
        qk, ov = qk.centered(-1), ov.centered(-1)
    q = qk.restrict([source], [dest]) if swapped else qk.restrict([dest], [source])
    x, o = float(q.dense()[0, 0]), float(ov.restrict([source], [output]).dense()[0, 0])
    if not attention:
        return x * o
    a = torch.tensor(x).exp()
    return float(a / (a + n_keys - 1)) * o


@guarded
def check_skip_trigram_score(skip_trigram_score) -> bool:
    """``skip_trigram_score(model, head, source, dest, output, n_keys)`` -> a float: the attention
    ``dest`` gives ``source`` among ``n_keys`` average keys times the centred OV entry."""
    m1, m2 = shipped("attn-only-1l").model, shipped("attn-only-2l").model
    table = top_skip_trigrams(m1, 0, k=1, heads=[0, 2])
    words = frequent_tokens(shipped("attn-only-1l").tokenizer, 2)
    rnd = random_model(n_layers=1, seed=1)
    args = [(m1, 0, *table.triples(0)[0].tolist(), 64), (m1, 2, *table.triples(2)[0].tolist(), 64),
            (m1, 1, *words[[0, 1, 0]].tolist(), 64), (rnd, 3, 5, 17, 40, 8), (m2, 1, *words[[0, 1, 0]].tolist(), 64)]
    labels = ["attn-only-1l head 0.0, its top triple", "attn-only-1l head 0.2, its top triple",
              "attn-only-1l head 0.1, frequent words", "a random model",
              "attn-only-2l head 0.1, frequent words (head 0.1 is layer 0's of two)"]
    cases = [Case(label, a, kind="random" if label == "a random model" else "shipped", others=other_heads(a, 1, 4))
             for label, a in zip(labels, args)]
    mistakes = [
        Diagnosis(
            "the circuits are not centred: subtract each QK row's mean over keys and each OV row's mean "
            "over outputs (a softmax ignores shared shifts)",
            lambda e, c: _score(*c.args, centered=False),
        ),
        Diagnosis(
            "the QK entry was used as it is; turn it into attention: exp(x) / (exp(x) + n_keys - 1)",
            lambda e, c: _score(*c.args, attention=False),
        ),
        Diagnosis(
            "QK[source, dest] was read; its rows are destinations (queries): QK[dest, source]",
            lambda e, c: _score(*c.args, swapped=True),
        ),
        Diagnosis(_LAST_LAYER, lambda e, c: None if _last_layer(c.args[0]) is None else _score(
            *c.args, layer=_last_layer(c.args[0]))),
    ]
    return run_check(skip_trigram_score, cases, _score, mistakes, atol=1e-4, rtol=1e-3, returns=float,
                     n_generated=_draws.MODEL_CASES, generate=_triple)


def _triple(draw: Draw) -> Case:
    """A model of one or two layers, a head of layer 0 and a triple; edges: two keys (n_keys 2),
    source = dest = output, the first and the last token ids, the last head, a thousand keys."""
    edge = draw.edge(4)
    m = _draws.model(draw, (1, 2), edge=edge, min_vocab=3)
    v = m.cfg.d_vocab
    s, d, o = ((1, 1, 1), (0, v - 1, v - 1), (v - 1, 0, 0), (2, 1, 0))[edge] if edge is not None else (
        draw.rng.randrange(v), draw.rng.randrange(v), draw.rng.randrange(v))
    n_keys = (2, 2, 1000, 7)[edge] if edge is not None else draw.int(2, 64)
    args = (m, _draws.head(draw, m.cfg.n_heads, edge), s, d, o, n_keys)
    return Case("", args, others=other_heads(args, 1, m.cfg.n_heads))


# ---- Exercise 4.2 --------------------------------------------------------------------------------
def _top(model, head, tokens, k, centered=True, center_subset=False, attention=True, layer=0):
    """Top ``k`` triples by brute force over the subset: [k, 3] vocabulary ids, best first."""
    n_keys = max(2, model.cfg.n_ctx // 2)
    qk, ov = full_qk_circuit(model, layer, head), full_ov_circuit(model, layer, head)
    if centered and not center_subset:
        qk, ov = qk.centered(-1), ov.centered(-1)
    qk, ov = qk.restrict(tokens, tokens).dense(), ov.restrict(tokens, tokens).dense()
    if center_subset:
        qk, ov = qk - qk.mean(-1, keepdim=True), ov - ov.mean(-1, keepdim=True)
    attn = qk.exp() / (qk.exp() + n_keys - 1) if attention else qk
    score = attn.T[:, :, None] * ov[:, None, :]  # [source, dest, output]
    flat = score.flatten().topk(k).indices
    n = len(tokens)
    s, d, o = flat // (n * n), flat // n % n, flat % n
    return torch.stack([tokens[s], tokens[d], tokens[o]], -1)


def _compare_triples(got, expected, case) -> str | None:
    if isinstance(got, (list, tuple)):
        try:
            got = torch.tensor(got, dtype=torch.long)  # a list of [source, dest, output] is as good
        except (TypeError, ValueError, RuntimeError):
            return f"return a tensor of shape [k, 3], got a {type(got).__name__} that is not a table of ids"
    if not isinstance(got, torch.Tensor):
        return f"return a tensor of shape [k, 3], got a {type(got).__name__}"
    if tuple(got.shape) != tuple(expected.shape):
        hint = ": transposed" if tuple(got.shape) == tuple(expected.shape)[::-1] else ""
        return f"the output has shape {list(got.shape)}, expected {list(expected.shape)}{hint}"
    if got.is_floating_point():
        return "return token ids (an integer tensor), not scores"
    got_set = {tuple(r) for r in got.tolist()}
    if got_set == {tuple(r) for r in expected.tolist()}:
        if got.tolist() == expected.tolist():
            return None
        if got.tolist() == expected.flip(0).tolist():
            return "the right triples in reverse order: return them best first (descending score)"
        return "the right triples in another order: return them best first (by descending score)"
    for perm in ([1, 0, 2], [0, 2, 1], [2, 1, 0], [1, 2, 0], [2, 0, 1]):
        if got_set == {tuple(r) for r in expected[:, perm].tolist()}:
            return "the right triples with the columns in another order: return (source, destination, output)"
    model, head, tokens, k = case.args
    for message, kw in [
        ("the circuits are not centred (subtract the row means over the whole vocabulary)", {"centered": False}),
        ("centred over the subset; centre each row over the whole vocabulary, then restrict", {"center_subset": True}),
        ("the QK entries were used as they are; turn them into attention first", {"attention": False}),
    ]:
        if got_set == {tuple(r) for r in _top(model, head, tokens, k, **kw).tolist()}:
            return message
    last = _last_layer(model)
    if last is not None and got_set == {tuple(r) for r in _top(model, head, tokens, k, layer=last).tolist()}:
        return _LAST_LAYER
    for h in range(model.cfg.n_heads):
        if h != head and got_set == {tuple(r) for r in _top(model, h, tokens, k).tolist()}:
            return f"these are head 0.{h}'s top triples; the case asks for head 0.{head}"
    missing = [r for r in expected.tolist() if tuple(r) not in got_set]
    return f"{len(missing)} of the {len(expected)} triples differ (e.g. (source, dest, output) {tuple(missing[0])} is missing)"


@guarded
def check_top_skip_trigrams(top_skip_trigrams_of_head) -> bool:
    """``top_skip_trigrams_of_head(model, head, tokens, k)`` -> ``[k, 3]`` token ids (source,
    destination, output) of the ``k`` best triples among ``tokens``, best first."""
    m1, m2 = shipped("attn-only-1l").model, shipped("attn-only-2l").model
    words = frequent_tokens(shipped("attn-only-1l").tokenizer, 40)
    rnd = random_model(n_layers=1, seed=2)
    cases = [
        Case("attn-only-1l head 0.0, 40 frequent words", (m1, 0, words, 10)),
        Case("attn-only-1l head 0.1, 40 frequent words", (m1, 1, words, 5)),
        Case("a random model, 20 tokens", (rnd, 2, torch.arange(3, 23), 6), kind="random"),
        Case("attn-only-2l head 0.2 (layer 0's of two), 40 frequent words", (m2, 2, words, 5)),
    ]
    return run_check(
        top_skip_trigrams_of_head,
        cases,
        lambda m, h, t, k: top_skip_trigrams(m, 0, k, heads=[h], tokens=t).triples(h),
        compare=_compare_triples,
        n_generated=_draws.MODEL_CASES,
        generate=_subset,
        withheld=[top_skip_trigrams],
    )


def _subset(draw: Draw):
    """A model of one or two layers (n_ctx 4 or more), a head of layer 0, distinct tokens and k <= n
    (the reference keeps at most n); edges: one token (one triple), k = n, the last id first, k = 1.
    Drawn again until the best k scores are positive and apart from the next (so "best first" has
    one answer)."""
    edge = draw.edge(4)
    while True:
        m = _draws.model(draw, (1, 2), edge=edge, min_ctx=4, min_vocab=3)
        v = m.cfg.d_vocab
        n = (1, 3, min(v, 4), 2)[edge] if edge is not None else draw.int(1, min(v, 6))
        tokens = torch.randperm(v, generator=draw.gen)[:n]
        if edge == 2:
            tokens = torch.cat([torch.tensor([v - 1]), tokens[tokens != v - 1]])[:n]
        k = (1, n, n, 1)[edge] if edge is not None else draw.int(1, n)
        head = _draws.head(draw, m.cfg.n_heads, edge)
        if _clear_top(m, head, tokens, k):
            return m, head, tokens, k


def _clear_top(model, head, tokens, k) -> bool:
    n_keys = max(2, model.cfg.n_ctx // 2)
    qk = full_qk_circuit(model, 0, head).centered(-1).restrict(tokens, tokens).dense()
    ov = full_ov_circuit(model, 0, head).centered(-1).restrict(tokens, tokens).dense()
    score = ((qk.exp() / (qk.exp() + n_keys - 1)).T[:, :, None] * ov[:, None, :]).flatten().sort(descending=True).values
    gaps = score[: k + 1].diff().abs() if len(score) > k else score[:k].diff().abs()
    return bool(score[k - 1] > 1e-3) and bool((gaps > 1e-4 * score[0]).all())


# ---- Exercise 4.3 --------------------------------------------------------------------------------
def _compare_eigenvalues(got, expected, case) -> str | None:
    A, B = case.args
    if not isinstance(got, torch.Tensor):
        return f"return a tensor of eigenvalues, got a {type(got).__name__}"
    if got.ndim != 1:
        return f"return a 1-D tensor of {len(expected)} eigenvalues, got shape {list(got.shape)}"
    if len(got) == A.shape[0] and len(got) != len(expected):
        return (
            f"{len(got)} eigenvalues: those of the big {A.shape[0]} x {A.shape[0]} product; it has only "
            f"{B.shape[0]} non-zero ones, the eigenvalues of the small product B @ A"
        )
    if len(got) != len(expected):
        return f"got {len(got)} eigenvalues, expected {len(expected)} (one per column of A)"
    missing = _unmatched(got, expected)
    if missing is None:
        return None
    if not got.is_complex():
        svals = torch.linalg.svdvals(B.double() @ A.double())
        if torch.allclose(got.double().sort().values, svals.sort().values, rtol=1e-3, atol=1e-5):
            return "these are singular values, not eigenvalues: use torch.linalg.eigvals"
        if expected.imag.abs().max() > 1e-4:
            return "these are real numbers; the eigenvalues of a non-symmetric matrix are complex: use torch.linalg.eigvals"
    return missing


def _unmatched(got, expected) -> str | None:
    """None when each expected eigenvalue has its own of the learner's nearby, else what is missing."""
    g, e = got.detach().to(torch.complex128), expected.to(torch.complex128)
    if not bool(torch.isfinite(g).all()):
        n = int((~torch.isfinite(g)).sum())
        return f"{n} of your {len(g)} eigenvalues are NaN or infinite (first at index {int((~torch.isfinite(g)).nonzero()[0])})"
    tol = 1e-3 * float(e.abs().max()) + 1e-5
    remaining = list(range(len(g)))
    for value in e:  # match each expected eigenvalue to the nearest unused one of the learner's
        dist = (g[remaining] - value).abs()
        j = int(dist.argmin())
        if float(dist[j]) > tol:
            return f"the eigenvalue {complex(value):.4g} is missing (nearest of yours: {complex(g[remaining][j]):.4g})"
        remaining.pop(j)
    return None


@guarded
def check_nonzero_eigenvalues(nonzero_eigenvalues) -> bool:
    """``nonzero_eigenvalues(A, B)`` -> the ``k`` eigenvalues of ``A @ B`` (``A [m, k]``, ``B [k, m]``,
    ``k < m``) that can be non-zero, a complex ``[k]`` tensor in any order."""
    ov = full_ov_circuit(shipped("attn-only-1l").model, 0, 0).centered(-1)
    gen = torch.Generator().manual_seed(3)
    A, B = torch.randn(50, 6, generator=gen), torch.randn(6, 50, generator=gen)
    eye = torch.eye(3, 2)  # A @ B = diag(2, -3, 0)
    cases = [
        Case("attn-only-1l head 0.0's OV circuit (2048 x 2048)", (ov.A, ov.B)),
        Case("random 50 x 6 and 6 x 50 factors", (A, B), kind="random"),
        Case("A @ B = diag(2, -3, 0)", (eye, torch.tensor([[2.0, 0, 0], [0, -3, 0]])), kind="hand-built"),
    ]
    return run_check(
        nonzero_eigenvalues,
        cases,
        lambda a, b: FactoredMatrix(a, b).eigenvalues(),
        compare=_compare_eigenvalues,
        method=Method(
            "you formed the big m x m product (A @ B, 2048 x 2048 on the shipped case); its non-zero "
            "eigenvalues are those of the small k x k product B @ A",
            max_numel=1_000_000,
        ),
        slow_hint="the eigenvalues of the d_vocab x d_vocab product take long: use the small k x k product B @ A",
        generate=_factors,
        withheld=[(FactoredMatrix, "eigenvalues")],
    )


def _factors(draw: Draw):
    """``A [m, k]``, ``B [k, m]`` with ``k < m``; edges: k = 1, m = k + 1, a repeated eigenvalue
    (B @ A = 2 I), a zero eigenvalue, a pair of complex ones (a rotation), tiny values."""
    edge = draw.edge(6)
    m, k = ((2, 1), (5, 4), (6, 3), (7, 3), (4, 2), (9, 4))[edge] if edge is not None else (
        draw.int(2, 40), None)
    k = k if k is not None else draw.int(1, m - 1)
    A, B = draw.randn(m, k), draw.randn(k, m)
    note = ""
    if edge == 2:
        B = 2 * torch.linalg.pinv(A)
        note = "B @ A = 2 I"
    elif edge == 3:
        B[-1] = B[0]
        A[:, -1] = A[:, 0]
        note = "B @ A is singular"
    elif edge == 4:
        A, B = torch.eye(m, k), torch.cat([torch.tensor([[0.0, -1.0], [1.0, 0.0]]), torch.zeros(2, m - 2)], 1)
        note = "the eigenvalues are i and -i"
    elif edge == 5:
        A, B = A * 1e-3, B * 1e-3
        note = "entries about 1e-3"
    return Case(note, (A, B))


# ---- Exercise 4.4 --------------------------------------------------------------------------------
def _hand_built_anti_copying():
    """attn-only-1l with head 0.0's W_O negated: its OV circuit, and so its eigenvalues, flip sign."""
    model = shipped("attn-only-1l").model
    flipped = random_model(n_layers=1, seed=0, **{k: v for k, v in model.cfg.to_dict().items() if k != "n_layers"})
    flipped.load_state_dict(model.state_dict())
    with torch.no_grad():
        flipped.blocks[0].W_O[0] *= -1
    return flipped


def _score_variant(model, head, centered=True, real=False, layer=0):
    ov = full_ov_circuit(model, layer, head)
    ev = (ov.centered(-1) if centered else ov).eigenvalues()
    if real:
        return float(ev.real.sum() / ev.real.abs().sum())
    return float(ev.sum().real / ev.abs().sum())


@guarded
def check_copying_score(copying_score) -> bool:
    """``copying_score(model, head)`` -> ``Σλ / Σ|λ|`` (a float) over the eigenvalues of head
    ``0.head``'s OV circuit, each row centred over the outputs."""
    m1, m2 = shipped("attn-only-1l").model, shipped("attn-only-2l").model
    rnd, anti = random_model(n_layers=1, seed=4), _hand_built_anti_copying()
    cases = [
        Case("attn-only-1l head 0.0", (m1, 0), others=other_heads((m1, 0), 1, 4)),
        Case("attn-only-1l head 0.2", (m1, 2), others=other_heads((m1, 2), 1, 4)),
        Case("a random model", (rnd, 1), kind="random", others=other_heads((rnd, 1), 1, 4)),
        Case("head 0.0 with W_O negated", (anti, 0), kind="hand-built"),
        Case("attn-only-2l head 0.1 (layer 0's of two)", (m2, 1), others=other_heads((m2, 1), 1, 4)),
    ]
    mistakes = [
        Diagnosis(
            "the OV rows are not centred: subtract each row's mean over outputs (W_U minus its mean "
            "column) before taking eigenvalues",
            lambda e, c: _score_variant(*c.args, centered=False),
        ),
        Diagnosis(
            "the absolute value of Σλ was taken: Σλ / Σ|λ| keeps its sign, negative for a head that "
            "suppresses the token it attends to",
            lambda e, c: abs(e),
        ),
        Diagnosis(
            "the imaginary parts were dropped before |λ|; divide by the sum of the complex moduli",
            lambda e, c: _score_variant(*c.args, real=True),
        ),
        Diagnosis(_LAST_LAYER.replace("full_qk_circuit(model, 0, head) and ", ""), lambda e, c: None
                  if _last_layer(c.args[0]) is None else _score_variant(*c.args, layer=_last_layer(c.args[0]))),
    ]
    return run_check(
        copying_score,
        cases,
        lambda m, h: float(copying_summary(m, 0, n_shuffles=0).eigen_score[h]),
        mistakes,
        atol=1e-4,
        rtol=1e-3,
        returns=float,
        n_generated=_draws.MODEL_CASES,
        generate=_model_head,
        withheld=[copying_summary],
    )


def _model_head(draw: Draw) -> Case:
    """A model of one or two layers (3 tokens or more) and a head of layer 0; edges: one head of
    width 1 (one eigenvalue), the last head."""
    edge = draw.edge(4)
    m = _draws.model(draw, (1, 2), edge=edge, min_vocab=3)
    args = (m, _draws.head(draw, m.cfg.n_heads, edge))
    return Case("", args, others=other_heads(args, 1, m.cfg.n_heads))
