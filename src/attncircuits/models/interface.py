"""The one interface every model of the course offers, and the refusals written against it.

Analysis code is written against this interface, never against a class. A model offers:

- ``cfg``: ``n_layers``, ``n_heads``, ``d_model``, ``d_head``, ``d_vocab``, ``n_ctx``;
- ``course_config()``: the course config it was built from (what its checkpoint's config.json
  holds); its ``positions``, ``d_mlp`` and ``layernorm`` say which member of the family it is
  (:mod:`attncircuits.models.config`);
- ``forward(tokens, return_cache=False, ablate=None, patterns=None)`` and ``forward_checked``
  (the same for tokens already checked): logits ``[batch, pos, d_vocab]`` and, if asked, an
  :class:`~attncircuits.models.parts.ActivationCache` (``resid``, ``attn_scores``, ``pattern``,
  ``v``, ``z``, ``head_out``, ``mlp_out``);
- ``to_logits(resid)``: the logits of a final residual stream (through the final LayerNorm);
- ``folded()``: LayerNorm folded into the weights that read the stream (the model itself where
  there is none), whose weight products chapter 5's scores can read;
- the named weights ``W_E``, ``W_pos`` (None where no position table is added), ``W_Q``,
  ``W_K``, ``W_V``, ``W_O`` (stacked ``[layer, head, ...]``), ``W_U``;
- ``weights()`` / ``load_weights(state)``: what a checkpoint stores.

One class offers it: :class:`attncircuits.models.transformer.Transformer`, every member of the
family, chapter 10's model among them (:mod:`attncircuits.models.hooked`); a TransformerLens
bridge is read as a member by :func:`attncircuits.models.interop.from_transformer_lens`.
A measure that needs a kind of member (positions in the queries and keys, no LayerNorm) says so
with :func:`require`, in one line, before it computes.
"""

from __future__ import annotations

from attncircuits.models.config import POSITIONS


#: what the exact path expansion of chapters 2-8 is written for (the paper's object)
PATH_EXPANSION = dict(positions=("sinusoidal-qk",), attn_only=True, no_layernorm=True)


def features(model) -> dict:
    """Which member of the family ``model`` is: ``positions``, ``d_mlp``, ``layernorm``, ``n_layers``."""
    try:
        cfg = model.course_config()
    except AttributeError:
        raise TypeError(f"{type(model).__name__} is not a model of the course: build one with ModelConfig(...).build() "
                        "or load one with load_pretrained(...)") from None
    return {"positions": cfg.positions, "d_mlp": cfg.d_mlp, "layernorm": cfg.layernorm, "n_layers": cfg.n_layers}


def require(model, what: str, *, positions: tuple[str, ...] | None = None, attn_only: bool = False,
            no_layernorm: bool = False) -> None:
    """Refuse, in one line naming the field and what is allowed, a model that ``what`` is not
    written for: another position scheme, MLPs, or LayerNorm."""
    f = features(model)
    if positions is not None and f["positions"] not in positions:
        allowed = " or ".join(f"{p!r} ({POSITIONS.get(p, p)})" for p in positions)
        raise ValueError(f"{what} needs positions={allowed}; this model has positions={f['positions']!r}")
    if attn_only and f["d_mlp"]:
        raise ValueError(f"{what} is written for attention-only models (d_mlp=0); this model has d_mlp={f['d_mlp']}")
    if no_layernorm and f["layernorm"]:
        raise ValueError(f"{what} is written for models without LayerNorm (layernorm=False); this one has LayerNorm: "
                         "use model.folded() and the frozen-scale measures of chapter 10")
