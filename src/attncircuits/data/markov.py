"""In-context Markov chains (chapter 13; Edelman et al. 2024): the simplest task with an induction
head for its best solution.

Every sequence has its own Markov chain over ``k`` symbols: each row of its transition matrix is
drawn from a symmetric Dirichlet prior with concentration ``alpha``, the first symbol is uniform,
and the rest follow the chain. A model that has seen a prefix can do no better than the Bayesian
posterior mean of the next symbol's distribution, and three predictors of rising skill are exact
(:meth:`MarkovChains.predictors`), each a posterior mean under the same prior:

- ``uniform``: ``1 / k``, what a model that reads nothing can do;
- ``unigram``: ``(n_j + alpha) / (t + k alpha)`` after ``t`` symbols of which ``n_j`` are ``j``:
  the symbols counted, order ignored (a head attending evenly to the prefix and copying);
- ``bigram``: ``(n_{a j} + alpha) / (n_a + k alpha)`` where ``a`` is the current symbol, ``n_{a j}``
  counts the transitions ``a -> j`` in the prefix and ``n_a`` those out of ``a``: the Bayes-optimal
  predictor of this task, a *statistical induction head* (attend to the tokens right after earlier
  copies of the current one, and copy them).

Everything is vectorised over the batch; a batch of 64 sequences of 100 costs about a millisecond.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

__all__ = ["MarkovChains", "PREDICTORS", "kl_to", "cross_entropy"]

PREDICTORS = ("uniform", "unigram", "bigram")


@dataclass(frozen=True)
class MarkovChains:
    """Sequences of ``length`` symbols from ``k``, each from its own chain (rows ~ Dirichlet(``alpha``))."""

    k: int = 3
    length: int = 50  # chapter 13's: long enough for the bigram to beat the unigram by 0.12 nats
    alpha: float = 1.0
    kind: str = "markov"

    def __post_init__(self):
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 2:
            raise ValueError(f"MarkovChains.k must be a whole number of symbols >= 2 (one symbol has nothing to predict), got {self.k!r}")
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 3:
            raise ValueError(f"MarkovChains.length must be a whole number >= 3 (a transition seen before the one to predict), "
                             f"got {self.length!r}")
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a <= 0:
            raise ValueError(f"MarkovChains.alpha must be a finite number > 0 (the Dirichlet prior's concentration; 1 is uniform "
                             f"over transition rows), got {a!r}")

    def sample(self, n: int, seed: int = 0) -> tuple[Int[Tensor, "batch pos"], Float[Tensor, "batch k k"]]:
        """``n`` sequences ``[n, length]`` and the transition matrix of each ``[n, k, k]``
        (``P[b, a, j]``: the chance that ``j`` follows ``a`` in sequence ``b``)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a whole number of sequences >= 1, got {n!r}")
        rng = np.random.default_rng(int(seed))
        P = rng.dirichlet(np.full(self.k, float(self.alpha)), size=(n, self.k))  # [n, k, k]
        cum = np.cumsum(P, axis=-1)
        u = rng.random((n, self.length))
        x = np.empty((n, self.length), dtype=np.int64)
        x[:, 0] = rng.integers(self.k, size=n)
        rows = np.arange(n)
        for t in range(1, self.length):  # the next symbol: the first j whose cumulative chance passes u
            x[:, t] = np.minimum((u[:, t, None] > cum[rows, x[:, t - 1]]).sum(-1), self.k - 1)
        return torch.from_numpy(x), torch.from_numpy(P).float()

    def predictors(self, tokens: Int[Tensor, "batch pos"]) -> dict[str, Float[Tensor, "batch pos k"]]:
        """Each predictor's distribution of the symbol after every position (entry ``[b, t]``
        predicts ``tokens[b, t + 1]`` from ``tokens[b, :t + 1]``)."""
        tokens = self.check_tokens(tokens)
        b, n = tokens.shape
        k, a = self.k, float(self.alpha)
        seen = torch.nn.functional.one_hot(tokens, k).double().cumsum(1)  # [b, t, k]: counts up to t
        t = torch.arange(1, n + 1, dtype=torch.float64)[None, :, None]
        pairs = torch.zeros(b, n, k * k, dtype=torch.float64)  # transitions seen before position t
        pairs[:, 1:] = torch.nn.functional.one_hot(tokens[:, :-1] * k + tokens[:, 1:], k * k).double().cumsum(1)
        rows = pairs.view(b, n, k, k).gather(2, tokens[:, :, None, None].expand(b, n, 1, k))[:, :, 0]  # [b, t, k]
        return {
            "uniform": torch.full((b, n, k), 1.0 / k),
            "unigram": ((seen + a) / (t + k * a)).float(),
            "bigram": ((rows + a) / (rows.sum(-1, keepdim=True) + k * a)).float(),
        }

    def check_tokens(self, tokens) -> Tensor:
        if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype != torch.int64:
            raise TypeError(f"tokens must be an int64 tensor [batch, pos], as sample() gives, got {type(tokens).__name__}")
        if tokens.shape[1] < 2:
            raise ValueError(f"tokens need at least 2 positions (one to predict), got {tokens.shape[1]}")
        if bool(((tokens < 0) | (tokens >= self.k)).any()):
            raise ValueError(f"tokens must be symbols 0..{self.k - 1} of this task (k={self.k})")
        return tokens

    def describe(self) -> str:
        return (f"in-context Markov chains: {self.k} symbols, sequences of {self.length}, each with its own transition "
                f"matrix (rows ~ Dirichlet({self.alpha:g}))")


def cross_entropy(probs: Float[Tensor, "batch pos k"], tokens: Int[Tensor, "batch pos"]) -> float:
    """Mean loss (nats) of ``probs`` on the next symbol, over every position that has one."""
    p = probs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    return float(-p.clamp_min(1e-30).log().mean())


def kl_to(reference: Float[Tensor, "batch pos k"], logprobs: Float[Tensor, "batch pos k"]) -> float:
    """Mean ``KL(reference || model)`` (nats) over every position that predicts a symbol: how much
    more the model pays than ``reference`` would if the next symbol came from ``reference``."""
    ref = reference[:, :-1].double()
    return float((ref * (ref.clamp_min(1e-30).log() - logprobs[:, :-1].double())).sum(-1).mean())
