"""The parts the family's models are made of: the activation cache, the position schemes (fixed
sinusoids, rotary), LayerNorm, the MLP, the unembedding and the loss.

Every member of the family (:mod:`attncircuits.models.config`) is built from these by
:class:`attncircuits.models.transformer.Transformer`; each part follows TransformerLens's
arithmetic, so a member exports to TransformerLens and computes the same logits
(:func:`attncircuits.models.interop.to_transformer_lens`).
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.nn import functional as F

def sinusoidal_positions(n_ctx: int, d_model: int) -> Float[Tensor, "n_ctx d_model"]:
    """Fixed sin/cos positions (Vaswani et al.), used only inside queries and keys."""
    pos = torch.arange(n_ctx, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    out = torch.zeros(n_ctx, d_model)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
    return out


# Outputs at least this large go to huge pages (see `unembed`); 4 MiB is two 2 MiB pages.
HUGE_PAGE_MIN_BYTES = 4 << 20


def unembed(resid: Tensor, W_U: Tensor) -> Tensor:
    """``resid @ W_U``, written into memory the kernel maps in 2 MiB pages where it can.

    The logits are the largest tensor of a forward pass (32 x 128 x 2048 floats are 32 MiB), and
    memory that large comes fresh from the kernel at every call: mapped 4 KiB at a time, it took
    8,193 page faults, and the unembedding 36 ms where its arithmetic takes 25, on the CPU we
    measured. Asked for transparent huge pages (Linux, ``madvise``), it takes 16 faults; the
    values are the same matmul's, bit for bit. Elsewhere, with autograd recording, or on a GPU this
    is the plain matmul. ``benchmarks/bench_transformer_lens.py`` measures the forward pass.
    """
    shape = (*resid.shape[:-1], W_U.shape[-1])
    nbytes = math.prod(shape) * resid.element_size()
    plain = (
        nbytes < HUGE_PAGE_MIN_BYTES
        or resid.device.type != "cpu"
        or resid.dtype != W_U.dtype
        or (torch.is_grad_enabled() and (resid.requires_grad or W_U.requires_grad))
        or not hasattr(mmap, "MADV_HUGEPAGE")
    )
    if plain:
        return resid @ W_U
    try:
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # no huge pages in this kernel, or no memory: torch says which
        return resid @ W_U
    out = torch.frombuffer(buf, dtype=resid.dtype).view(shape)  # freed with the tensor
    return torch.matmul(resid, W_U, out=out)


@dataclass
class ActivationCache:
    """What a forward pass saw. ``resid[l]`` is the residual stream before layer ``l``
    (``resid[0]`` is the embedding, ``resid[-1]`` feeds the unembedding). ``z[l]`` is each head's
    pattern-weighted values before its ``W_O``; ``head_out[l]``, what each head writes, is
    computed from ``z`` on first use (the forward pass itself needs only the heads' sum)."""

    resid: list[Float[Tensor, "batch pos d_model"]] = field(default_factory=list)
    attn_scores: list[Float[Tensor, "batch head q k"]] = field(default_factory=list)
    pattern: list[Float[Tensor, "batch head q k"]] = field(default_factory=list)
    v: list[Float[Tensor, "batch pos head d_head"]] = field(default_factory=list)
    z: list[Float[Tensor, "batch pos head d_head"]] = field(default_factory=list)
    mlp_out: list[Float[Tensor, "batch pos d_model"]] = field(default_factory=list)  # members with MLPs
    W_O: list[Float[Tensor, "head d_head d_model"]] = field(default_factory=list, repr=False)
    _head_out: list[Tensor | None] = field(default_factory=list, repr=False)

    def add_layer(self, scores, pattern, v, z, W_O, head_out=None) -> None:
        """Keep one layer's activations; ``head_out`` None is computed from ``z`` when asked,
        with a copy of ``W_O`` as it was in this pass (a later change of the weights stays out)."""
        self.attn_scores.append(scores)
        self.pattern.append(pattern)
        self.v.append(v)
        self.z.append(z)
        self.W_O.append(W_O.clone())
        self._head_out.append(head_out)

    @property
    def head_out(self) -> list[Float[Tensor, "batch pos head d_model"]]:
        """Each layer's per-head outputs ``[batch, pos, head, d_model]`` (ablated ones as replaced)."""
        for layer, out in enumerate(self._head_out):
            if out is None:
                z, W_O = self.z[layer], self.W_O[layer]
                self._head_out[layer] = einsum(z, W_O, "b q h dh, h dh dm -> b q h dm")
        return self._head_out




def loss_fn(logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False):
    """Next-token cross-entropy in nats; ``per_token`` gives ``[batch, pos-1]``."""
    if tokens.shape[-1] < 2:
        raise ValueError(f"tokens has {tokens.shape[-1]} token per row, but a next-token loss needs at least 2; pass longer rows")
    logprobs = logits[:, :-1].log_softmax(-1)
    nll = -logprobs.gather(-1, tokens[:, 1:, None].to(logits.device))[..., 0]
    return nll if per_token else nll.mean()


def rotary_tables(n_ctx: int, d_head: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """The sines and cosines of rotary positions (Su et al. 2021), ``[n_ctx, d_head]`` each: the pair
    of dimensions ``(i, i + d_head/2)`` of a query or key at position ``p`` is turned by the angle
    ``p / base^(2i/d_head)``, so a query-key product depends on the two positions only through their
    distance. Halves are paired (GPT-NeoX's layout, TransformerLens's ``rotary_adjacent_pairs=False``)."""
    if d_head % 2:
        raise ValueError(f"rotary positions turn pairs of dimensions, so d_head must be even, got d_head={d_head}")
    pos = torch.arange(n_ctx, dtype=torch.float32)
    freq = base ** (torch.arange(d_head // 2, dtype=torch.float32) / (d_head / 2))
    angles = pos[:, None] / freq.repeat(2)[None, :]
    return torch.sin(angles), torch.cos(angles)


def rotate(x: Float[Tensor, "batch head pos d_head"], sin: Tensor, cos: Tensor) -> Tensor:
    """Queries or keys ``[batch, head, pos, d_head]`` turned by their positions (:func:`rotary_tables`)."""
    n, half = x.shape[-2], x.shape[-1] // 2
    flipped = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:n] + flipped * sin[:n]


class LayerNorm(nn.Module):
    """Centre, scale to unit root-mean-square, multiply by a learned gain ``w`` (and, in members
    with ``biases``, add a learned bias ``b``): the residual stream's LayerNorm in the family's
    members that have one. Without a bias, folding the gain into the weights that read the output
    is exact and needs no new biases (:meth:`~attncircuits.models.transformer.Transformer.folded`)."""

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = False):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model)) if bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x = x - x.mean(-1, keepdim=True)
        scale = (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        out = x / scale * self.w
        return out if self.b is None else out + self.b


ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


class MLP(nn.Module):
    """``act(x W_in + b_in) W_out + b_out``, TransformerLens's names and shapes."""

    def __init__(self, d_model: int, d_mlp: int, act_fn: str = "gelu"):
        super().__init__()
        self.W_in = nn.Parameter(torch.randn(d_model, d_mlp) / math.sqrt(d_model))
        self.b_in = nn.Parameter(torch.zeros(d_mlp))
        self.W_out = nn.Parameter(torch.randn(d_mlp, d_model) / math.sqrt(d_mlp))
        self.b_out = nn.Parameter(torch.zeros(d_model))
        self.act = ACTIVATIONS[act_fn]

    def forward(self, x: Tensor) -> Tensor:
        return self.act(x @ self.W_in + self.b_in) @ self.W_out + self.b_out
