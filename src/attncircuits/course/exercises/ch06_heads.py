"""Exercise 6.3's check, finding the induction heads of any model: the models it is run on (the
shipped model with an empty layer inserted or appended, so that looking at one layer only does not
pass) and the comparison that names what a wrong list of heads missed."""

from __future__ import annotations

import functools

import torch

from attncircuits.analysis import definitions as D, losses, scores
from attncircuits.analysis.scores import induction_heads
from attncircuits.course.exercises._core import Case, Draw, random_model
from attncircuits.models import handbuilt
from attncircuits.models.transformer import ModelConfig, Transformer


def with_empty_layer(model: Transformer, at: int) -> Transformer:
    """``model`` with an empty layer put in at index ``at`` (heads that write nothing and attend
    uniformly): the same circuit, its heads after ``at`` one layer further down. At 1, the shipped
    model's induction heads move to layer 2; at its depth, they are no longer in the last layer."""
    cfg = ModelConfig(**{**model.cfg.to_dict(), "n_layers": model.cfg.n_layers + 1})
    deep = Transformer(cfg).eval()
    with torch.no_grad():
        deep.W_E.copy_(model.W_E)
        deep.W_U.copy_(model.W_U)
        for name, _ in deep.blocks[at].named_parameters():
            getattr(deep.blocks[at], name).zero_()
        for old in range(model.cfg.n_layers):
            deep.blocks[old + (old >= at)].load_state_dict(model.blocks[old].state_dict())
    return deep


def compare_heads(got, expected, case) -> str | None:
    try:
        got_list = sorted((int(l), int(h)) for l, h in got)
    except (TypeError, ValueError):
        return f"return a list of (layer, head) pairs, got {got!r}"
    if got_list == sorted(expected):
        return None
    if got_list == sorted((h, l) for l, h in expected):
        return f"you returned (head, layer) pairs {got_list}: each pair is (layer, head)"
    if any(l > 1 for l, _ in expected) and all(l == 1 for l, _ in got_list):
        return (f"you looked only at layer 1 ({got_list}); this model's induction heads are in layer 2: "
                "score every layer's heads")
    model = case.args[0]
    cfg = model.cfg
    threshold = case.args[1] if len(case.args) > 1 else D.INDUCTION_HEAD.value
    last = cfg.n_layers - 1
    if any(l == 0 for l, _ in expected) and got_list == sorted(e for e in expected if e[0] > 0):
        return (f"you left out layer 0's heads ({', '.join(f'{l}.{h}' for l, h in expected if l == 0)} score above "
                f"{threshold} here): score every layer's heads, layer 0's too")
    if any(l < last for l, _ in expected) and got_list == sorted(e for e in expected if e[0] == last):
        return (f"you looked only at the last layer (layer {last}); this model's induction heads are in layer "
                f"{', '.join(sorted({str(l) for l, _ in expected if l < last}))}: score every layer's heads")
    if threshold != D.INDUCTION_HEAD.value and got_list == sorted(induction_heads(model)):
        return (f"these are the heads above {D.INDUCTION_HEAD.value:g}; this case passes threshold={threshold}: "
                f"compare the scores with the threshold argument, not a fixed {D.INDUCTION_HEAD.value:g}")
    if any(not (0 <= l < cfg.n_layers and 0 <= h < cfg.n_heads) for l, h in got_list):
        layers = "one layer, layer 0" if cfg.n_layers == 1 else f"layers 0-{cfg.n_layers - 1}"
        return (f"you returned {got_list}, but this model has {layers}, with heads 0-{cfg.n_heads - 1}: "
                "score the heads of the model you are given")
    pm = scores.prefix_matching_scores(model, batch_size=8)
    extra = sorted(set(got_list) - set(expected))
    missing = sorted(set(expected) - set(got_list))
    if extra:
        prev = scores.previous_token_scores(model, losses.repeated_tokens(model, 25, 4, batch_size=4))
        if all(prev[l, h] > max(0.2, pm[l, h]) for l, h in extra):
            return (f"you returned {got_list}: {', '.join(f'{l}.{h}' for l, h in extra)} attend to the previous "
                    f"token (previous-token score {', '.join(f'{prev[l, h]:.2f}' for l, h in extra)}), so they "
                    "are previous-token heads: find induction heads by prefix matching, not previous-token attention")

    def listed(heads):
        return ", ".join(f"{l}.{h} ({pm[l, h]:.2f})" for l, h in heads)

    if extra and not missing:
        return (f"you also returned heads whose prefix-matching score is below {threshold}: {listed(extra)}; "
                "keep only the heads above the threshold")
    if missing and not extra:
        return (f"you left out heads whose prefix-matching score is above {threshold}: {listed(missing)}; "
                "keep every head above the threshold")
    return (f"expected {sorted(expected)}, got {got_list} (the heads whose prefix-matching score is above "
            f"{threshold}; yours score {listed(got_list) or 'nothing'})")


@functools.lru_cache(maxsize=None)
def smaller_induction(deeper: bool) -> Transformer:
    model = handbuilt.induction_model(handbuilt.Layout(d_vocab=64, n_pos_pairs=12))
    return with_empty_layer(model, 1) if deeper else model


def more_models(draw: Draw):
    """A smaller hand-built induction model with an empty layer 1 (its induction head in layer 2);
    a random three-layer model of one head per layer."""
    if draw.i == 0:
        return Case("a 64-token hand-built induction model, its induction head in layer 2", (smaller_induction(True),))
    return (random_model(n_layers=3, seed=draw.i, n_heads=1, d_head=8, d_model=16, d_vocab=64, n_ctx=128),)
