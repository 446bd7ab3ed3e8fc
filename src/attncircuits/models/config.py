"""The family of models as configuration: one :class:`~attncircuits.models.transformer.ModelConfig`
describes every member; this module holds what its fields allow.

Its defaults are the paper's object, the model of chapters 1-9: attention only, no LayerNorm, no
biases, fixed sinusoidal positions in the queries and keys only, so the logits are an exact sum of
paths. The other fields open the family Olsson et al. (2022) trained, and more:

==================  ======================================================================
``n_layers``        0 (the bigram model) and up
``d_mlp``           0: attention only; otherwise a GELU (or ReLU, ``act_fn``) MLP of that width
                    after the attention of every layer
``layernorm``       a LayerNorm (gain, no bias) before every attention, MLP and the unembedding
``biases``          biases in the attention (``b_Q, b_K, b_V, b_O``), the LayerNorms (``b``)
                    and the unembedding (``b_U``), as TransformerLens's models have; False: none
                    (the MLPs always have theirs)
``positions``       ``"sinusoidal-qk"`` fixed sinusoids added to the queries' and keys' inputs
                    only (the course's, "shortformer"); ``"learned"`` learned positions added
                    to the residual stream (GPT-2's); ``"rotary"`` queries and keys turned by
                    their positions (Su et al. 2021); ``"none"`` no position information at all
==================  ======================================================================

A config the code cannot build is refused before any tensor is made, with one line that names
the field and what it allows. ``to_dict`` leaves out the family fields at their defaults, so the
config.json of a model of chapters 1-9 reads as it always has.
"""

from __future__ import annotations


#: the position schemes, each with what it does (``ModelConfig.positions``)
POSITIONS = {
    "sinusoidal-qk": "fixed sinusoids added to the query and key inputs only",
    "learned": "learned positions added to the residual stream",
    "rotary": "queries and keys turned by their positions",
    "none": "no position information",
}
#: the MLPs' activations (``ModelConfig.act_fn``)
ACT_FNS = ("gelu", "relu")
#: the fields beyond the attention-only model's, with the values that make it
FAMILY_DEFAULTS = {"positions": "sinusoidal-qk", "d_mlp": 0, "layernorm": False, "act_fn": "gelu", "biases": False}



def divisors(n: int) -> str:
    """The divisors of ``n``, for a message: ``"1, 2, 4, 8"``."""
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
