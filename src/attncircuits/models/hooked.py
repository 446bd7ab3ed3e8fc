"""Chapter 10's model as a member of the family, and the TransformerLens requirement.

``ln-mlp-4l`` was trained as a TransformerLens 3.x ``HookedTransformer``: pre-LayerNorm blocks with
GELU MLPs, the attention-only models' fixed sinusoids added to the queries and keys ("shortformer"),
and TransformerLens's biases. Every one of those parts is a field of the family
(:mod:`attncircuits.models.config`: ``layernorm``, ``d_mlp``, ``positions="sinusoidal-qk"``,
``biases``) and computes TransformerLens's arithmetic, so its checkpoint, saved with
TransformerLens's names (``architecture: "hooked-ln-mlp"`` in its config.json), is read into a
:class:`~attncircuits.models.transformer.Transformer` as it is: every tensor renamed, none changed
(:func:`model_config`, :func:`legacy_names`).

TransformerLens is the optional ``tl`` extra (:data:`TL_REQUIREMENT`), imported only where a
function needs it; :func:`transformer_lens_version` names the install command when it is missing
or outside the range.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping

from attncircuits.models.transformer import ModelConfig

TL_REQUIREMENT = "transformer-lens>=4.3,<5"
_INSTALL = f"run `pip install -e '.[tl]'` in the course repository, or `pip install '{TL_REQUIREMENT}'`"


def transformer_lens_version() -> str:
    """The installed TransformerLens version; an ImportError naming the install command when it is
    missing, older than 4.3 (whose ``HookedTransformer`` the course no longer uses) or 5 and later."""
    try:
        version = importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"TransformerLens is not installed; {_INSTALL}") from None
    major_minor = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if major_minor < (4, 3):
        raise ImportError(f"TransformerLens {version} is too old: the course uses TransformerBridge, 4.3 or later; "
                          f"run `pip install '{TL_REQUIREMENT}'`")
    if major_minor >= (5, 0):
        raise ImportError(f"TransformerLens {version} is newer than the course was checked with (4.x); "
                          f"run `pip install '{TL_REQUIREMENT}'`")
    return version


def require_transformer_lens():
    """The ``transformer_lens`` module, or an ImportError naming the install command (see
    :func:`transformer_lens_version`)."""
    transformer_lens_version()
    import transformer_lens

    return transformer_lens


#: the ``architecture`` value of chapter 10's checkpoint, saved with TransformerLens 3.x's names
ARCHITECTURE = "hooked-ln-mlp"
_HOOKED_FIELDS = {"n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab", "act_fn",
                  "normalization_type", "positional_embedding_type", "sinusoidal_positions"}


def _from_hooked(d: Mapping) -> ModelConfig:
    unknown = sorted(set(d) - _HOOKED_FIELDS - {"architecture"})
    if unknown:
        raise ValueError(f"unknown {ARCHITECTURE} fields {unknown}")
    pos = (d.get("positional_embedding_type", "standard"), bool(d.get("sinusoidal_positions", False)))
    positions = {("shortformer", True): "sinusoidal-qk", ("standard", False): "learned"}.get(pos)
    if positions is None:
        raise ValueError(f"positional_embedding_type={pos[0]!r} with sinusoidal_positions={pos[1]} is not a position "
                         "scheme of the family (shortformer with sinusoids, or learned standard positions)")
    if d.get("normalization_type", "LN") != "LN":
        raise ValueError(f"normalization_type={d['normalization_type']!r}: the family's LayerNorm has a gain ('LN')")
    if d.get("act_fn", "gelu") not in ("gelu", "relu"):
        raise ValueError(f"act_fn={d['act_fn']!r} is not an activation of the family ('gelu', 'relu')")
    keep = {k: d[k] for k in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab", "act_fn") if k in d}
    defaults = {"n_layers": 4, "d_model": 128, "n_heads": 4, "d_head": 32, "d_mlp": 512, "n_ctx": 128, "d_vocab": 2048}
    return ModelConfig(**{**defaults, **keep}, positions=positions, layernorm=True, biases=True)


def model_config(d: Mapping) -> ModelConfig:
    """The config that settings ``d`` (a preset's, or a checkpoint's config.json) describe; chapter
    10's checkpoint (``architecture: "hooked-ln-mlp"``) reads as the family member it is."""
    if d.get("architecture") is None:
        return ModelConfig.from_dict(d)
    if d["architecture"] != ARCHITECTURE:
        raise ValueError(f"unknown architecture {d['architecture']!r}; the course reads {ARCHITECTURE!r} and the family")
    return _from_hooked(d)


def is_legacy(d: Mapping) -> bool:
    """Whether config ``d`` describes a checkpoint saved with TransformerLens 3.x's names."""
    return d.get("architecture") == ARCHITECTURE


def legacy_names(cfg: ModelConfig) -> dict[str, str]:
    """Each of the family's weight names (``Transformer.weights()``) with the TransformerLens 3.x
    name chapter 10's checkpoint stores it under."""
    out = {"W_E": "embed.W_E", "W_pos": "pos_embed.W_pos", "W_U": "unembed.W_U", "b_U": "unembed.b_U",
           "ln_final.w": "ln_final.w", "ln_final.b": "ln_final.b"}
    for l in range(cfg.n_layers):
        out.update({f"blocks.{l}.{n}": f"blocks.{l}.attn.{n}" for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")})
        out.update({f"mlps.{l}.{n}": f"blocks.{l}.mlp.{n}" for n in ("W_in", "b_in", "W_out", "b_out")})
        for ours, theirs in (("ln_attn", "ln1"), ("ln_mlp", "ln2")):
            out.update({f"{ours}.{l}.{n}": f"blocks.{l}.{theirs}.{n}" for n in ("w", "b")})
    return out
