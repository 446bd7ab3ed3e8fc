"""Chapter 10's measures for models with LayerNorm and MLPs: ablation hooks, the logit split into
its writers with the final LayerNorm's scale frozen, the attention-only path expansion's gap, and
TransformerLens's own head detector to compare the course's with.

The course's detectors (:mod:`attncircuits.analysis.scores`) and composition scores
(:mod:`attncircuits.analysis.circuits`) run on these models as on every other, through the one
model interface: LayerNorm is folded into the weights that read the residual stream
(``model.folded()``) before any weight is read. Where the logits are split into paths, the final
LayerNorm's scale is frozen at its real value, as TransformerLens's ``decompose_resid`` does: the
only sense in which a model with LayerNorm is a sum of paths. Chapter 10's model is a member of the
family (LayerNorm, MLPs, biases), so all of this reads the course's own cache; TransformerLens 4
appears only for its head detector, on the model's bridge (:func:`with_tokenizer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from einops import einsum

from attncircuits.core import validate
from attncircuits.core.heads import head_name
from attncircuits.models.parts import loss_fn
from attncircuits.models.hooked import require_transformer_lens
from attncircuits.models.interop import to_transformer_lens

if TYPE_CHECKING:  # pragma: no cover
    from transformer_lens.model_bridge import TransformerBridge


def with_tokenizer(model, tokenizer) -> "TransformerBridge":
    """``model`` in TransformerLens 4 (a ``TransformerBridge``, chapter 9) with ``tokenizer``
    attached, so TransformerLens's string methods and head detector take text."""
    return to_transformer_lens(model, tokenizer=tokenizer)


def detector_scores(tl_model, texts: list[str], kind: str) -> torch.Tensor:
    """TransformerLens's head detector (``detect_head``) averaged over ``texts``, ``[layer, head]``:
    ``kind`` is ``"previous_token_head"`` or ``"induction_head"``. ``tl_model`` is a bridge with a
    tokenizer (:func:`with_tokenizer`); each text must fit the context."""
    require_transformer_lens()
    from transformer_lens.head_detector import detect_head

    if kind not in ("previous_token_head", "induction_head", "duplicate_token_head"):
        raise ValueError(f"kind must be 'previous_token_head', 'induction_head' or 'duplicate_token_head', got {kind!r}")
    if getattr(tl_model, "tokenizer", None) is None:
        raise ValueError("the model has no tokenizer: give the bridge with_tokenizer(model, tokenizer) returns")
    return torch.stack([detect_head(tl_model, text, kind) for text in texts]).mean(0)


def head_ablation(model, heads, means: dict[int, torch.Tensor] | None = None) -> dict:
    """The ``ablate=`` argument that removes ``heads`` (``(layer, head)`` pairs): each head's output
    is replaced by what its mean ``z`` (``means[layer][head]``, :func:`mean_z`) writes through its
    ``W_O`` (mean ablation), or by zero. Pass it to the model, or to ``Q.measure(..., ablate=...)``."""
    heads = validate.heads(model, heads)
    out = {}
    for layer, head in heads:
        if means is None:
            out[(layer, head)] = 0.0
        else:
            written = means[layer][head] @ model.W_O[layer, head]  # [d_model]
            out[(layer, head)] = lambda old, w=written: w.to(old).expand_as(old)
    return out


@torch.no_grad()
def mean_z(model, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every head's mean ``z`` over ``tokens`` (rows and positions), ``{layer: [head, d_head]}``:
    what mean ablation puts in a removed head's place."""
    _, cache = model.run_with_cache(tokens)
    return {layer: z.mean(dim=(0, 1)) for layer, z in enumerate(cache.z)}


@dataclass
class LogitShares:
    """Where the correct token's logit comes from, each a mean over the targets scored."""

    labels: list[str]  # "embed", "pos", "0.1" (a head), "mlp 0" (b_out included), "bias" (the b_O), "b_U"
    contributions: torch.Tensor  # [component]: mean contribution to the correct token's logit
    # the mean correct-token logit itself, measured from the mean logit over the vocabulary (folding
    # centres W_U, which changes no probability): the contributions' sum, LN scale frozen
    logit: float

    def share(self, label: str) -> float:
        return float(self.contributions[self.labels.index(label)] / self.logit)

    def group(self, prefix: str) -> float:
        """Summed share of the components whose label starts with ``prefix`` (``"mlp"``)."""
        return float(sum(c for l, c in zip(self.labels, self.contributions) if l.startswith(prefix)) / self.logit)

    def direct(self) -> float:
        """Share of the direct path: the token (and, where they are in the residual stream, the
        position) embeddings read straight by the unembedding."""
        return float(sum(c for l, c in zip(self.labels, self.contributions) if l in ("embed", "pos")) / self.logit)

    def heads(self) -> float:
        """Summed share of every head (labels ``"layer.head"``)."""
        return float(sum(c for l, c in zip(self.labels, self.contributions) if l[:1].isdigit()) / self.logit)


def frozen_ln(components: torch.Tensor, resid: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Each of ``components`` (``[comp, ..., d_model]``, summing to ``resid``) through a LayerNorm
    whose scale is frozen at the real one (``LNPre``, the gain folded away): ``(c - mean c) / s``
    with ``s = sqrt(mean((resid - mean resid)^2) + eps)``, one ``s`` for all components. Centring is
    linear, and a shared divisor keeps it so: the outputs sum to ``LN(resid)`` exactly, which the
    components' own scales would not give (TransformerLens's ``apply_ln_to_stack``)."""
    centred = resid - resid.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return (components - components.mean(-1, keepdim=True)) / scale


def fold_ln_into(w_ln: torch.Tensor, b_ln: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold a LayerNorm's gain ``w_ln`` and bias ``b_ln`` (``[d_model]``) into a weight that reads
    its output, ``W [..., d_model, d_out]`` with bias ``b [..., d_out]``: ``(x̂ w + b_ln) W + b =
    x̂ (diag(w) W) + (b_ln W + b)``; the folded weight is then centred over ``d_model``, since ``x̂``
    (normalised, mean zero) has no component along the all-ones direction (TransformerLens's
    ``fold_ln`` with ``center_weights``)."""
    W_folded = w_ln[:, None] * W
    b_folded = b + einsum(b_ln, W, "d_model, ... d_model d_out -> ... d_out")
    return W_folded - W_folded.mean(-2, keepdim=True), b_folded


def writers(fm, tokens: torch.Tensor):
    """The final residual stream of ``fm`` split into its writers, ``([comp, batch, pos, d_model],
    labels, resid)``: the token embedding (and the positions where they are in the stream), each
    head without ``b_O`` (a folded model's value biases are in it), each MLP, and the layers' ``b_O``
    as one "bias"; the components sum to ``resid``."""
    _, cache = fm.run_with_cache(tokens)
    c = fm.cfg
    embed = fm.W_E[tokens]
    heads = torch.cat([out.permute(2, 0, 1, 3) for out in cache.head_out]) if c.n_layers else embed[None, :0]
    head_labels = [head_name(l, h) for l in range(c.n_layers) for h in range(c.n_heads)]
    mlps = torch.stack(cache.mlp_out) if c.d_mlp and c.n_layers else heads[:0]
    bias = (fm.b_O.sum(0) if c.biases and c.n_layers else torch.zeros(c.d_model)).expand_as(embed)
    # positions reach the residual stream only where they are learned (else queries and keys, or none)
    direct = [("embed", embed)]
    if c.positions == "learned":
        direct.append(("pos", fm.W_pos[: tokens.shape[1]].expand_as(embed)))
    stack = torch.cat([torch.stack([d for _, d in direct]), heads, mlps, bias[None]])
    labels = [name for name, _ in direct] + head_labels + [f"mlp {l}" for l in range(len(mlps))] + ["bias"]
    return stack, labels, cache.resid[-1]


def _components(fm, tokens: torch.Tensor):
    """:func:`writers`, each through the final LayerNorm with the scale frozen, and their labels."""
    stack, labels, resid = writers(fm, tokens)
    return frozen_ln(stack, resid, fm.ln_final.eps), labels


def _unembedding(fm):
    """``W_U`` and ``b_U`` centred over the vocabulary (which changes no probability): logits
    measured from their mean, as TransformerLens's ``center_unembed`` gives them."""
    b_U = fm.b_U if fm.b_U is not None else torch.zeros(fm.cfg.d_vocab)
    return fm.W_U - fm.W_U.mean(-1, keepdim=True), b_U - b_U.mean()


@torch.no_grad()
def logit_shares(model, tokens: torch.Tensor) -> LogitShares:
    """Decompose the correct next token's logit into the direct path (token and position
    embeddings), each head, each MLP and the biases, with the final LayerNorm's scale frozen at its
    real value (:func:`frozen_ln`, TransformerLens's ``decompose_resid`` and
    ``apply_ln_to_stack``): an exact sum in the frozen-scale sense, the only one a model with
    LayerNorm allows."""
    fm = model.folded()
    tokens = validate.tokens(fm, tokens, 2, "a next-token logit (a token to predict)")
    scaled, labels = _components(fm, tokens)
    scaled = scaled[:, :, :-1]  # [comp, batch, pos-1, d_model]: positions with a next token
    W_U, b_U = _unembedding(fm)
    directions = W_U[:, tokens[:, 1:]]  # [d_model, batch, pos-1]
    contrib = einsum(scaled, directions, "c b p d, d b p -> c b p").mean(dim=(1, 2))
    b_U = b_U[tokens[:, 1:]].mean()
    return LogitShares(labels + ["b_U"], torch.cat([contrib, b_U[None]]), float(contrib.sum() + b_U))


@dataclass
class ExpansionGap:
    """How far the attention-only path expansion (direct path + heads, no MLP terms) is from the
    real logits of a model with MLPs, on the same tokens (nats per token; logits scaled alike)."""

    loss: float  # the folded model's next-token loss (the model's own only where folding is exact)
    loss_attention_only: float  # the loss of the frozen-scale sum without the MLP terms
    loss_direct: float  # the loss of the direct path alone (embeddings, biases)
    logit_error: float  # mean |attention-only logit - real logit| / mean |real logit - its mean|
    reconstruction_error: float  # max |sum of every term - real logit|: the frozen-scale sum is exact


@torch.no_grad()
def attention_only_gap(model, tokens: torch.Tensor) -> ExpansionGap:
    """Chapters 3 and 5's path expansion, applied to a model with MLPs: the frozen-scale sum of the
    embeddings, every head and the biases (:func:`logit_shares`' terms without the MLPs), against
    the real logits. Heads still read what earlier MLPs wrote; only the MLPs' direct paths go."""
    fm = model.folded()
    tokens = validate.tokens(fm, tokens, 2, "a next-token loss (a token to predict)")
    scaled, labels = _components(fm, tokens)
    keep = torch.tensor([not lab.startswith("mlp") for lab in labels])
    direct = torch.tensor([lab in ("embed", "pos", "bias") for lab in labels])  # and the biases
    W_U, b_U = _unembedding(fm)
    real = fm(tokens)
    real = real - real.mean(-1, keepdim=True)  # logits from their mean, as the terms measure them
    logits = {name: scaled[mask].sum(0) @ W_U + b_U for name, mask in
              (("all", torch.ones_like(keep)), ("attn", keep), ("direct", direct))}
    centred = real - real.mean(-1, keepdim=True)
    error = ((logits["attn"] - real) - (logits["attn"] - real).mean(-1, keepdim=True)).abs().mean() / centred.abs().mean()
    return ExpansionGap(
        loss=float(loss_fn(real, tokens)), loss_attention_only=float(loss_fn(logits["attn"], tokens)),
        loss_direct=float(loss_fn(logits["direct"], tokens)), logit_error=float(error),
        reconstruction_error=float((logits["all"] - real).abs().max()),
    )


def loss_bump(values) -> float:
    """The largest rise of a loss curve above its lowest value so far (0 when it never rises):
    ``max_j (v_j - min_{i<=j} v_i)``. A phase change that costs loss for a while shows as a bump;
    a curve that only falls gives 0. Missing values (``None``) are skipped."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        raise ValueError("values is empty: pass a loss curve (e.g. history['val_loss'])")
    best, bump = vals[0], 0.0
    for v in vals:
        best = min(best, v)
        bump = max(bump, v - best)
    return bump


def rank_correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman's rank correlation of two score tables of the same shape (e.g. ``[layer, head]``):
    the Pearson correlation of their ranks."""
    if x.shape != y.shape or x.numel() < 2:
        raise ValueError(f"need two score tables of one shape with 2+ entries, got {tuple(x.shape)} and {tuple(y.shape)}")
    rx, ry = (t.flatten().argsort().argsort().double() for t in (x, y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))
