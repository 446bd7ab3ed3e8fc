"""Chapter 10's model: a TransformerLens ``HookedTransformer`` with the parts the course left out.

Pre-LayerNorm residual blocks, each an attention layer and a GELU MLP, four of them, with the same
tokenizer, corpus and context as the attention-only models. It is trained by the course's own loop
(:func:`attncircuits.train.train`, preset ``ln-mlp-4l``) and saved and loaded like the others
(:mod:`attncircuits.checkpoints.pretrained`); TransformerLens gives the hooks, ``fold_ln`` and the head
detector. TransformerLens is the optional ``tl`` extra (:data:`TL_REQUIREMENT`); without it,
or with a 4.x, building the model names the install command (:func:`transformer_lens_version`,
which chapter 9 uses too). The chapter's measures on it are in
:mod:`attncircuits.analysis.deeper`.
"""

from __future__ import annotations

import importlib.metadata
import re
import types
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from attncircuits.models.attn_only import AttnOnlyConfig, AttnOnlyTransformer, sinusoidal_positions

if TYPE_CHECKING:  # pragma: no cover
    from transformer_lens import HookedTransformer

TL_REQUIREMENT = "transformer-lens>=3.9,<4"
_INSTALL = f'run `pip install -e .[tl]` in the course repository, or `pip install "{TL_REQUIREMENT}"`'


def transformer_lens_version() -> str:
    """The installed TransformerLens version; an ImportError naming the install command when it is
    missing, too old, or 4.x (which has no ``HookedTransformer`` to load our weights into)."""
    try:
        version = importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"TransformerLens is not installed; {_INSTALL}") from None
    major_minor = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if major_minor >= (4, 0):
        raise ImportError(
            f"TransformerLens {version} is installed, but attncircuits.models.interop needs 3.x: 4.x replaced "
            "HookedTransformer, which takes our weights directly, by TransformerBridge, which wraps Hugging "
            f'Face models; run `pip install "{TL_REQUIREMENT}"`'
        )
    if major_minor < (3, 9):
        raise ImportError(f"TransformerLens {version} is too old (3.9 or later is needed); {_INSTALL}")
    return version


def require_transformer_lens():
    """The ``transformer_lens`` module, or an ImportError naming the install command (see
    :func:`transformer_lens_version`)."""
    transformer_lens_version()
    import transformer_lens

    return transformer_lens


#: the ``architecture`` value a checkpoint's config.json carries for this model
ARCHITECTURE = "hooked-ln-mlp"


@dataclass
class HookedConfig:
    """The shape of a pre-LayerNorm transformer with MLPs (TransformerLens names)."""

    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    d_head: int = 32
    d_mlp: int = 512
    n_ctx: int = 128
    d_vocab: int = 2048
    act_fn: str = "gelu"
    normalization_type: str = "LN"
    # "shortformer": positions enter the queries and keys only, as in the attention-only models, so
    # the residual stream carries tokens alone; "standard": added to the residual stream (GPT-2)
    positional_embedding_type: str = "standard"
    # the attention-only models' fixed sinusoidal positions instead of learned ones: with learned
    # positions (random at first) the previous-token head formed far later (see the ln-mlp-4l preset)
    sinusoidal_positions: bool = False

    def __post_init__(self):
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"HookedConfig.{name} must be a whole number >= 1, got {v!r}")
        if self.act_fn not in ("gelu", "relu", "gelu_new"):
            raise ValueError(f"HookedConfig.act_fn must be 'gelu', 'gelu_new' or 'relu', got {self.act_fn!r}")
        if self.positional_embedding_type not in ("standard", "shortformer"):
            raise ValueError("HookedConfig.positional_embedding_type must be 'standard' or 'shortformer', "
                             f"got {self.positional_embedding_type!r}")
        if self.normalization_type not in ("LN", "LNPre"):
            raise ValueError(f"HookedConfig.normalization_type must be 'LN' or 'LNPre', got {self.normalization_type!r}")

    def to_dict(self) -> dict:
        return {"architecture": ARCHITECTURE, **asdict(self)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "HookedConfig":
        if d.get("architecture") != ARCHITECTURE:
            raise ValueError(f"not a {ARCHITECTURE} config (architecture={d.get('architecture')!r})")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"architecture"})
        if unknown:
            raise ValueError(f"unknown HookedConfig fields {unknown}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def tl_kwargs(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "sinusoidal_positions"}

    def tl_config(self):
        """The ``HookedTransformerConfig`` of this shape."""
        tl = require_transformer_lens()
        return tl.HookedTransformerConfig(
            **self.tl_kwargs(), default_prepend_bos=False,
            original_architecture=ARCHITECTURE,
        )

    def build(self) -> "HookedTransformer":
        """A freshly initialised model (seeded by ``torch.manual_seed``, as the training loop does)."""
        tl = require_transformer_lens()
        model = tl.HookedTransformer(self.tl_config(), move_to_device=False)
        # the course's measures call forward_checked on tokens they have checked already
        model.forward_checked = types.MethodType(_forward_checked, model)
        if self.sinusoidal_positions:  # fixed, as in the attention-only models: not trained
            model.pos_embed.W_pos.data.copy_(sinusoidal_positions(self.n_ctx, self.d_model))
            model.pos_embed.W_pos.requires_grad_(False)
        return model


def _forward_checked(model, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
    if kwargs:
        raise TypeError(f"chapter 10's model takes no {', '.join(sorted(kwargs))} here: remove heads or "
                        "replace patterns with TransformerLens hooks (model.hooks(fwd_hooks=...))")
    return model(tokens)


def weights(model) -> dict[str, torch.Tensor]:
    """The learned parameters by name: what a checkpoint stores (not the causal-mask buffers)."""
    return dict(model.named_parameters())


def model_config(d: Mapping) -> AttnOnlyConfig | HookedConfig:
    """The config that settings ``d`` (a preset's, or a checkpoint's config.json) describe:
    attention-only unless they name another architecture."""
    if d.get("architecture") is not None:
        return HookedConfig.from_dict(d)
    return AttnOnlyConfig.from_dict(d)


def build_model(cfg: AttnOnlyConfig | HookedConfig) -> torch.nn.Module:
    """A freshly initialised model of either kind."""
    return cfg.build() if isinstance(cfg, HookedConfig) else AttnOnlyTransformer(cfg)


def config_of(model) -> AttnOnlyConfig | HookedConfig:
    """The course config of a model of either kind (what its checkpoint's config.json holds)."""
    if isinstance(model, AttnOnlyTransformer):
        return model.cfg
    fields = [name for name in HookedConfig.__dataclass_fields__ if name != "sinusoidal_positions"]
    fixed = not model.pos_embed.W_pos.requires_grad
    return HookedConfig(**{name: getattr(model.cfg, name) for name in fields}, sinusoidal_positions=fixed)


def expected_shapes(cfg: HookedConfig) -> dict[str, tuple]:
    """The shape of every parameter a checkpoint of this config holds, found without allocating any
    memory (on torch's meta device)."""
    with torch.device("meta"), torch.random.fork_rng(devices=[]):
        return {k: tuple(v.shape) for k, v in weights(cfg.build()).items()}
