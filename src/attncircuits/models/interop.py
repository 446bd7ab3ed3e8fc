"""Our models in TransformerLens 4 and back (chapter 9): ``to_transformer_lens``, ``from_transformer_lens``.

TransformerLens 4 wraps every model in a ``TransformerBridge``, which puts its named hook points
(``hook_pattern``, ``hook_z``, ``hook_resid_pre``, ...) on a model it does not own. For small models
it has one of its own, the *native* model (``TransformerBridge.boot_native``): pre-LayerNorm blocks,
split Q/K/V/O projections with biases, GELU or ReLU MLPs, positions in the residual stream
("standard") or rotary. Every member of the family is such a model with some parts switched off:
no LayerNorm is ``normalization_type=None``, attention only is ``attn_only=True``, no biases are
zero biases, no positions are an all-zero table. The course's own positions (fixed sinusoids in the
queries and keys only, "shortformer") are not among the native ones; for them the native model is
subclassed (:mod:`attncircuits.models.tl_native`) and wrapped by the same adapter
(``build_bridge_from_module``), so the bridge and its hooks are TransformerLens's in both cases.

Why a bridge around TransformerLens's native model, and not the course's model given hooks with
``HookedRootModule``: a learner who continues in TransformerLens meets ``TransformerBridge``, its
hook names, cache and weight properties (``W_Q``, ``OV``, ...); a bridge built by TransformerLens
gives exactly those, computed by TransformerLens, so every comparison in chapter 9 is between two
implementations, not one checked against itself.

The weights are copied, never changed, through TransformerLens's own converter from the
``W_Q [n_heads, d_model, d_head]`` names (``convert_tl_checkpoint``). Rotary positions are the one
reordering: the course turns the pair of dimensions ``(i, i + d_head/2)`` (GPT-NeoX's layout),
the native model ``(2i, 2i + 1)``; the same permutation of the query and key dimensions of every
head makes one the other, and is undone on the way back. So ``from_transformer_lens(
to_transformer_lens(m))`` gives ``m`` back bit for bit. TransformerLens is an optional extra
(``pip install -e '.[tl]'``) and is imported only when one of these functions is called.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from attncircuits.models.tl_native import qk_positions_model_class
from attncircuits.models.transformer import ModelConfig
from attncircuits.models.transformer import Transformer

# the TransformerLens requirement and its check live in hooked.py (a lower layer that loading
# checkpoints needs); chapter 9 reads them here, in the TransformerLens room
from attncircuits.models.hooked import TL_REQUIREMENT, require_transformer_lens, transformer_lens_version

if TYPE_CHECKING:  # pragma: no cover
    from transformer_lens.model_bridge import TransformerBridge

__all__ = [
    "TL_REQUIREMENT",
    "UnsupportedModelError",
    "from_transformer_lens",
    "induction_stripe_scores",
    "ov_copying_scores",
    "to_transformer_lens",
    "transformer_lens_version",
    "wrap_tokenizer",
    "zero_head_hook",
]

#: how each position scheme of the family reads in TransformerLens's config
TL_POSITIONS = {"sinusoidal-qk": "shortformer", "learned": "standard", "rotary": "rotary", "none": "standard"}
NATIVE = "TransformerLensNative"


def wrap_tokenizer(tokenizer):
    """A Hugging Face fast tokenizer around our ``tokenizers.Tokenizer``, for TransformerLens's
    string methods (``to_tokens``, ``to_str_tokens``) and its head detector, with
    ``<|endoftext|>`` (token 0) as its BOS token: strings then start with it, as our training
    documents do."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    eot = tokenizer.id_to_token(0)
    # add_bos_token: TransformerLens takes it as it is (without, it reloads the tokenizer by name)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=eot, eos_token=eot, pad_token=eot,
                                   add_bos_token=True, name_or_path="attncircuits")


def _rotary_order(d_head: int) -> Tensor:
    """Dimension ``j`` of a native rotary head is the course's dimension ``order[j]``."""
    half = d_head // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()


def _bridge_config(c: ModelConfig, model_name: str, device, dtype):
    tl = require_transformer_lens()
    extra = {"rotary_dim": c.d_head, "rotary_base": 10000} if c.positions == "rotary" else {}
    return tl.TransformerBridgeConfig(
        n_layers=c.n_layers, d_model=c.d_model, d_head=c.d_head, n_heads=c.n_heads, n_ctx=c.n_ctx,
        d_vocab=c.d_vocab, attn_only=c.attn_only, d_mlp=c.d_mlp or None, act_fn=c.act_fn,
        normalization_type="LN" if c.layernorm else None, positional_embedding_type=TL_POSITIONS[c.positions],
        init_weights=False, model_name=model_name, device=device, dtype=dtype, **extra,
    )  # fmt: skip


def _tl_state(model: Transformer) -> dict[str, Tensor]:
    """Our weights under TransformerLens 3.x's names and shapes, with zeros for the biases and
    positions a member does not have (what ``convert_tl_checkpoint`` reads)."""
    c = model.cfg
    H, d, D = c.n_heads, c.d_head, c.d_model
    zeros = lambda *shape: torch.zeros(*shape, device=model.W_E.device, dtype=model.W_E.dtype)  # noqa: E731
    out = {"embed.W_E": model.W_E, "unembed.W_U": model.W_U,
           "unembed.b_U": model.b_U if c.biases else zeros(c.d_vocab)}
    if c.positions != "rotary":
        out["pos_embed.W_pos"] = model.W_pos if model.W_pos is not None else zeros(c.n_ctx, D)
    order = _rotary_order(d) if c.positions == "rotary" else None
    lns = [("ln_final", model.ln_final)] if c.layernorm else []
    for l, block in enumerate(model.blocks):
        for name in "QKVO":
            W = getattr(block, f"W_{name}")
            b = getattr(block, f"b_{name}") if c.biases else zeros(D) if name == "O" else zeros(H, d)
            if order is not None and name in "QK":
                W, b = W[..., order], b[..., order]
            out[f"blocks.{l}.attn.W_{name}"], out[f"blocks.{l}.attn.b_{name}"] = W, b
        if c.d_mlp:
            out.update({f"blocks.{l}.mlp.{n}": getattr(model.mlps[l], n) for n in ("W_in", "b_in", "W_out", "b_out")})
        if c.layernorm:
            lns.append((f"blocks.{l}.ln1", model.ln_attn[l]))
            if c.d_mlp:
                lns.append((f"blocks.{l}.ln2", model.ln_mlp[l]))
    for name, ln in lns:
        out[f"{name}.w"], out[f"{name}.b"] = ln.w, ln.b if ln.b is not None else zeros(D)
    return {k: v.detach().clone() for k, v in out.items()}


def to_transformer_lens(model: Transformer, tokenizer=None, model_name: str = "attncircuits") -> "TransformerBridge":
    """An equivalent TransformerLens 4 ``TransformerBridge``: same weights (copied), same logits,
    for every member of the family (see the module for how each part is expressed).

    ``tokenizer`` (optional, e.g. ``load_pretrained(...).tokenizer``) lets the bridge take strings;
    they then start with ``<|endoftext|>``, as our training documents do. Token tensors are passed
    through unchanged either way.
    """
    tl = require_transformer_lens()
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.sources import build_bridge_from_module
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    if not isinstance(model, Transformer):
        raise TypeError(f"model must be an attncircuits Transformer, got {type(model).__name__}"
                        + ("; it is already a TransformerBridge" if isinstance(model, TransformerBridge) else ""))
    if not isinstance(model_name, str):
        raise TypeError(f"model_name must be a str, got {model_name!r}")
    device, dtype = model.W_E.device, model.W_E.dtype
    cfg = _bridge_config(model.cfg, model_name, str(device), dtype)
    tok = wrap_tokenizer(tokenizer) if tokenizer is not None else None
    if cfg.positional_embedding_type == "shortformer":
        native_cfg = copy.deepcopy(cfg)
        native_cfg.positional_embedding_type = "standard"  # the table the subclass adds to queries and keys
        with torch.random.fork_rng(devices=[]):  # its random init is overwritten: leave the caller's RNG alone
            native = qk_positions_model_class()(native_cfg).to(device=device, dtype=dtype)
        bridge = build_bridge_from_module(native, architecture=NATIVE, tl_config=cfg, tokenizer=tok,
                                          model_name=model_name, device=device, dtype=dtype)
    else:
        with torch.random.fork_rng(devices=[]):
            bridge = tl.TransformerBridge.boot_native(cfg, tokenizer=tok, device=device, dtype=dtype,
                                                      model_name=model_name)
    bridge.load_state_dict(convert_tl_checkpoint(_tl_state(model), bridge.cfg), strict=True)
    return bridge.eval()


class UnsupportedModelError(ValueError):
    """A TransformerLens model with a part the family cannot represent exactly."""


def _refusals(bridge) -> list[str]:
    """The parts of a bridge the family does not have, each named."""
    cfg = bridge.cfg
    get = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731
    out = []
    if get("architecture") != NATIVE:
        return [f"another architecture ({get('architecture')!r}, a {type(bridge.original_model).__name__}; the family is "
                "TransformerLens's native model, TransformerBridge.boot_native)"]
    norm = get("normalization_type")
    if norm is not None and str(norm).upper() != "LN":
        out.append(f"another normalisation (normalization_type={norm!r}; ours is LayerNorm 'LN' or none)")
    for flag, part in [("final_rms", "a final RMSNorm"), ("gated_mlp", "gated MLPs"),
                       ("use_qk_norm", "query/key normalisation"), ("post_embedding_ln", "a LayerNorm after the embedding")]:
        if get(flag, False):
            out.append(f"{part} ({flag}=True)")
    if not get("attn_only", False) and str(get("act_fn", "gelu")).lower() not in ("gelu", "relu"):
        out.append(f"another MLP activation (act_fn={get('act_fn')!r}; ours are 'gelu' and 'relu')")
    kv = get("n_key_value_heads")
    if kv not in (None, cfg.n_heads):
        out.append(f"grouped keys and values (n_key_value_heads={kv}, n_heads={cfg.n_heads})")
    pos = get("positional_embedding_type", "standard")
    if pos not in ("standard", "rotary", "shortformer"):
        out.append(f"another positional scheme (positional_embedding_type={pos!r})")
    if pos == "rotary" and (get("rotary_dim") not in (None, cfg.d_head) or float(get("rotary_base", 10000)) != 10000
                            or get("rope_scaling")):
        out.append(f"another rotary layout (rotary_dim={get('rotary_dim')}, rotary_base={get('rotary_base')}, "
                   f"rope_scaling={get('rope_scaling')}; ours turns all of d_head with base 10000)")
    if get("attention_dir", "causal") != "causal":
        out.append(f"bidirectional attention (attention_dir={get('attention_dir')!r})")
    scale = float(get("attn_scale", -1.0))
    if get("use_attn_scale", True) and scale > 0 and not math.isclose(scale, math.sqrt(cfg.d_head), rel_tol=1e-12):
        out.append(f"an attention scale other than sqrt(d_head) (attn_scale={scale})")
    for flag, part in [("attn_scores_soft_cap", "soft-capped attention scores"),
                       ("output_logits_soft_cap", "soft-capped logits")]:
        if (get(flag) or -1.0) > 0:
            out.append(f"{part} ({flag}={get(flag)})")
    if get("d_vocab_out", -1) not in (-1, cfg.d_vocab):
        out.append(f"an output vocabulary of another size (d_vocab_out={get('d_vocab_out')}, d_vocab={cfg.d_vocab})")
    if bridge.W_E.dtype == torch.float64:
        out.append("float64 weights (ours are float32; call tl_model.to(torch.float32) first)")
    return out


def from_transformer_lens(tl_model: "TransformerBridge") -> Transformer:
    """Our :class:`Transformer` with ``tl_model``'s weights, or an error naming every part the
    family cannot represent exactly (another architecture than TransformerLens's native model,
    RMSNorm, gated MLPs, grouped keys, another attention scale, ...). Non-zero biases make a member
    with ``biases=True``; float16/bfloat16 weights are widened to float32, which is exact."""
    require_transformer_lens()
    from transformer_lens.model_bridge import TransformerBridge

    if isinstance(tl_model, Transformer):
        raise TypeError("tl_model is already one of our Transformer models: use it as it is "
                        "(to_transformer_lens(model) converts it the other way)")
    if not isinstance(tl_model, TransformerBridge):
        hint = ("; TransformerLens 4 has no HookedTransformer: build a TransformerBridge"
                if type(tl_model).__name__ == "HookedTransformer" else "")
        raise TypeError(f"tl_model must be a TransformerLens TransformerBridge, got {type(tl_model).__name__}{hint}")
    problems = _refusals(tl_model)
    if problems:
        raise UnsupportedModelError("cannot represent this TransformerLens model exactly as a member of the family; "
                                    "it has " + "; ".join(problems))
    cfg = tl_model.cfg
    sd = tl_model.state_dict()
    f32 = lambda t: t.detach().to(torch.float32)  # noqa: E731
    pos_type = cfg.positional_embedding_type
    layernorm = str(cfg.normalization_type or "").upper() == "LN"
    W_pos = None if pos_type == "rotary" else f32(tl_model.W_pos)
    positions = {"shortformer": "sinusoidal-qk", "rotary": "rotary"}.get(pos_type, "learned")
    if positions == "learned" and not bool(W_pos.ne(0).any()):
        positions = "none"  # an all-zero table adds nothing
    lns = (["ln_final"] + [f"blocks.{l}.{n}" for l in range(cfg.n_layers) for n in ("ln1", "ln2")
                           if f"blocks.{l}.{n}.weight" in sd]) if layernorm else []
    biases = [tl_model.b_U] + ([tl_model.b_Q, tl_model.b_K, tl_model.b_V, tl_model.b_O] if cfg.n_layers else [])
    biases += [sd[f"{n}.bias"] for n in lns]
    ours_cfg = ModelConfig(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head, d_vocab=cfg.d_vocab,
        n_ctx=cfg.n_ctx, positions=positions, d_mlp=0 if cfg.attn_only else cfg.d_mlp, layernorm=layernorm,
        act_fn=str(cfg.act_fn or "gelu").lower() if not cfg.attn_only else "gelu",
        biases=any(bool(b.detach().ne(0).any()) for b in biases),
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's RNG alone
        model = Transformer(ours_cfg)
    state = model.state_dict()
    new = {"W_E": tl_model.W_E, "W_U": tl_model.W_U}
    if positions != "none" and W_pos is not None:
        new["W_pos"] = W_pos
    order = _rotary_order(cfg.d_head).argsort() if positions == "rotary" else None
    for l in range(cfg.n_layers):
        for name in "QKVO":
            W = getattr(tl_model, f"W_{name}")[l]
            b = getattr(tl_model, f"b_{name}")[l]
            if order is not None and name in "QK":
                W, b = W[..., order], b[..., order]
            new[f"blocks.{l}.W_{name}"] = W
            if ours_cfg.biases:
                new[f"blocks.{l}.b_{name}"] = b
        if ours_cfg.d_mlp:
            new.update({f"mlps.{l}.{n}": getattr(tl_model, n)[l] for n in ("W_in", "b_in", "W_out", "b_out")})
    if ours_cfg.biases:
        new["b_U"] = tl_model.b_U
    ours = {"ln_final": "ln_final"}
    ours.update({f"blocks.{l}.ln1": f"ln_attn.{l}" for l in range(cfg.n_layers)})
    ours.update({f"blocks.{l}.ln2": f"ln_mlp.{l}" for l in range(cfg.n_layers)})
    for n in lns:
        new[f"{ours[n]}.w"] = sd[f"{n}.weight"]
        if ours_cfg.biases:
            new[f"{ours[n]}.b"] = sd[f"{n}.bias"]
    missing = sorted(set(state) - set(new) - {"W_pos"})
    if missing:
        raise RuntimeError(f"TransformerLens gave no value for {missing}: this version's names differ")
    state.update({k: f32(v) for k, v in new.items()})
    device = tl_model.W_E.device
    model.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=True)
    return model.to(device).eval()


# ---- chapter 9's references: a hook, a pattern score, the OV eigenvalues through FactoredMatrix --
def induction_stripe_scores(pattern: Float[Tensor, "batch head q k"], seq_len: int) -> Float[Tensor, " head"]:
    """Mean attention of the second copy's queries to the token after their earlier occurrence, on
    ``[EOT] r1..rL r1..rL``: query ``q = L + i`` (token ``r_i``) looks at key ``i + 1``, which sits on
    the diagonal ``seq_len - 1`` below the main one. 1 for a perfect induction head."""
    stripe = pattern.diagonal(offset=1 - seq_len, dim1=-2, dim2=-1)  # entry j: query j + L - 1, key j
    return stripe[..., 2 : 2 + seq_len].mean(dim=(0, 2))  # queries L + 1 .. 2L: the second copy


def zero_head_hook(z: Float[Tensor, "batch pos head d_head"], hook, head: int) -> Tensor:
    """A TransformerLens hook on ``blocks.{l}.attn.hook_z`` that zero-ablates one head: a zero ``z``
    (the head's value mix before ``W_O``) is a zero head output, ``z W_O = 0``."""
    z[:, :, head] = 0.0
    return z


def ov_copying_scores(tl_model: "TransformerBridge") -> Float[Tensor, "layer head"]:
    """``Σλ / Σ|λ|`` of every head's full OV circuit ``W_E W_V W_O W_U`` from TransformerLens's
    ``FactoredMatrix`` (eigenvalues through the small ``d_head x d_head`` product): +1 when all are
    positive, a head that copies the token it attends to."""
    eig = (tl_model.W_E @ tl_model.OV @ tl_model.W_U).eigenvalues  # [layer, head, d_head]
    return eig.sum(-1).real / eig.abs().sum(-1)
