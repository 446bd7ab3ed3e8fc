"""Our models in TransformerLens and back (chapter 9): ``to_transformer_lens``, ``from_transformer_lens``.

TransformerLens's ``HookedTransformer`` computes exactly our forward pass when configured as an
attention-only model (``attn_only=True``) without normalisation (``normalization_type=None``) and
with ``positional_embedding_type="shortformer"``: its positions ``W_pos`` are added to the query and
key inputs of every layer and never to the residual stream or the values, as ours are. The rest
agrees by default: scores divided by ``sqrt(d_head)`` (``attn_scale``), a causal mask that sets the
scores of later keys to -inf before the softmax, weights in the same shapes and the same row-vector
convention (``W_Q [n_heads, d_model, d_head]``, ...). TransformerLens adds biases (``b_Q, b_K, b_V,
b_O, b_U``); ours has none, so they are left at zero. The weights are copied, never transformed, so
``from_transformer_lens(to_transformer_lens(m))`` gives ``m`` back bit for bit.

Only TransformerLens 3.x has ``HookedTransformer`` with this config; 4.x replaced it with
``TransformerBridge``, which wraps Hugging Face architectures. TransformerLens is an optional extra
(``pip install -e '.[tl]'``) and is imported only when one of these functions is called.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from attncircuits.models.transformer import ModelConfig
from attncircuits.models.transformer import Transformer

# the TransformerLens requirement and its check live with chapter 10's model (hooked.py, a lower
# layer that loading checkpoints needs); chapter 9 reads them here, in the TransformerLens room
from attncircuits.models.hooked import TL_POSITIONS, TL_REQUIREMENT, require_transformer_lens, transformer_lens_version

if TYPE_CHECKING:  # pragma: no cover
    from transformer_lens import HookedTransformer

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


def wrap_tokenizer(tokenizer):
    """A Hugging Face fast tokenizer around our ``tokenizers.Tokenizer``, for TransformerLens's
    string methods (``to_tokens``, ``to_str_tokens``). No BOS token is declared, so TransformerLens
    does not try to reload the tokenizer from the Hub; it then uses ``<|endoftext|>`` (token 0) as
    BOS, which is how our documents start."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def to_transformer_lens(
    model: Transformer, tokenizer=None, model_name: str = "attncircuits"
) -> "HookedTransformer":
    """An equivalent TransformerLens ``HookedTransformer``: same weights (copied), same logits, for
    every member of the family (:data:`TL_POSITIONS` says how each position scheme is expressed;
    our LayerNorm has no bias, so TransformerLens's is zero, as are the attention biases).

    ``tokenizer`` (optional, e.g. ``load_pretrained(...).tokenizer``) lets the TransformerLens model
    take strings; strings then start with ``<|endoftext|>``, as our training documents do. Token
    tensors are passed through unchanged either way.
    """
    tl = require_transformer_lens()
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be an attncircuits Transformer, got {type(model).__name__}"
                        + ("; it is already a HookedTransformer" if isinstance(model, tl.HookedTransformer) else ""))
    if not isinstance(model_name, str):
        raise TypeError(f"model_name must be a str, got {model_name!r}")
    c = model.cfg
    extra = {"rotary_dim": c.d_head, "rotary_adjacent_pairs": False, "rotary_base": 10000} if c.positions == "rotary" else {}
    cfg = tl.HookedTransformerConfig(
        model_name=model_name,
        n_layers=c.n_layers,
        d_model=c.d_model,
        d_head=c.d_head,
        n_heads=c.n_heads,
        n_ctx=c.n_ctx,
        d_vocab=c.d_vocab,
        attn_only=c.attn_only,
        d_mlp=c.d_mlp or None,
        act_fn=c.act_fn if c.d_mlp else None,
        normalization_type="LN" if c.layernorm else None,
        positional_embedding_type=TL_POSITIONS[c.positions],
        init_weights=False,
        device=str(model.W_E.device),
        dtype=model.W_E.dtype,
        **extra,
    )
    with warnings.catch_warnings():
        # 3.x warns that HookedTransformer goes away in 4.0: the reason the extra is pinned below 4
        warnings.filterwarnings("ignore", "HookedTransformer is deprecated", DeprecationWarning)
        tl_model = tl.HookedTransformer(cfg, tokenizer=wrap_tokenizer(tokenizer) if tokenizer is not None else None)
    state = tl_model.state_dict()
    ours = {"embed.W_E": model.W_E, "unembed.W_U": model.W_U}
    if model.W_pos is not None:
        ours["pos_embed.W_pos"] = model.W_pos
    if c.layernorm:
        ours["ln_final.w"] = model.ln_final.w
    for l, block in enumerate(model.blocks):
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            ours[f"blocks.{l}.attn.{name}"] = getattr(block, name)
        if c.d_mlp:
            for name in ("W_in", "b_in", "W_out", "b_out"):
                ours[f"blocks.{l}.mlp.{name}"] = getattr(model.mlps[l], name)
        if c.layernorm:
            ours[f"blocks.{l}.ln1.w"] = model.ln_attn[l].w
            if c.d_mlp:
                ours[f"blocks.{l}.ln2.w"] = model.ln_mlp[l].w
    for key, value in state.items():
        if key in ours:
            state[key] = ours[key].detach().clone()
        elif re.search(r"\.(b_[QKVOU]|b|W_pos)$", key):  # biases, LayerNorm biases, "none"'s positions
            state[key] = torch.zeros_like(value)
    missing = sorted(set(ours) - set(state))
    if missing:
        raise RuntimeError(f"TransformerLens has no place for {missing}: this version's names differ")
    tl_model.load_state_dict(state, strict=True)
    return tl_model.eval()


class UnsupportedModelError(ValueError):
    """A TransformerLens model with a part our attention-only model cannot represent exactly."""


def _refusals(cfg) -> list[str]:
    """The parts of a TransformerLens config that our model does not have, each named."""
    out = []
    get = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731 (fields differ by version)
    if not get("attn_only", False):
        out.append("MLPs (attn_only=False; ours is attention-only)")
    if get("normalization_type") is not None:
        out.append(f"LayerNorm (normalization_type={get('normalization_type')!r}; ours has no normalisation)")
    for flag, part in [
        ("final_rms", "a final RMSNorm"),
        ("post_embedding_ln", "a LayerNorm after the embedding"),
        ("use_normalization_before_and_after", "LayerNorm after each layer"),
        ("use_qk_norm", "query/key normalisation"),
    ]:
        if get(flag, False):
            out.append(f"{part} ({flag}=True)")
    pos = get("positional_embedding_type")
    if pos != "shortformer":
        what = {
            "standard": "positions in the residual stream",
            "rotary": "rotary positions",
            "alibi": "ALiBi positions",
        }.get(pos, "another positional scheme")
        out.append(
            f"{what} (positional_embedding_type={pos!r}; ours adds them to queries and keys only, 'shortformer')"
        )
    if get("attention_dir", "causal") != "causal":
        out.append(f"bidirectional attention (attention_dir={get('attention_dir')!r})")
    if get("use_local_attn", False):
        out.append("local attention (use_local_attn=True)")
    scale = float(get("attn_scale", -1.0)) if get("use_attn_scale", True) else 1.0
    if not math.isclose(scale, math.sqrt(cfg.d_head), rel_tol=1e-12) or get("scale_attn_by_inverse_layer_idx", False):
        out.append(
            f"an attention scale other than sqrt(d_head) (attn_scale={scale}, use_attn_scale={get('use_attn_scale')})"
        )
    for flag, part in [
        ("attn_scores_soft_cap", "soft-capped attention scores"),
        ("output_logits_soft_cap", "soft-capped logits"),
    ]:
        if get(flag, -1.0) is not None and get(flag, -1.0) > 0:
            out.append(f"{part} ({flag}={get(flag)})")
    for flag, part in [
        ("use_attention_sinks", "attention sinks"),
        ("use_logn_attn", "log-n attention scaling"),
        ("clip_qkv", "clipped queries, keys and values"),
        ("num_experts", "mixture-of-experts layers"),
    ]:
        if get(flag):
            out.append(f"{part} ({flag}={get(flag)})")
    if get("d_vocab_out", cfg.d_vocab) not in (-1, cfg.d_vocab):
        out.append(f"an output vocabulary of another size (d_vocab_out={get('d_vocab_out')}, d_vocab={cfg.d_vocab})")
    if get("dtype", torch.float32) == torch.float64:
        out.append("float64 weights (ours are float32; call tl_model.to(torch.float32) first)")
    return out


def from_transformer_lens(tl_model: "HookedTransformer") -> Transformer:
    """Our :class:`Transformer` with ``tl_model``'s weights, or an error naming every part it
    cannot represent exactly (LayerNorm, MLPs, non-zero biases, positions in the residual stream,
    rotary positions, ...). float16/bfloat16 weights are widened to float32, which is exact."""
    tl = require_transformer_lens()
    if isinstance(tl_model, Transformer):
        raise TypeError("tl_model is already one of our Transformer models: use it as it is "
                        "(to_transformer_lens(model) converts it the other way)")
    if not isinstance(tl_model, tl.HookedTransformer):
        raise TypeError(f"tl_model must be a TransformerLens HookedTransformer, got {type(tl_model).__name__}")
    cfg = tl_model.cfg
    problems = _refusals(cfg)
    blocks = [b.attn for b in tl_model.blocks]
    if not problems:
        biases = [("unembed.b_U", tl_model.unembed.b_U)]
        for l, attn in enumerate(blocks):
            biases += [(f"blocks.{l}.attn.{n}", getattr(attn, n)) for n in ("b_Q", "b_K", "b_V", "b_O")]
        nonzero = [f"{n} (max |b| = {b.abs().max().item():.3g})" for n, b in biases if bool(b.detach().ne(0).any())]
        if nonzero:
            problems.append("non-zero biases: " + ", ".join(nonzero) + " (ours has none)")
    if problems:
        raise UnsupportedModelError(
            "cannot represent this TransformerLens model exactly as an attention-only Transformer; "
            "it has " + "; ".join(problems)
        )
    ours_cfg = ModelConfig(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head,
        d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's RNG alone
        model = Transformer(ours_cfg)
    device = tl_model.embed.W_E.device
    state = {"W_E": tl_model.embed.W_E, "W_pos": tl_model.pos_embed.W_pos, "W_U": tl_model.unembed.W_U}
    for l, attn in enumerate(blocks):  # properties, so grouped-query keys/values come expanded per head
        state.update({f"blocks.{l}.{n}": getattr(attn, n) for n in ("W_Q", "W_K", "W_V", "W_O")})
    model.load_state_dict({k: v.detach().to(device=device, dtype=torch.float32) for k, v in state.items()}, strict=True)
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


def ov_copying_scores(tl_model: "HookedTransformer") -> Float[Tensor, "layer head"]:
    """``Σλ / Σ|λ|`` of every head's full OV circuit ``W_E W_V W_O W_U`` from TransformerLens's
    ``FactoredMatrix`` (eigenvalues through the small ``d_head x d_head`` product): +1 when all are
    positive, a head that copies the token it attends to."""
    eig = (tl_model.W_E @ tl_model.OV @ tl_model.W_U).eigenvalues  # [layer, head, d_head]
    return eig.sum(-1).real / eig.abs().sum(-1)
