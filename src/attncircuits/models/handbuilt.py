"""Circuits built by hand: weights written into an :class:`Transformer`, no training (ch. 8).

The paper's exercises ask for weights that implement a circuit. Here they are written out, on a
residual stream cut into named blocks (:class:`Layout`):

- ``pos``: the highest-frequency sinusoid pairs. The embedding and every head leave these
  dimensions at zero, so in a query or key input they hold the position alone;
- ``token``: the current token, one-hot times ``embed_scale`` (written by ``W_E``);
- ``prev``: the token one position back (written by a layer-0 previous-token head);
- ``out``: what the unembedding reads (``W_U`` is the identity from this block to the logits).

Positions enter only queries and keys (the model adds ``W_pos`` to the QK input, never to the
residual stream), so a head can *find* a position from the sinusoids, but no head can *write* a
position. Shifting a sinusoid by one position is a rotation of each ``(sin, cos)`` pair, which is
how a query at position ``i`` comes to point at the key at ``i - 1`` (:func:`previous_token_qk`).

Three constructions: :func:`previous_token_model` (one head, positions only),
:func:`two_back_model` (the paper's virtual head: two previous-token heads composed through their
values, a head that looks two tokens back) and :func:`induction_model` (the paper's induction
head: a layer-1 head whose keys read what a layer-0 previous-token head wrote, K-composition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from attncircuits.models.transformer import ModelConfig
from attncircuits.models.transformer import Transformer

__all__ = [
    "Layout",
    "copy_ov",
    "empty_model",
    "induction_model",
    "induction_qk",
    "positional_frequencies",
    "previous_token_model",
    "previous_token_qk",
    "set_head",
    "set_previous_token_head",
    "two_back_model",
]

BLOCKS = ("token", "prev", "out")


@dataclass(frozen=True)
class Layout:
    """Where each kind of information lives in the residual stream (see the module docstring).

    ``d_model = 2 * n_pos_pairs + 3 * d_vocab``: the positional pairs first (the sinusoids'
    highest frequencies sit in the first dimensions), then the ``token``, ``prev`` and ``out``
    blocks of ``d_vocab`` dimensions each.
    """

    d_vocab: int = 128
    n_pos_pairs: int = 16
    n_ctx: int = 128
    embed_scale: float = 10.0

    def __post_init__(self):
        if self.d_vocab < 2 or self.n_pos_pairs < 1 or self.n_ctx < 2:
            raise ValueError(f"a layout needs d_vocab >= 2, n_pos_pairs >= 1 and n_ctx >= 2, got {self}")

    @property
    def pos(self) -> slice:
        return slice(0, 2 * self.n_pos_pairs)

    def block(self, name: str) -> slice:
        """The dimensions of the ``token``, ``prev`` or ``out`` block."""
        if name not in BLOCKS:
            raise ValueError(f"unknown block {name!r}; the blocks are {BLOCKS} (and the positional dims, .pos)")
        start = 2 * self.n_pos_pairs + BLOCKS.index(name) * self.d_vocab
        return slice(start, start + self.d_vocab)

    @property
    def d_model(self) -> int:
        return 2 * self.n_pos_pairs + len(BLOCKS) * self.d_vocab

    @property
    def d_head(self) -> int:
        return max(self.d_vocab, 2 * self.n_pos_pairs)

    def config(self, n_layers: int) -> ModelConfig:
        return ModelConfig(
            n_layers=n_layers,
            d_model=self.d_model,
            n_heads=1,
            d_head=self.d_head,
            d_vocab=self.d_vocab,
            n_ctx=self.n_ctx,
        )


@torch.no_grad()
def empty_model(layout: Layout, n_layers: int) -> Transformer:
    """A model with every weight zero but the embedding (``token`` block, one-hot times
    ``embed_scale``) and the unembedding (the identity from the ``out`` block to the logits)."""
    model = Transformer(layout.config(n_layers))
    for p in model.parameters():
        p.zero_()
    eye = torch.eye(layout.d_vocab)
    model.W_E[:, layout.block("token")] = layout.embed_scale * eye
    model.W_U[layout.block("out"), :] = eye
    return model


def positional_frequencies(W_pos: Float[Tensor, "n_ctx d_model"], n_pairs: int) -> Float[Tensor, " n_pairs"]:
    """The angle each of the first ``n_pairs`` ``(sin, cos)`` pairs turns by per position, read
    off the sinusoids themselves: position 0 is ``(0, 1)`` and position 1 is ``(sin w, cos w)``."""
    if 2 * n_pairs > W_pos.shape[1]:
        raise ValueError(f"n_pairs={n_pairs} needs {2 * n_pairs} dimensions, W_pos has {W_pos.shape[1]}")
    return torch.atan2(W_pos[1, 0 : 2 * n_pairs : 2], W_pos[1, 1 : 2 * n_pairs : 2])


def previous_token_qk(
    W_pos: Float[Tensor, "n_ctx d_model"], n_pairs: int, d_head: int, sharpness: float = 12.0
) -> tuple[Float[Tensor, "d_model d_head"], Float[Tensor, "d_model d_head"]]:
    """``W_Q, W_K`` of a head that attends from position ``i`` to ``i - 1``, from positions alone.

    The key copies the first ``n_pairs`` sinusoid pairs; the query rotates each pair back by its
    frequency ``w``, so query ``i`` holds the sinusoids of position ``i - 1``. Then
    ``q_i . k_j = scale * Σ_f cos((i - 1 - j) w_f)``, largest at ``j = i - 1``. ``scale`` is set so
    the best key beats every other key (any offset in the context, both sides) by ``sharpness``
    in the attention logits (after the model's ``1/sqrt(d_head)``).
    """
    n_ctx, d_model = W_pos.shape
    if 2 * n_pairs > d_head:
        raise ValueError(f"the query needs 2 * n_pairs = {2 * n_pairs} head dimensions, d_head is {d_head}")
    w = positional_frequencies(W_pos, n_pairs).double()
    offsets = torch.arange(1, n_ctx, dtype=torch.float64)
    rivals = torch.cos(offsets[:, None] * w[None]).sum(-1).max()  # best score of any wrong offset
    margin = float(n_pairs - rivals)
    if margin <= 0:
        raise ValueError(f"with {n_pairs} pairs some offset scores as high as the previous token; use more pairs")
    scale = sharpness * math.sqrt(d_head) / margin
    W_Q, W_K = torch.zeros(d_model, d_head), torch.zeros(d_model, d_head)
    c, s = torch.cos(w).float(), torch.sin(w).float()
    f = torch.arange(n_pairs)
    sin_dim, cos_dim = 2 * f, 2 * f + 1
    # row vectors: q[sin] = x[sin] cos w - x[cos] sin w = sin((p-1) w); q[cos] = x[sin] sin w + x[cos] cos w
    W_Q[sin_dim, sin_dim], W_Q[cos_dim, sin_dim] = scale * c, -scale * s
    W_Q[sin_dim, cos_dim], W_Q[cos_dim, cos_dim] = scale * s, scale * c
    W_K[sin_dim, sin_dim], W_K[cos_dim, cos_dim] = 1.0, 1.0
    return W_Q, W_K


def copy_ov(
    d_model: int, d_head: int, src: slice, dst: slice, scale: float = 1.0
) -> tuple[Float[Tensor, "d_model d_head"], Float[Tensor, "d_head d_model"]]:
    """``W_V, W_O`` of a head that copies block ``src`` of the attended position into block
    ``dst`` (times ``scale``): ``W_V`` reads ``src`` into the first head dims, ``W_O`` writes them
    to ``dst``, so ``W_OV = W_V W_O`` is ``scale`` times the identity from ``src`` to ``dst``."""
    n = src.stop - src.start
    if dst.stop - dst.start != n:
        raise ValueError(f"source block has {n} dims but destination has {dst.stop - dst.start}; they must match")
    if n > d_head:
        raise ValueError(f"copying {n} dims needs d_head >= {n}, got {d_head}")
    W_V, W_O = torch.zeros(d_model, d_head), torch.zeros(d_head, d_model)
    W_V[src, :n] = scale * torch.eye(n)
    W_O[:n, dst] = torch.eye(n)
    return W_V, W_O


@torch.no_grad()
def set_head(model: Transformer, layer: int, head: int = 0, **weights: Tensor) -> None:
    """Write ``weights`` (``W_Q=..., W_K=..., W_V=..., W_O=...``, each one head's matrix) into a head."""
    model.check_head(layer, head)
    block = model.blocks[layer]
    for name, value in weights.items():
        if name not in ("W_Q", "W_K", "W_V", "W_O"):
            raise ValueError(f"unknown weight {name!r}; a head has W_Q, W_K, W_V and W_O")
        want = tuple(getattr(block, name).shape[1:])
        value = torch.as_tensor(value)
        if tuple(value.shape) != want:
            raise ValueError(f"{name} of one head must have shape {list(want)}, got {list(value.shape)}")
        getattr(block, name)[head] = value


def set_previous_token_head(model: Transformer, layer: int, layout: Layout, src: str, dst: str, sharpness: float) -> None:
    """Make head 0 of ``layer`` a previous-token head (from the sinusoids) that copies block ``src``
    of the previous position into block ``dst``: the one piece the three models below share."""
    cfg = model.cfg
    W_Q, W_K = previous_token_qk(model.W_pos, layout.n_pos_pairs, cfg.d_head, sharpness)
    W_V, W_O = copy_ov(cfg.d_model, cfg.d_head, layout.block(src), layout.block(dst))
    set_head(model, layer, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)


@torch.no_grad()
def previous_token_model(layout: Layout = Layout(), sharpness: float = 12.0) -> Transformer:
    """One layer, one head attending to the previous token and copying it to the ``out`` block:
    the model predicts that the next token is the previous one (``[a][b] -> [a]``)."""
    model = empty_model(layout, 1)
    set_previous_token_head(model, 0, layout, "token", "out", sharpness)
    return model


@torch.no_grad()
def two_back_model(layout: Layout = Layout(), sharpness: float = 12.0) -> Transformer:
    """The paper's virtual head: a layer-0 previous-token head copies the ``token`` block into
    ``prev``; a layer-1 previous-token head copies ``prev`` into ``out``. Their virtual head
    (pattern ``A^1 A^0``, OV ``W_OV^0 W_OV^1``) moves the token two back into ``out``, and
    ``prev`` still holds the token one back for any other head to use."""
    model = empty_model(layout, 2)
    set_previous_token_head(model, 0, layout, "token", "prev", sharpness)
    set_previous_token_head(model, 1, layout, "prev", "out", sharpness)
    return model


def induction_qk(layout: Layout, sharpness: float = 30.0) -> tuple[Float[Tensor, "d_model d_head"], Float[Tensor, "d_model d_head"]]:
    """``W_Q, W_K`` of the layer-1 induction head: the query reads the current token (``token``
    block), the key reads the token before it (``prev`` block, written by the layer-0 head), and
    equal tokens score ``sharpness`` in the attention logits (``q . k / sqrt(d_head)``)."""
    d_model, d_head, n = layout.d_model, layout.d_head, layout.d_vocab
    W_Q, W_K = torch.zeros(d_model, d_head), torch.zeros(d_model, d_head)
    scale = sharpness * math.sqrt(d_head) / layout.embed_scale**2
    W_Q[layout.block("token"), :n] = scale * torch.eye(n)
    W_K[layout.block("prev"), :n] = torch.eye(n)
    return W_Q, W_K


@torch.no_grad()
def induction_model(layout: Layout = Layout(), sharpness: float = 12.0, match: float = 30.0) -> Transformer:
    """The paper's induction head by K-composition. Layer 0: a previous-token head (from the
    sinusoids) copies ``token`` into ``prev``, so the key at ``j`` knows ``t_{j-1}``. Layer 1: the
    query ``t_i`` matches keys whose ``prev`` is ``t_i`` (:func:`induction_qk`) and copies their
    ``token`` into ``out``: after ``[a][b] ... [a]`` the model predicts ``[b]``."""
    model = empty_model(layout, 2)
    cfg = model.cfg
    set_previous_token_head(model, 0, layout, "token", "prev", sharpness)
    W_Q, W_K = induction_qk(layout, match)
    W_V, W_O = copy_ov(cfg.d_model, cfg.d_head, layout.block("token"), layout.block("out"))
    set_head(model, 1, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)
    return model
