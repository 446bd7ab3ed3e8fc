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

import copy
import functools
import importlib.metadata
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING


from attncircuits.models.transformer import ModelConfig
from attncircuits.models.parts import ActivationCache, sinusoidal_positions

if TYPE_CHECKING:  # pragma: no cover
    from transformer_lens import HookedTransformer

TL_REQUIREMENT = "transformer-lens>=3.9,<4"
_INSTALL = f"run `pip install -e '.[tl]'` in the course repository, or `pip install '{TL_REQUIREMENT}'`"


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

    # the family's fields (attncircuits.models.config), read by attncircuits.models.interface
    @property
    def positions(self) -> str:
        if self.positional_embedding_type == "shortformer":
            return "sinusoidal-qk"
        return "sinusoidal-residual" if self.sinusoidal_positions else "learned"

    layernorm = property(lambda self: True)

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
        model = course_hooked_class()(self.tl_config(), move_to_device=False)
        model.course_cfg = self
        if self.sinusoidal_positions:  # fixed, as in the attention-only models: not trained
            model.pos_embed.W_pos.data.copy_(sinusoidal_positions(self.n_ctx, self.d_model))
            model.pos_embed.W_pos.requires_grad_(False)
        return model


_CACHED = ("hook_resid_pre", "hook_resid_post", "hook_attn_scores", "hook_pattern", "hook_v", "hook_z", "hook_mlp_out")


@functools.cache
def course_hooked_class():
    """TransformerLens's ``HookedTransformer`` with the course's model interface
    (:mod:`attncircuits.models.interface`), defined once TransformerLens is imported: the course's
    measures run on it as on every other member, and it stays a ``HookedTransformer`` for
    TransformerLens's own hooks, caches and head detector."""
    tl = require_transformer_lens()

    class CourseHookedTransformer(tl.HookedTransformer):
        course_cfg: HookedConfig

        def course_config(self) -> HookedConfig:
            return self.course_cfg

        def forward_checked(self, tokens, return_cache=False, ablate=None, patterns=None):
            if ablate or patterns:
                raise TypeError("chapter 10's model takes no ablate or patterns here: remove heads or replace "
                                "patterns with TransformerLens hooks (model.hooks(fwd_hooks=...))")
            if not return_cache:
                return self(tokens)
            logits, tl_cache = self.run_with_cache(tokens, names_filter=lambda name: name.endswith(_CACHED))
            cache = ActivationCache()
            for layer in range(self.cfg.n_layers):
                cache.resid.append(tl_cache["resid_pre", layer])
                cache.add_layer(tl_cache["attn_scores", layer], tl_cache["pattern", layer], tl_cache["v", layer],
                                tl_cache["z", layer], self.blocks[layer].attn.W_O)
                if not self.cfg.attn_only:
                    cache.mlp_out.append(tl_cache["mlp_out", layer])
            cache.resid.append(tl_cache["resid_post", self.cfg.n_layers - 1])
            return logits, cache

        def to_logits(self, resid):
            return self.unembed(self.ln_final(resid) if hasattr(self, "ln_final") else resid)

        def folded(self):
            """A copy with LayerNorm folded into the weights that read the residual stream (and the
            writing weights and unembedding centred), TransformerLens's ``process_weights_``: weight
            matrices whose products mean what chapter 5's scores assume. With positions added to the
            queries and keys after the LayerNorm (``shortformer``, as chapter 10's model has) the
            folded gain scales the positions' part too, so the logits differ; the weight products
            and the values are exact (see :meth:`attncircuits.models.transformer.Transformer.folded`)."""
            out = copy.deepcopy(self)
            has_ln = self.cfg.normalization_type is not None  # without one there is nothing to fold
            out.process_weights_(fold_ln=has_ln, center_writing_weights=has_ln, center_unembed=True)
            return out.eval()

        def weights(self):
            """The learned parameters by name: what a checkpoint stores (not the causal-mask buffers)."""
            return dict(self.named_parameters())

        def load_weights(self, state):
            self.load_state_dict({**self.state_dict(), **state})

        def to(self, *args, print_details: bool = False, **kwargs):  # quiet, as every model of the course
            return super().to(*args, print_details=print_details, **kwargs)

    return CourseHookedTransformer


@dataclass(frozen=True)
class TLFeatures:
    """Which member of the family a TransformerLens model someone else built is (what
    :func:`attncircuits.models.interface.features` reads)."""

    n_layers: int
    positions: str
    d_mlp: int
    layernorm: bool


#: how each position scheme of the family reads in TransformerLens's config ("none": its "standard"
#: positions, all zero, which add nothing)
TL_POSITIONS = {"sinusoidal-qk": "shortformer", "learned": "standard", "rotary": "rotary", "none": "standard"}
_FROM_TL = {tl: ours for ours, tl in TL_POSITIONS.items() if ours != "none"}


def adopt(tl_model) -> "HookedTransformer":
    """A ``HookedTransformer`` built outside the course, given the course's model interface in
    place (:mod:`attncircuits.models.interface`): the same object, its weights and hooks untouched,
    so the course's detectors and callbacks run on it. A course model is returned as it is."""
    if hasattr(tl_model, "course_config"):
        return tl_model
    tl = require_transformer_lens()
    if not isinstance(tl_model, tl.HookedTransformer):
        raise TypeError(f"expected a course model or a TransformerLens HookedTransformer, got {type(tl_model).__name__}")
    c = tl_model.cfg
    if c.positional_embedding_type not in _FROM_TL:
        raise ValueError(f"positional_embedding_type={c.positional_embedding_type!r} is not a position scheme the course "
                         f"reads; use one of {', '.join(map(repr, _FROM_TL))}")
    tl_model.__class__ = course_hooked_class()
    tl_model.course_cfg = TLFeatures(c.n_layers, _FROM_TL[c.positional_embedding_type],
                                     0 if c.attn_only else (c.d_mlp or 0), c.normalization_type is not None)
    return tl_model


def model_config(d: Mapping) -> ModelConfig | HookedConfig:
    """The config that settings ``d`` (a preset's, or a checkpoint's config.json) describe:
    attention-only unless they name another architecture."""
    if d.get("architecture") is not None:
        return HookedConfig.from_dict(d)
    return ModelConfig.from_dict(d)
