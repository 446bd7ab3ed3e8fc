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
import mmap
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.nn import functional as F

from attncircuits.core import validate
from attncircuits.core.heads import Head


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
            setattr(self, name, validate.count(getattr(self, name), name))
        self.n_layers = validate.count(self.n_layers, "n_layers", minimum=0)
        self.init_std_embed = validate.number(self.init_std_embed, "init_std_embed", minimum=0, above=True)

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


# Outputs at least this large go to huge pages (see `_unembed`); 4 MiB is two 2 MiB pages.
HUGE_PAGE_MIN_BYTES = 4 << 20


def _unembed(resid: Tensor, W_U: Tensor) -> Tensor:
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


class Attention(nn.Module):
    def __init__(self, cfg: AttnOnlyConfig):
        super().__init__()
        H, D, d = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_K = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_V = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_O = nn.Parameter(torch.randn(H, d, D) / math.sqrt(H * d))
        # causal mask as a bias: -inf where a key comes after its query
        future = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1)
        bias = torch.zeros(cfg.n_ctx, cfg.n_ctx).masked_fill(future, float("-inf"))
        self.register_buffer("causal_bias", bias, persistent=False)

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
            scores = (q / math.sqrt(d_head)) @ k.transpose(-1, -2)  # [b h q k]
            scores += self.causal_bias[:n, :n]  # -inf on keys after the query
            pattern = scores.softmax(dim=-1)
            if pattern_replace:  # frozen patterns: pattern-preserving ablation
                pattern = pattern.clone()
                for h, new in pattern_replace.items():
                    new = torch.as_tensor(new).to(pattern)
                    pattern[:, h] = new[..., :n, :n]
            z = pattern @ v_h
        z = z.transpose(1, 2)  # [b q h dh]
        head_out = None
        if out_replace:  # zero ablation passes 0.0, a mean, or any function
            head_out = einsum(z, self.W_O, "b q h dh, h dh dm -> b q h dm")
            for h, new in out_replace.items():
                old = head_out[:, :, h]
                head_out[:, :, h] = new(old) if callable(new) else new.to(old)
        if cache is not None:
            cache.add_layer(scores, pattern, v, z, self.W_O, head_out)
        if head_out is not None:
            return head_out.sum(dim=2)
        # the sum over heads inside one matmul
        return z.flatten(2) @ self.W_O.flatten(0, 1)


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
        """Raise a clear error for a (layer, head) that does not exist (see :mod:`attncircuits.core.validate`)."""
        validate.heads(self, [(layer, head)])

    def check_tokens(self, tokens) -> Int[Tensor, "batch pos"]:
        """Tokens (a list, numpy array or tensor of ids) as a [batch, pos] long tensor, with errors
        that name the fix (see :func:`attncircuits.core.validate.tokens`)."""
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
        The tokens are checked here (any container of ids; see :func:`attncircuits.core.validate.tokens`).
        """
        tokens = validate.tokens(self, tokens)
        return self.forward_checked(tokens, return_cache, validate.ablations(self, ablate, *tokens.shape),
                                    validate.patterns(self, patterns, *tokens.shape))

    def forward_checked(
        self,
        tokens: Int[Tensor, "batch pos"],
        return_cache: bool = False,
        ablate: Mapping[Head, Tensor | float | Callable] | None = None,
        patterns: Mapping[Head, Float[Tensor, "batch q k"]] | None = None,
    ):
        """:meth:`forward` for tokens already checked: a ``[batch, pos]`` int64 tensor on the model's
        device, ids in ``[0, d_vocab)``, at most ``n_ctx`` per row. It reads no value of ``tokens``
        back to the host, so the training loop and the package's functions that checked their input
        once (at their public boundary) run it without a host-device sync per call. ``ablate`` and
        ``patterns`` keys are still checked (plain ints, nothing to sync); their values are checked
        by :meth:`forward` (:func:`attncircuits.core.validate.ablations`, :func:`~attncircuits.core.validate.patterns`)."""
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
        logits = _unembed(resid, self.W_U)
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
