"""Checks for chapter 7, why two layers: the in-context-learning score, the loss per copy of a
repeated sequence, smeared keys, and per-head direct logit attribution.

The reference for the last one is :func:`attncircuits.analysis.scores.logit_attribution` (the chapter's
later cells use it): the logit of the next token split exactly into the direct path and one term
per head. The package's own answers (the ICL score, ``RepeatedLossCurve.copy_means``,
``smear_scores``, ``logit_attribution``) are withheld while the learner's function runs.
"""

from __future__ import annotations

import torch

from attncircuits.analysis import losses
from attncircuits.analysis.attribution import logit_attribution
from attncircuits.checkpoints.pretrained import validation_windows
from attncircuits.course.exercises import _core, _draws
from attncircuits.course.exercises._core import (
    Case,
    Diagnosis,
    Draw,
    Identity,
    guarded,
    random_model,
    random_tokens,
    report,
    run_check,
    shipped,
)
from attncircuits.course.exercises._run import probe
from attncircuits.models import smeared

__all__ = [
    "check_copy_losses",
    "check_icl_score",
    "check_logit_attribution",
    "check_smear_scores",
]


def _icl(nll, late, early):
    return (nll[:, late - 1] - nll[:, early - 1]).mean().item()


def _copy_means(loss, seq_len, n_repeats):
    return losses.RepeatedLossCurve(loss, seq_len, n_repeats).copy_means()


# ---- 7.1 the in-context-learning score ------------------------------------------------------------
@guarded
def check_icl_score(fn) -> bool:
    """``icl_score(nll [batch, target], late, early) -> float`` (``nll[:, t]`` is the loss of token ``t + 1``)."""
    m1 = shipped("attn-only-1l").model
    text = validation_windows(n_ctx=m1.cfg.n_ctx)[:16]
    nll = losses.per_token_loss(m1, text)
    noise = torch.rand(8, 40, generator=torch.Generator().manual_seed(0)) * 5
    cases = [
        Case("attn-only-1l on 16 windows, tokens 125 vs 12", (nll, 125, 12)),
        Case("random losses, tokens 30 vs 5", (noise, 30, 5), kind="random"),
    ]
    return run_check(
        fn,
        cases,
        _icl,
        [
            Diagnosis("off by one: the loss of token t is entry t - 1", lambda e, c: _icl(c.args[0], c.args[1] + 1, c.args[2] + 1)),
            Diagnosis("the wrong sign: late minus early", lambda e, c: -e),
        ],
        name="icl_score",
        withheld=[losses.icl_scores_per_row, losses.icl_score_from_loss, losses.in_context_learning_score],
        returns=float,
        generate=_nll,
    )


def _nll(draw: Draw):
    """nll ``[batch, pos - 1]`` and two token indices in ``1 .. pos - 1``; edges: late the last
    token and early the first, one target, late = early, one row, a loss of 0 everywhere."""
    edge = draw.edge(5)
    b, n = ((2, 6), (1, 1), (3, 4), (1, 5), (2, 3))[edge] if edge is not None else (draw.int(1, 4), draw.int(1, 30))
    nll = draw.rand(b, n, hi=5.0) * (edge != 4)
    late, early = ((n, 1), (1, 1), (2, 2), (n, 2), (n, 1))[edge] if edge is not None else (draw.int(1, n), draw.int(1, n))
    return nll, late, early


# ---- 7.2 loss per copy ----------------------------------------------------------------------------
@guarded
def check_copy_losses(fn) -> bool:
    """``copy_losses(loss [target], seq_len, n_repeats) -> list[float]``: the mean loss of each copy,
    its first target left out."""
    m2 = shipped("attn-only-2l").model
    curve = losses.repeated_loss_curve(m2, 25, 4, batch_size=4)
    noise = torch.rand(3 * 7, generator=torch.Generator().manual_seed(1))
    cases = [
        Case("attn-only-2l, 25 tokens x 4", (curve.loss, 25, 4)),
        Case("random losses, 7 tokens x 3", (noise, 7, 3), kind="random"),
    ]

    def with_first(e, c):
        loss, L, n = c.args
        return [loss[k * L : (k + 1) * L].mean().item() for k in range(n)]

    def shifted(e, c):
        loss, L, n = c.args
        return [loss[k * L + 2 : (k + 1) * L + 1].mean().item() for k in range(n)]

    return run_check(
        fn,
        cases,
        _copy_means,
        [
            Diagnosis("you kept each copy's first target: nothing before it predicts it, leave it out", with_first),
            Diagnosis("off by one position: entry t of the loss predicts token t + 1, and token 0 is [EOT]", shifted),
            Diagnosis("the copies are in reverse order: the first item is the first copy's mean",
                      lambda e, c: list(e)[::-1]),
        ],
        name="copy_losses",
        withheld=[(losses.RepeatedLossCurve, "copy_means")],
        atol=1e-5,
        generate=_copies,
        identities=[Identity("loss has seq_len * n_repeats entries", lambda loss, L, n: loss.shape == (L * n,))],
    )


def _copies(draw: Draw):
    """loss ``[seq_len * n_repeats]``, seq_len (2 or more: a copy keeps one target besides its
    first) and n_repeats; edges: one copy, two tokens a copy, losses of 0, eight copies."""
    edge = draw.edge(4)
    L, n = ((5, 1), (2, 3), (3, 2), (4, 8))[edge] if edge is not None else (draw.int(2, 10), draw.int(1, 5))
    return draw.rand(L * n, hi=4.0) * (edge != 2), L, n


# ---- 7.3 smeared keys -----------------------------------------------------------------------------
def _nan_gradient(fn, scores) -> bool:
    """Whether the learner's smear passes NaN back to the weights (the reference's gradient is
    finite; the learner's forward values may still be right: inf - inf shows only in the backward
    pass)."""
    weight = torch.tensor([0.3, 0.5, 0.7, 0.9], requires_grad=True)
    got = probe(lambda s, w: (fn(s, w), w), Case("a gradient probe", (scores, weight), grad=True),
                time_limit=2 * _core.MIN_CALL_LIMIT)  # 10 s; read when called, as the checks' own limits
    try:
        out, w = got
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(out.softmax(-1)[..., 0].sum(), w)
        return bool(torch.isnan(grad).any())
    except Exception:  # no output, no graph, another shape: the check's cases say what is wrong
        return False


@guarded
def check_smear_scores(fn) -> bool:
    """``smear_scores(scores [batch, head, q, k], weight [head]) -> same shape``."""
    m1 = shipped("attn-only-1l").model
    toks = losses.repeated_tokens(m1, 10, batch_size=2)
    real = m1.run_with_cache(toks)[1].attn_scores[0]
    rnd = random_model(n_layers=1, seed=3)
    rs = rnd.run_with_cache(random_tokens(rnd.cfg.d_vocab, (2, 12)))[1].attn_scores[0]
    cases = [
        Case("attn-only-1l scores, weights 0.3, 0.5, 0.7, 0.9", (real, torch.tensor([0.3, 0.5, 0.7, 0.9]))),
        Case("a random model's scores, weights 0.2 ... 0.8", (rs, torch.linspace(0.2, 0.8, 4)), kind="random"),
    ]

    if _nan_gradient(fn, real):
        return report("smear_scores", False, (
            "your scores are right, but their gradient with respect to the weights is NaN: the masked "
            "-inf entries meet inf - inf in the backward pass (weight · -inf + (1 - weight) · -inf), so "
            "training the smear weight fails. Fill the masked entries with 0 before mixing, and mask "
            "again after"))

    def swapped(e, c):
        return smeared.smear_scores(c.args[0], 1 - c.args[1])

    def next_key(e, c):
        s, w = c.args
        masked = torch.isinf(s)
        z = s.masked_fill(masked, 0.0)
        nxt = torch.cat([z[..., 1:], z[..., -1:]], dim=-1)
        ww = w[None, :, None, None]
        return (ww * z + (1 - ww) * nxt).masked_fill(masked, float("-inf"))

    def first_key(fill):
        def wrong(e, c):
            s, w = c.args
            masked = torch.isinf(s)
            z = s.masked_fill(masked, 0.0)
            first = torch.zeros_like(z[..., :1]) if fill == "zero" else z[..., -1:]
            ww = w[None, :, None, None]
            return (ww * z + (1 - ww) * torch.cat([first, z[..., :-1]], -1)).masked_fill(masked, float("-inf"))

        return wrong

    first_key_message = ("key 0 has no previous key: its S[q, -1] is S[q, 0], its own score, not {} (so key 0 keeps "
                         "its score)")
    return run_check(
        fn,
        cases,
        smeared.smear_scores,
        [
            Diagnosis("the weights are swapped: σ(α) goes with the key's own score, 1 - σ(α) with the previous key's",
                      swapped),
            Diagnosis(first_key_message.format("0"), first_key("zero")),
            Diagnosis(first_key_message.format("the last key's (torch.roll wraps around)"), first_key("roll")),
            Diagnosis("you mixed in the *next* key (j + 1); the smeared key mixes in key j - 1", next_key),
            Diagnosis("the scores are not smeared (returned unchanged): mix each key's score with the previous key's",
                      lambda e, c: c.args[0]),
        ],
        name="smear_scores",
        withheld=[smeared.smear_scores],
        atol=1e-4,
        generate=_scores,
        identities=[Identity("the entries above the diagonal are -inf, weights in [0, 1]", lambda s, w: bool(
            (s.triu(1) == float("-inf"))[..., ~torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).tril()].all())
            and bool(((w >= 0) & (w <= 1)).all()))],
    )


def _scores(draw: Draw):
    """Scores ``[batch, head, q, k]`` with -inf above the diagonal and a weight per head in [0, 1];
    edges: one position (key 0 is its own previous key), weights 0 and 1, one head, equal scores."""
    edge = draw.edge(4)
    b, h, n = ((1, 2, 1), (2, 2, 4), (1, 1, 5), (1, 3, 3))[edge] if edge is not None else (
        draw.int(1, 2), draw.int(1, 4), draw.int(1, 8))
    scores = draw.randn(b, h, n, n, scale=3.0) * (edge != 3)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    weight = torch.tensor([0.0, 1.0])[:h] if edge == 1 else draw.rand(h)
    return scores, weight


# ---- 7.4 per-head direct logit attribution --------------------------------------------------------
@guarded
def check_logit_attribution(fn) -> bool:
    """``logit_attribution(model, tokens) -> Tensor [batch, pos - 1, 1 + n_layers * n_heads]``."""
    m2, rnd = shipped("attn-only-2l").model, random_model(n_layers=2, seed=4)
    cases = [
        Case("a random 2-layer model", (rnd, random_tokens(rnd.cfg.d_vocab, (2, 12))), kind="random"),
        Case("attn-only-2l, random tokens repeated", (m2, losses.repeated_tokens(m2, 20, batch_size=2))),
    ]

    def current_token(e, c):
        m, t = c.args
        _, cache = m.run_with_cache(t)
        W_U = m.W_U[:, t[:, :-1]]
        resid = torch.cat([m.W_E[t][:, :-1, None]] + [o[:, :-1] for o in cache.head_out], dim=2)
        return torch.einsum("btsd,dbt->bts", resid, W_U)

    return run_check(
        fn,
        cases,
        logit_attribution,
        [
            Diagnosis("off by one: attribute the logit of the *next* token, tokens[:, 1:]", current_token),
            Diagnosis("the direct path's term (term 0) is missing: W_E[tokens] @ W_U, read at the next token",
                      lambda e, c: torch.cat([torch.zeros_like(e[..., :1]), e[..., 1:]], -1)),
        ],
        name="logit_attribution",
        withheld=[logit_attribution],
        atol=1e-3,
        rtol=1e-4,
        n_generated=_draws.MODEL_CASES,
        generate=lambda draw: _draws.model_tokens(draw, (0, 3), min_pos=2),
    )
