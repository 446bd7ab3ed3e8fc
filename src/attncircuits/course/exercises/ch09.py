"""Checks for chapter 9 (Continue in TransformerLens): a pattern score, a hook, FactoredMatrix circuits.

Each check runs the learner's function on the shipped 2-layer model's attention (or on its
TransformerLens twin) and on a small random model, against the references in
:mod:`attncircuits.models.interop`, and prints one line. Those references (and ``copying_summary``)
are withheld while the learner's function runs: the package's own answers.
"""

from __future__ import annotations

import functools

import torch

from attncircuits.analysis import losses
from attncircuits.analysis.circuits.copying import copying_summary, eigen_copying_score
from attncircuits.analysis.circuits.factored import full_ov_circuit
from attncircuits.course.exercises import _draws
from attncircuits.course.exercises._core import (
    Case, Diagnosis, Draw, Identity, guarded, random_model, run_check, shipped,
)
from attncircuits.models.interop import (
    from_transformer_lens,
    induction_stripe_scores,
    ov_copying_scores,
    to_transformer_lens,
    zero_head_hook,
)

__all__ = ["check_induction_stripe_scores", "check_ov_copying_scores", "check_zero_ablated_loss"]


@functools.lru_cache(maxsize=None)
def _patterns(n_layers: int) -> tuple[torch.Tensor, int]:
    """Layer ``n_layers - 1``'s attention on repeated random tokens, and the copy length."""
    model = shipped("attn-only-2l").model if n_layers == 2 else random_model(n_layers=1, seed=3, n_ctx=33)
    seq_len = 63 if n_layers == 2 else 16
    tokens = losses.repeated_tokens(model, seq_len=seq_len, batch_size=4)
    _, cache = model.run_with_cache(tokens)
    return cache.pattern[-1], seq_len


@guarded
def check_induction_stripe_scores(fn) -> bool:
    """Exercise 9.1: ``fn(pattern, seq_len) -> [head]``."""
    cases = []
    for n_layers, label, kind in ((2, "attn-only-2l, layer 1", "shipped"), (1, "random 1-layer model", "random")):
        pattern, seq_len = _patterns(n_layers)
        cases.append(Case(label, (pattern, seq_len), kind=kind))

    def whole_diagonal(expected, case):
        pattern, L = case.args
        return pattern.diagonal(offset=1 - L, dim1=-2, dim2=-1).mean(dim=(0, 2))

    def off_by_one(expected, case):
        pattern, L = case.args
        return pattern.diagonal(offset=-L, dim1=-2, dim2=-1)[..., 1 : 1 + L].mean(dim=(0, 2))

    return run_check(
        fn,
        cases,
        reference=induction_stripe_scores,
        diagnoses=[
            Diagnosis(
                "you averaged the whole stripe; keep only the second copy's queries (L + 1 .. 2L)", whole_diagonal
            ),
            Diagnosis(
                "that is the earlier copy of the token itself (offset -L); an induction head looks one "
                "further, at the token after it (offset 1 - L)",
                off_by_one,
            ),
            Diagnosis("the queries are off by one: you took L .. 2L - 1; the second copy's queries are L + 1 .. 2L "
                      "(entries 2 .. L + 1 of the diagonal at offset 1 - L)",
                      lambda e, c: c.args[0].diagonal(1 - c.args[1], -2, -1)[..., 1: 1 + c.args[1]].mean((0, 2))),
        ],
        atol=1e-6,
        rtol=1e-5,
        generate=_stripe_case,
        withheld=[induction_stripe_scores],
        identities=[Identity("a causal pattern over pos = 2 seq_len + 1 positions",
                             lambda p, L: p.shape[-1] == 2 * L + 1 and _draws.causal_rows(p))],
    )


def _stripe_case(draw: Draw):
    """A pattern on ``[EOT]`` + two copies of L tokens and L; edges: L = 1, attention exactly on the
    stripe (each later query on the token after its earlier copy), uniform rows, batch and head 1,
    every query on the first token."""
    edge = draw.edge(5)
    L, b, h = ((1, 2, 2), (4, 1, 3), (3, 2, 1), (5, 1, 1), (2, 2, 2))[edge] if edge is not None else (
        draw.int(1, 8), draw.int(1, 2), draw.int(1, 4))
    n = 2 * L + 1
    kind = {2: 3, 4: 1}.get(edge)
    pattern = _draws.causal_pattern(draw, b, h, n, kind)
    if edge == 1:
        keys = torch.arange(n)
        keys[L + 1:] -= L - 1
        pattern = torch.nn.functional.one_hot(keys, n).float().expand(b, h, n, n).clone()
        return Case("each later query attends to the token after its earlier copy", (pattern, L))
    return pattern, L


def _zero_ablated_loss(tl_model, tokens, layer: int, head: int, where: str = "head") -> torch.Tensor:
    """The loss of each next token, ``[batch, pos - 1]``, with head ``layer.head`` zero-ablated by a
    hook on ``blocks.{layer}.attn.hook_z`` (``where="pos"``: the usual slip, position ``head`` zeroed)."""

    def hook(z, hook):
        if where == "pos":
            z[:, head] = 0.0
        else:
            zero_head_hook(z, hook, head)

    return tl_model.run_with_hooks(tokens, return_type="loss", loss_per_token=True,
                                   fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])


@functools.lru_cache(maxsize=None)
def _tl(which: str):
    model = shipped("attn-only-2l").model if which == "shipped" else random_model(n_layers=2, seed=7, n_ctx=64)
    return to_transformer_lens(model)


@functools.lru_cache(maxsize=None)
def _small_tl(n_layers: int, n_heads: int, d_head: int, seed: int):
    return to_transformer_lens(random_model(n_layers=n_layers, seed=seed, d_model=8, n_heads=n_heads, d_head=d_head,
                                            d_vocab=11, n_ctx=10))


def _small_tl_case(draw: Draw, edge: int | None):
    """A small model in TransformerLens; edges: one head of width 1, three layers of three heads."""
    n_layers, n_heads, d_head = ((1, 1, 1), (3, 3, 2), (2, 2, 4), (1, 2, 3))[edge] if edge is not None else (
        draw.int(1, 2), draw.int(1, 3), draw.int(1, 4))
    return _small_tl(n_layers, n_heads, d_head, draw.rng.randrange(3))


def _hooked_case(draw: Draw) -> Case:
    """A small model in TransformerLens, tokens (pos 2 or more), a layer and a head; edges: head
    0.0, the last head of the last layer, one row of two tokens."""
    edge = draw.edge(4)
    tl = _small_tl_case(draw, edge)
    L, H = tl.cfg.n_layers, tl.cfg.n_heads
    b, n = ((1, 2), (2, 10), (1, 5), (2, 3))[edge] if edge is not None else (draw.int(1, 2), draw.int(2, 10))
    layer, head = ((0, 0), (L - 1, H - 1))[edge % 2] if edge is not None else (draw.rng.randrange(L), draw.rng.randrange(H))
    args = (tl, torch.randint(0, 11, (b, n), generator=draw.gen), layer, head)
    return Case("", args, others=lambda: [(f"head {l}.{h}", (tl, args[1], l, h)) for l in range(L) for h in range(H)
                                          if (l, h) != (layer, head)])


@guarded
def check_zero_ablated_loss(fn) -> bool:
    """Exercise 9.2: ``fn(tl_model, tokens, layer, head) -> [batch, pos - 1]``, the loss of each next
    token with a hook that zeroes head ``layer.head``'s ``z``, wired by the learner with
    ``run_with_hooks``. A hook that edits ``z`` in place and returns nothing is as right as one that
    returns it (TransformerLens keeps the edited tensor either way). A hook left on the model given
    (``add_hook`` without ``reset_hooks``) is named by the shared in-place check."""
    tl2, rnd = _tl("shipped"), _tl("random")
    rep = losses.repeated_tokens(shipped("attn-only-2l").model, 20, batch_size=2)
    pairs = [(l, h) for l in range(2) for h in range(4)]

    def others(args):
        return lambda: [(f"head {l}.{h}", (args[0], args[1], l, h)) for l, h in pairs if (l, h) != args[2:]]

    a1, a2 = (tl2, rep, 0, 1), (rnd, rep % rnd.cfg.d_vocab, 1, 2)
    cases = [
        Case("attn-only-2l in TransformerLens, head 0.1, repeated tokens", a1, others=others(a1)),
        Case("a random 2-layer model in TransformerLens, head 1.2", a2, kind="random", others=others(a2)),
    ]
    return run_check(
        fn,
        cases,
        reference=_zero_ablated_loss,
        diagnoses=[
            Diagnosis("you zeroed a position; z is [batch, pos, head, d_head]: the head is axis 2",
                      lambda e, c: _zero_ablated_loss(*c.args, where="pos")),
            Diagnosis("that is the loss with no ablation: the hook did not run (fwd_hooks=[(name, hook)] with "
                      "name 'blocks.{layer}.attn.hook_z')",
                      lambda e, c: c.args[0](c.args[1], return_type="loss", loss_per_token=True)),
            Diagnosis("that is the mean loss; return the loss of each next token (loss_per_token=True)",
                      applies=lambda g, e, c: isinstance(g, (float, torch.Tensor)) and torch.as_tensor(g).numel() == 1
                      and abs(float(g) - float(e.mean())) <= 1e-4 * (1 + abs(float(e.mean())))),
        ],
        atol=1e-4,
        rtol=1e-4,
        n_generated=4,
        generate=_hooked_case,
        withheld=[zero_head_hook],
    )


def _ours_copying(tl_model) -> torch.Tensor:
    model = from_transformer_lens(tl_model)
    scores = [eigen_copying_score(full_ov_circuit(model, l).eigenvalues()) for l in range(model.cfg.n_layers)]
    return torch.stack(scores).float()


@guarded
def check_ov_copying_scores(fn) -> bool:
    """Exercise 9.3: ``fn(tl_model) -> [layer, head]`` from TransformerLens's FactoredMatrix."""
    cases = [
        Case("attn-only-2l in TransformerLens", (to_transformer_lens(shipped("attn-only-2l").model),), kind="shipped"),
        Case("random 2-layer model", (to_transformer_lens(random_model(n_layers=2, seed=5)),), kind="random"),
    ]

    def no_abs(expected, case):
        tl_model = case.args[0]
        eig = (tl_model.W_E @ tl_model.OV @ tl_model.W_U).eigenvalues
        return (eig.sum(-1) / eig.sum(-1).abs()).real

    return run_check(
        fn,
        cases,
        reference=_ours_copying,
        diagnoses=[
            Diagnosis("divide by the sum of |λ|, not by |Σλ|", no_abs),
        ],
        canonical=lambda x: x.float() if isinstance(x, torch.Tensor) else x,
        atol=1e-4,
        rtol=1e-3,
        n_generated=4,
        generate=lambda draw: (_small_tl_case(draw, draw.edge(4)),),
        withheld=[ov_copying_scores, copying_summary],
    )
