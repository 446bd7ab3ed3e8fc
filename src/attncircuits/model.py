"""The attention-only transformer of the course, in one file.

No MLPs, no biases and no LayerNorm in the residual stream, so the logits are an exact sum of
paths through the heads (the paper's path expansion). Positions enter only the query and key
inputs ("shortformer" style, fixed sinusoids as in the paper's models): the residual stream
carries tokens alone and every OV circuit is a pure token-to-token map.

Names and shapes follow TransformerLens, in the row-vector convention ``x @ W``:
``W_E [d_vocab, d_model]``, ``W_pos [n_ctx, d_model]``, per layer ``W_Q, W_K, W_V
[n_heads, d_model, d_head]`` and ``W_O [n_heads, d_head, d_model]``, ``W_U [d_model, d_vocab]``.
Attention patterns are ``[batch, head, query_pos, key_pos]``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.nn import functional as F

from . import validate
from .heads import Head


@dataclass
class AttnOnlyConfig:
    n_layers: int = 2  # 0, 1 or 2 in the course: the paper's three model sizes
    d_model: int = 128  # width of the residual stream; small so a CPU trains it in minutes
    n_heads: int = 4  # few enough that each head has room: 8 x 16 formed no induction heads in 16M tokens
    d_head: int = 32  # d_model / n_heads; a wide QK lets positions and tokens share a head
    d_vocab: int = 2048  # the shipped BPE vocabulary (see data.py for why 2048)
    n_ctx: int = 128  # long enough for repeats at many distances, short enough for a CPU
    init_std_embed: float = 1.0  # unit-scale residual stream: without LayerNorm, GPT-2's 0.02 stalls

    def __post_init__(self):
        for name in ("d_model", "n_heads", "d_head", "d_vocab", "n_ctx"):
            if getattr(self, name) < 1:
                raise ValueError(f"config field {name} must be positive, got {getattr(self, name)}")
        if self.n_layers < 0:
            raise ValueError(f"n_layers must be >= 0, got {self.n_layers}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "AttnOnlyConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)


def sinusoidal_positions(n_ctx: int, d_model: int) -> Float[Tensor, "n_ctx d_model"]:
    """Fixed sin/cos positions (Vaswani et al.), used only inside queries and keys."""
    pos = torch.arange(n_ctx, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    out = torch.zeros(n_ctx, d_model)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
    return out


@dataclass
class ActivationCache:
    """What a forward pass saw. ``resid[l]`` is the residual stream before layer ``l``
    (``resid[0]`` is the embedding, ``resid[-1]`` feeds the unembedding)."""

    resid: list[Float[Tensor, "batch pos d_model"]] = field(default_factory=list)
    attn_scores: list[Float[Tensor, "batch head q k"]] = field(default_factory=list)
    pattern: list[Float[Tensor, "batch head q k"]] = field(default_factory=list)
    v: list[Float[Tensor, "batch pos head d_head"]] = field(default_factory=list)
    head_out: list[Float[Tensor, "batch pos head d_model"]] = field(default_factory=list)


class Attention(nn.Module):
    def __init__(self, cfg: AttnOnlyConfig):
        super().__init__()
        H, D, d = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_K = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_V = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_O = nn.Parameter(torch.randn(H, d, D) / math.sqrt(H * d))
        self.register_buffer("mask", torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool)), persistent=False)

    def forward(self, resid, pos, cache, pattern_replace, out_replace):
        b, n, d_model = resid.shape
        H, d_head = self.W_Q.shape[0], self.W_Q.shape[2]
        # Positions enter queries and keys only; values read the stream.
        # all heads in one matmul: each W as [d_model, H * d_head]
        qk_in = resid + pos[:n]
        q = (qk_in @ self.W_Q.transpose(0, 1).flatten(1)).view(b, n, H, d_head)
        k = (qk_in @ self.W_K.transpose(0, 1).flatten(1)).view(b, n, H, d_head)
        v = (resid @ self.W_V.transpose(0, 1).flatten(1)).view(b, n, H, d_head)
        q, k, v_h = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is None and not pattern_replace:
            # no pattern wanted: a fused kernel that never forms it
            z = F.scaled_dot_product_attention(q, k, v_h, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)  # [b h q k]
            scores = scores.masked_fill(~self.mask[:n, :n], float("-inf"))
            pattern = scores.softmax(dim=-1)
            if pattern_replace:  # frozen patterns: pattern-preserving ablation
                pattern = pattern.clone()
                for h, new in pattern_replace.items():
                    new = torch.as_tensor(new).to(pattern)
                    pattern[:, h] = new[..., :n, :n]
            z = pattern @ v_h
        z = z.transpose(1, 2)  # [b q h dh]
        if cache is None and not out_replace:
            # the sum over heads inside one matmul
            return z.flatten(2) @ self.W_O.flatten(0, 1)
        head_out = einsum(z, self.W_O, "b q h dh, h dh dm -> b q h dm")
        # zero ablation passes 0.0, mean ablation a mean, or any function
        if out_replace:
            head_out = head_out.clone()
            for h, new in out_replace.items():
                old = head_out[:, :, h]
                head_out[:, :, h] = new(old) if callable(new) else new.to(old)
        if cache is not None:
            cache.attn_scores.append(scores)
            cache.pattern.append(pattern)
            cache.v.append(v)
            cache.head_out.append(head_out)
        return head_out.sum(dim=2)


class AttnOnlyTransformer(nn.Module):
    """``logits = (W_E[tokens] + Σ_layers Σ_heads head_out) @ W_U``."""

    def __init__(self, cfg: AttnOnlyConfig):
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.randn(cfg.d_vocab, cfg.d_model) * cfg.init_std_embed)
        self.register_buffer("W_pos", sinusoidal_positions(cfg.n_ctx, cfg.d_model))
        self.blocks = nn.ModuleList(Attention(cfg) for _ in range(cfg.n_layers))
        self.W_U = nn.Parameter(torch.randn(cfg.d_model, cfg.d_vocab) / math.sqrt(cfg.d_model))

    # Shortcuts with the paper's names: model.W_Q[layer] is [n_heads, d_model, d_head].
    def _stack(self, name: str) -> Tensor:
        validate.depth(self, name)
        return torch.stack([getattr(b, name) for b in self.blocks])

    W_Q = property(lambda self: self._stack("W_Q"))
    W_K = property(lambda self: self._stack("W_K"))
    W_V = property(lambda self: self._stack("W_V"))
    W_O = property(lambda self: self._stack("W_O"))

    def check_head(self, layer: int, head: int) -> None:
        """Raise a clear error for a (layer, head) that does not exist (see :mod:`attncircuits.validate`)."""
        validate.heads(self, [(layer, head)])

    def check_tokens(self, tokens) -> Int[Tensor, "batch pos"]:
        """Tokens (a list, numpy array or tensor of ids) as a [batch, pos] long tensor, with errors
        that name the fix (see :func:`attncircuits.validate.tokens`)."""
        return validate.tokens(self, tokens)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        return_cache: bool = False,
        ablate: Mapping[Head, Tensor | float | Callable] | None = None,
        patterns: Mapping[Head, Float[Tensor, "batch q k"]] | None = None,
    ):
        """Logits ``[batch, pos, d_vocab]`` (and an :class:`ActivationCache` if asked).

        ``ablate`` replaces a head's output ``[batch, pos, d_model]``: ``{(layer, head): 0.0}``
        zero-ablates it; a tensor replaces it; a callable maps the real output to a new one.
        ``patterns`` replaces a head's attention pattern ``[batch, q, k]`` (freeze or edit it).
        """
        tokens = validate.tokens(self, tokens)
        per_layer_out: list[dict] = [{} for _ in self.blocks]
        per_layer_pat: list[dict] = [{} for _ in self.blocks]
        for key, v in (ablate or {}).items():
            l, h = validate.head_pair(self, key)
            per_layer_out[l][h] = torch.as_tensor(v) if isinstance(v, (int, float)) else v
        for key, p in (patterns or {}).items():
            l, h = validate.head_pair(self, key)
            per_layer_pat[l][h] = p
        cache = ActivationCache() if return_cache else None
        resid = self.W_E[tokens]
        for layer, block in enumerate(self.blocks):
            if cache is not None:
                cache.resid.append(resid)
            resid = resid + block(resid, self.W_pos, cache, per_layer_pat[layer], per_layer_out[layer])
        if cache is not None:
            cache.resid.append(resid)
        logits = resid @ self.W_U
        return (logits, cache) if return_cache else logits

    @torch.no_grad()
    def run_with_cache(self, tokens, **kwargs) -> tuple[Tensor, ActivationCache]:
        return self.forward(tokens, return_cache=True, **kwargs)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def loss_fn(logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False):
    """Next-token cross-entropy in nats; ``per_token`` gives ``[batch, pos-1]``."""
    if tokens.shape[-1] < 2:
        raise ValueError(f"tokens has {tokens.shape[-1]} token per row, but a next-token loss needs at least 2; pass longer rows")
    logprobs = logits[:, :-1].log_softmax(-1)
    nll = -logprobs.gather(-1, tokens[:, 1:, None].to(logits.device))[..., 0]
    return nll if per_token else nll.mean()
