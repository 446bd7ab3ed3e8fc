"""Olsson et al.'s "smeared key" one-layer model: induction with a single layer (chapter 7).

A one-layer head cannot prefix-match because its key at position ``j`` holds only token ``j`` and
position ``j``, never the token before it. Olsson et al. (2022) let each head mix every key with
the key before it,

    k'_j = σ(α_h) k_j + (1 − σ(α_h)) k_{j−1}        (k'_0 = k_0, one learned α_h per head)

which hands the head "the token before the key" for free; such one-layer models then learn
induction heads, with a phase change, as two-layer models do.

Keys enter the scores linearly, so smearing keys is smearing the scores along the key axis:
``q · k'_j = σ (q · k_j) + (1 − σ) (q · k_{j−1})``. :class:`SmearedKeyTransformer` therefore runs the
unchanged :class:`~attncircuits.models.transformer.Transformer` once for its attention scores, smears
them, and runs it again with those patterns (the model's ``patterns=`` argument), so the model
code is not copied. This is exact for one layer, whose scores do not depend on any earlier head.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from attncircuits.core import validate
from attncircuits.data import repeated_rows
from attncircuits.models.transformer import ModelConfig
from attncircuits.models.parts import loss_fn
from attncircuits.models.transformer import Transformer

__all__ = ["SmearedKeyTransformer", "smear_scores", "train_on_repeated_tokens", "varied_repeats"]


def smear_scores(scores: Float[Tensor, "batch head q k"], weight: Float[Tensor, " head"]) -> Float[Tensor, "batch head q k"]:
    """``weight · S[q, j] + (1 − weight) · S[q, j − 1]`` per head (``S[q, −1] := S[q, 0]``), causal mask
    kept. Masked (``-inf``) entries are set aside first, so no ``inf − inf`` reaches the gradient."""
    masked = torch.isinf(scores)
    s = scores.masked_fill(masked, 0.0)
    prev = torch.cat([s[..., :1], s[..., :-1]], dim=-1)
    w = weight[None, :, None, None]
    return (w * s + (1 - w) * prev).masked_fill(masked, float("-inf"))


class SmearedKeyTransformer(nn.Module):
    """A one-layer :class:`Transformer` whose keys are smeared with the previous key."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.n_layers != 1:
            raise ValueError(
                f"the smeared-key model has exactly one layer (the chapter's point), got n_layers={cfg.n_layers}; "
                "use Transformer for deeper models"
            )
        self.cfg = cfg
        self.model = Transformer(cfg)
        self.smear_logit = nn.Parameter(torch.zeros(cfg.n_heads))  # σ(0) = 0.5: half own key, half previous

    @property
    def smear(self) -> Float[Tensor, " head"]:
        """``σ(α_h)``: the weight of each head's own key (1 = an ordinary head)."""
        return torch.sigmoid(self.smear_logit)

    def check_tokens(self, tokens) -> Int[Tensor, "batch pos"]:
        """As :meth:`Transformer.check_tokens` (so the losses of ``scores`` accept this model)."""
        return validate.tokens(self, tokens)

    def patterns(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch head q k"]:
        """The smeared attention patterns."""
        return self._patterns(validate.tokens(self, tokens))

    def _patterns(self, tokens: Tensor) -> Tensor:
        _, cache = self.model.forward_checked(tokens, return_cache=True)
        return smear_scores(cache.attn_scores[0], self.smear).softmax(-1)

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self.forward_checked(validate.tokens(self, tokens))

    def forward_checked(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab"]:
        """:meth:`forward` for checked tokens (see :meth:`Transformer.forward_checked`)."""
        pat = self._patterns(tokens)
        return self.model.forward_checked(tokens, patterns={(0, h): pat[:, h] for h in range(self.cfg.n_heads)})


def varied_repeats(batch_size: int, n_ctx: int, d_vocab: int, generator: torch.Generator, min_len: int = 6) -> Int[Tensor, "batch pos"]:
    """``[EOT]`` + a random sequence repeated to fill ``n_ctx``, its length drawn per batch from
    ``[min_len, n_ctx / 2)``: the varied lengths leave no fixed offset to attend to, so only
    content (prefix matching) predicts the repeats."""
    batch_size, min_len = validate.count(batch_size, "batch_size"), validate.count(min_len, "min_len")
    n_ctx = validate.count(n_ctx, "n_ctx", 2 * min_len + 2, why=f"lengths are drawn from min_len={min_len} to below n_ctx // 2")
    d_vocab = validate.count(d_vocab, "d_vocab", 2, why="token 0 is never drawn")
    length = int(torch.randint(min_len, n_ctx // 2, (1,), generator=generator))
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    return repeated_rows(batch_size, length, n_ctx // length + 1, d_vocab, seed)[:, :n_ctx]


def train_on_repeated_tokens(
    model: nn.Module, steps: int = 300, batch_size: int = 32, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """Train ``model`` (an :class:`Transformer` or a :class:`SmearedKeyTransformer`) for ``steps`` AdamW steps
    on :func:`varied_repeats`; returns the training loss of every step. Seconds on a CPU."""
    steps, batch_size = validate.count(steps, "steps"), validate.count(batch_size, "batch_size")
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(steps):
        batch = varied_repeats(batch_size, model.cfg.n_ctx, model.cfg.d_vocab, g).to(next(model.parameters()).device)
        loss = loss_fn(model.forward_checked(batch), batch)  # drawn here: valid ids, checked by construction
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses
