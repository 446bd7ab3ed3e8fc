"""The course's transformer: one class for every member of the family (:mod:`attncircuits.models.config`).

With the default config it is the framework's exact object, the model of chapters 1-9: no MLPs,
no biases and no LayerNorm in the residual stream, so the logits are an exact sum of paths through
the heads (the paper's path expansion). Positions enter only the query and key inputs
("shortformer" style, fixed sinusoids as in the paper's models): the residual stream carries
tokens alone and every OV circuit is a pure token-to-token map. The config adds MLPs, LayerNorm
and the other position schemes; what a member has, the model shows by what exists (``W_pos`` is
None where no position table is added anywhere).

Names and shapes follow TransformerLens, in the row-vector convention ``x @ W``:
``W_E [d_vocab, d_model]``, ``W_pos [n_ctx, d_model]``, per layer ``W_Q, W_K, W_V
[n_heads, d_model, d_head]`` and ``W_O [n_heads, d_head, d_model]``, ``W_U [d_model, d_vocab]``;
with MLPs ``W_in [d_model, d_mlp]``, ``W_out [d_mlp, d_model]``. Attention patterns are
``[batch, head, query_pos, key_pos]``. Every model the course trains or loads offers the same
interface (:mod:`attncircuits.models.interface`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, fields
from typing import Callable, Mapping

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.nn import functional as F

from attncircuits.core import validate
from attncircuits.core.heads import Head
from attncircuits.models.config import ACT_FNS, FAMILY_DEFAULTS, POSITIONS, divisors
from attncircuits.models.parts import (
    MLP,
    ActivationCache,
    LayerNorm,
    rotary_tables,
    rotate,
    sinusoidal_positions,
    unembed,
)


@dataclass
class ModelConfig:
    n_layers: int = 2  # 0, 1 or 2 in chapters 1-9: the paper's three model sizes
    d_model: int = 128  # width of the residual stream; small so a CPU trains it in minutes
    n_heads: int = 4  # few enough that each head has room: 8 x 16 formed no induction heads in 16M tokens
    d_head: int | None = None  # None: d_model / n_heads; a wide QK lets positions and tokens share a head
    d_vocab: int = 2048  # the shipped BPE vocabulary (see data.py for why 2048)
    n_ctx: int = 128  # long enough for repeats at many distances, short enough for a CPU
    init_std_embed: float = 1.0  # unit-scale residual stream: without LayerNorm, GPT-2's 0.02 stalls
    positions: str = "sinusoidal-qk"  # see POSITIONS
    d_mlp: int = 0  # 0: attention only
    layernorm: bool = False
    act_fn: str = "gelu"
    biases: bool = False  # attention, LayerNorm and unembedding biases (chapter 10's model)

    def __post_init__(self):
        for name in ("d_model", "n_heads", "d_vocab", "n_ctx"):
            setattr(self, name, validate.count(getattr(self, name), f"ModelConfig.{name}"))
        self.n_layers = validate.count(self.n_layers, "ModelConfig.n_layers", minimum=0)
        self.d_mlp = validate.count(self.d_mlp, "ModelConfig.d_mlp", minimum=0)
        self.init_std_embed = validate.number(self.init_std_embed, "ModelConfig.init_std_embed", minimum=0, above=True)
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"ModelConfig.n_heads={self.n_heads} does not divide d_model={self.d_model}: use one of "
                    f"{divisors(self.d_model)}, or give d_head")
            self.d_head = self.d_model // self.n_heads
        self.d_head = validate.count(self.d_head, "ModelConfig.d_head")
        if self.positions not in POSITIONS:
            raise ValueError(f"ModelConfig.positions={self.positions!r} is not a position scheme of the family; "
                             f"use one of {', '.join(map(repr, POSITIONS))}")
        if self.positions == "rotary" and self.d_head % 2:
            raise ValueError(f"ModelConfig.positions='rotary' turns pairs of dimensions, so d_head must be even, "
                             f"got d_head={self.d_head}")
        for name in ("layernorm", "biases"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.act_fn not in ACT_FNS:
            raise ValueError(f"ModelConfig.act_fn={self.act_fn!r} is not an activation the family has; "
                             f"use one of {', '.join(map(repr, ACT_FNS))}")
        if self.act_fn != "gelu" and not self.d_mlp:
            raise ValueError(f"ModelConfig.act_fn={self.act_fn!r} needs an MLP: set d_mlp > 0, or leave act_fn")

    @property
    def attn_only(self) -> bool:
        return self.d_mlp == 0

    def describe(self) -> str:
        """One line: ``2 layers, attention only, rotary positions`` (what :data:`POSITIONS` says)."""
        parts = [f"{self.n_layers} layer{'s' * (self.n_layers != 1)}",
                 "attention only" if self.attn_only else f"MLPs of {self.d_mlp}",
                 "LayerNorm" if self.layernorm else "no LayerNorm", f"{self.positions} positions"]
        if self.biases:
            parts.append("biases")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: v for k, v in d.items() if k not in FAMILY_DEFAULTS or v != FAMILY_DEFAULTS[k]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    def build(self) -> "Transformer":
        """A freshly initialised model of this config (seeded by ``torch.manual_seed``)."""
        return Transformer(self)


class Attention(nn.Module):
    """One layer's heads: ``W_Q, W_K, W_V [n_heads, d_model, d_head]``, ``W_O [n_heads, d_head, d_model]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, D, d = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_K = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_V = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_O = nn.Parameter(torch.randn(H, d, D) / math.sqrt(H * d))
        if cfg.biases:  # TransformerLens's: per head for Q, K, V; one for the layer's output
            self.b_Q, self.b_K, self.b_V = (nn.Parameter(torch.zeros(H, d)) for _ in range(3))
            self.b_O = nn.Parameter(torch.zeros(D))
        else:
            self.b_Q = self.b_K = self.b_V = self.b_O = None
        # causal mask as a bias: -inf where a key comes after its query
        future = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).triu(1)
        bias = torch.zeros(cfg.n_ctx, cfg.n_ctx).masked_fill(future, float("-inf"))
        self.register_buffer("causal_bias", bias, persistent=False)

    def forward(self, resid, pos, cache, pattern_replace, out_replace,
                rotary=None):
        b, n, d_model = resid.shape
        H, d_head = self.W_Q.shape[0], self.W_Q.shape[2]
        # Positions enter queries and keys only; values read the stream.
        # all heads in one matmul: each W as [d_model, H * d_head]
        qk_in = resid if pos is None else resid + pos[:n]
        q = (qk_in @ self.W_Q.transpose(0, 1).flatten(1)).view(b, n, H, d_head)
        k = (qk_in @ self.W_K.transpose(0, 1).flatten(1)).view(b, n, H, d_head)
        v = (resid @ self.W_V.transpose(0, 1).flatten(1)).view(b, n, H, d_head)
        if self.b_Q is not None:
            q, k, v = q + self.b_Q, k + self.b_K, v + self.b_V
        q, k, v_h = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rotary is not None:  # queries and keys turned by their position
            q, k = rotate(q, *rotary), rotate(k, *rotary)
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
            out = head_out.sum(dim=2)
        else:  # the sum over heads inside one matmul
            out = z.flatten(2) @ self.W_O.flatten(0, 1)
        return out if self.b_O is None else out + self.b_O


class Transformer(nn.Module):
    """``logits = (W_E[tokens] + Σ_layers Σ_heads head_out) @ W_U``
    in an attention-only model; a model with MLPs adds their outputs to
    the stream, and one with LayerNorm normalises what each part reads."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.randn(cfg.d_vocab, cfg.d_model) * cfg.init_std_embed)
        if cfg.positions == "sinusoidal-qk":
            self.register_buffer("W_pos", sinusoidal_positions(cfg.n_ctx, cfg.d_model))
        elif cfg.positions == "learned":
            self.W_pos = nn.Parameter(torch.randn(cfg.n_ctx, cfg.d_model) * cfg.init_std_embed)
        else:
            self.W_pos = None
        if cfg.positions == "rotary":
            sin, cos = rotary_tables(cfg.n_ctx, cfg.d_head)
            self.register_buffer("rotary_sin", sin, persistent=False)
            self.register_buffer("rotary_cos", cos, persistent=False)
        self.blocks = nn.ModuleList(Attention(cfg) for _ in range(cfg.n_layers))
        if cfg.d_mlp:
            self.mlps = nn.ModuleList(MLP(cfg.d_model, cfg.d_mlp, cfg.act_fn) for _ in range(cfg.n_layers))
        if cfg.layernorm:
            ln = lambda: LayerNorm(cfg.d_model, bias=cfg.biases)  # noqa: E731
            self.ln_attn = nn.ModuleList(ln() for _ in range(cfg.n_layers))
            self.ln_mlp = nn.ModuleList(ln() for _ in range(cfg.n_layers if cfg.d_mlp else 0))
            self.ln_final = ln()
        self.W_U = nn.Parameter(torch.randn(cfg.d_model, cfg.d_vocab) / math.sqrt(cfg.d_model))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab)) if cfg.biases else None

    # Shortcuts with the paper's names: model.W_Q[layer] is [n_heads, d_model, d_head].
    def _stack(self, name: str, parts=None) -> Tensor:
        validate.depth(self, name)
        return torch.stack([getattr(b, name) for b in (self.blocks if parts is None else parts)])

    W_Q = property(lambda self: self._stack("W_Q"))
    W_K = property(lambda self: self._stack("W_K"))
    W_V = property(lambda self: self._stack("W_V"))
    W_O = property(lambda self: self._stack("W_O"))
    W_in = property(lambda self: self._stack("W_in", self._mlps("W_in")))
    W_out = property(lambda self: self._stack("W_out", self._mlps("W_out")))

    def _mlps(self, name: str) -> nn.ModuleList:
        if not self.cfg.d_mlp:
            raise ValueError(f"this model is attention only (d_mlp=0), so it has no {name}; build one with d_mlp > 0")
        return self.mlps

    def course_config(self) -> ModelConfig:
        """The config a checkpoint of this model stores (:mod:`attncircuits.models.interface`)."""
        return self.cfg

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
        at: Int[Tensor, "k"] | Int[Tensor, "batch k"] | None = None,
    ):
        """:meth:`forward` for tokens already checked: a ``[batch, pos]`` int64 tensor on the model's
        device, ids in ``[0, d_vocab)``, at most ``n_ctx`` per row. It reads no value of ``tokens``
        back to the host, so the training loop and the package's functions that checked their input
        once (at their public boundary) run it without a host-device sync per call. ``ablate`` and
        ``patterns`` keys are still checked (plain ints, nothing to sync); their values are checked
        by :meth:`forward` (:func:`attncircuits.core.validate.ablations`, :func:`~attncircuits.core.validate.patterns`).
        ``at`` (positions, the same ``[k]`` for every row or ``[batch, k]``) unembeds only those
        positions, logits ``[batch, k, d_vocab]``: the unembedding is most of a forward pass's cost
        in these models, and a loss read at a few positions needs no more."""
        per_layer_out: list[dict] = [{} for _ in self.blocks]
        per_layer_pat: list[dict] = [{} for _ in self.blocks]
        for key, v in (ablate or {}).items():
            l, h = validate.head_pair(self, key)
            per_layer_out[l][h] = torch.as_tensor(v) if isinstance(v, (int, float)) else v
        for key, p in (patterns or {}).items():
            l, h = validate.head_pair(self, key)
            per_layer_pat[l][h] = p
        cache = ActivationCache() if return_cache else None
        cfg = self.cfg
        qk_pos = self.W_pos if cfg.positions == "sinusoidal-qk" else None
        rotary = (self.rotary_sin, self.rotary_cos) if cfg.positions == "rotary" else None
        resid = self.W_E[tokens]
        if cfg.positions == "learned":
            resid = resid + self.W_pos[: tokens.shape[1]]
        for layer, block in enumerate(self.blocks):
            if cache is not None:
                cache.resid.append(resid)
            x = self.ln_attn[layer](resid) if cfg.layernorm else resid
            resid = resid + block(x, qk_pos, cache, per_layer_pat[layer], per_layer_out[layer], rotary)
            if cfg.d_mlp:
                out = self.mlps[layer](self.ln_mlp[layer](resid) if cfg.layernorm else resid)
                if cache is not None:
                    cache.mlp_out.append(out)
                resid = resid + out
        if cache is not None:
            cache.resid.append(resid)
        if at is not None:
            rows = torch.arange(resid.shape[0], device=resid.device)[:, None]
            resid = resid[:, at] if at.ndim == 1 else resid[rows, at]
        logits = self.to_logits(resid)
        return (logits, cache) if return_cache else logits

    def to_logits(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        """The logits of a final residual stream (through the final LayerNorm, where there is one)."""
        logits = unembed(self.ln_final(resid) if self.cfg.layernorm else resid, self.W_U)
        return logits if self.b_U is None else logits + self.b_U

    @torch.no_grad()
    def run_with_cache(self, tokens, **kwargs) -> tuple[Tensor, ActivationCache]:
        return self.forward(tokens, return_cache=True, **kwargs)

    @torch.no_grad()
    def folded(self) -> "Transformer":
        """Every LayerNorm's gain folded into the weights that read its output, and the weights that
        write to the stream centred (their mean over ``d_model`` is what every LayerNorm removes
        first), as TransformerLens's ``fold_ln`` and ``center_writing_weights`` do: weight products
        then mean what chapter 5's composition scores assume. The logits are unchanged, except where
        positions are added to the queries and keys after the LayerNorm (``sinusoidal-qk`` with
        ``layernorm``): the gain folded into ``W_Q`` and ``W_K`` then scales the positions' part too,
        so only the weight products and the values (composition, copying) are exact there, as in
        TransformerLens. A model without LayerNorm is returned as it is."""
        if not self.cfg.layernorm:
            return self
        out = copy.deepcopy(self)
        for layer, block in enumerate(out.blocks):
            _fold(out.ln_attn[layer], *((getattr(block, f"W_{n}"), getattr(block, f"b_{n}")) for n in "QKV"))
            block.W_O.sub_(block.W_O.mean(-1, keepdim=True))
            if block.b_O is not None:  # the value biases reach the stream through W_O: one bias
                block.b_O.add_(einsum(block.b_V, block.W_O, "h dh, h dh dm -> dm"))
                block.b_O.sub_(block.b_O.mean())
                block.b_V.zero_()
            if self.cfg.d_mlp:
                mlp = out.mlps[layer]
                _fold(out.ln_mlp[layer], (mlp.W_in, mlp.b_in))
                mlp.W_out.sub_(mlp.W_out.mean(-1, keepdim=True))
                mlp.b_out.sub_(mlp.b_out.mean())
        _fold(out.ln_final, (out.W_U, out.b_U))
        out.W_E.sub_(out.W_E.mean(-1, keepdim=True))
        if self.cfg.positions == "learned":
            out.W_pos.sub_(out.W_pos.mean(-1, keepdim=True))
        return out.eval()

    b_Q = property(lambda self: self._bias("b_Q"))
    b_K = property(lambda self: self._bias("b_K"))
    b_V = property(lambda self: self._bias("b_V"))
    b_O = property(lambda self: self._bias("b_O"))

    def _bias(self, name: str) -> Tensor:
        if not self.cfg.biases:
            raise ValueError(f"this model has no biases (biases=False), so it has no {name}; build one with biases=True")
        return self._stack(name)

    def weights(self) -> dict[str, Tensor]:
        """What a checkpoint stores: the state dict (the fixed sinusoids included, so a file is
        read back without recomputing them)."""
        return self.state_dict()

    def load_weights(self, state: Mapping[str, Tensor]) -> None:
        """Load what :meth:`weights` gave, every tensor by name (strict)."""
        self.load_state_dict(dict(state))

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _fold(ln: LayerNorm, *readers: tuple[Tensor, Tensor | None]) -> None:
    """Fold LayerNorm ``ln`` into every weight ``W [..., d_model, d_out]`` that reads it, in place:
    its bias into the reader's bias ``b`` (``b + b_ln W``, with the weight before scaling), then its
    gain into ``W``'s rows; the LayerNorm is left with gain 1 and bias 0."""
    for W, b in readers:
        if ln.b is not None:
            b.add_(einsum(ln.b, W, "dm, ... dm do -> ... do"))
        W.mul_(ln.w[:, None])
    if ln.b is not None:
        ln.b.zero_()
    ln.w.fill_(1.0)
