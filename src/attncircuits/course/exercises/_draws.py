"""Generated inputs the checks of several chapters share: small random models, token batches and
causal attention patterns, drawn from a :class:`~._contract.Draw` with the edges the exercises'
texts allow first (one head of width 1, one position, the whole context, one token repeated).

Part of the check machinery (see :mod:`._core`). Models are cached by their sizes and seed, so a
check builds each one once per session (the learner's function gets a copy of it).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import Tensor

from attncircuits.course.exercises._contract import Draw
from attncircuits.course.exercises._core import Case
from attncircuits.course.exercises._inputs import other_heads, random_model
from attncircuits.models.transformer import Transformer

__all__ = [
    "ablation_case", "causal_pattern", "head", "head_case", "head_sets", "model", "model_tokens", "pattern_case", "repeats",
    "tokens", "causal_rows", "copies",
]

MODEL_CASES = 8  # generated cases for a check whose inputs are models (every call gets a copy of the model)

# (d_model, n_heads, d_head, d_vocab, n_ctx): one head of width 1 over 3 tokens; 3 heads of 2; two
# heads of 8 over 7 tokens and 9 positions; d_model 2 (one sinusoid pair)
_EDGE_SIZES = ((4, 1, 1, 3, 4), (8, 3, 2, 5, 6), (16, 2, 8, 7, 9), (2, 2, 3, 4, 5))


@functools.lru_cache(maxsize=256)
def _cached(n_layers: int, d_model: int, n_heads: int, d_head: int, d_vocab: int, n_ctx: int, seed: int):
    return random_model(n_layers=n_layers, seed=seed, d_model=d_model, n_heads=n_heads, d_head=d_head,
                        d_vocab=d_vocab, n_ctx=n_ctx)


def model(draw: Draw, n_layers: int | tuple[int, int] = 1, min_ctx: int = 1, min_vocab: int = 2,
          edge: int | None = None) -> Transformer:
    """A small seeded random model; ``edge`` (an index into the edge sizes) or random sizes:
    d_model 2-16 (even: the sinusoids come in pairs), 1-3 heads of 1-8, 2-12 tokens, n_ctx 1-10.
    ``n_layers`` is a number or an inclusive range."""
    layers = n_layers if isinstance(n_layers, int) else draw.int(*n_layers)
    if edge is not None:
        d_model, n_heads, d_head, d_vocab, n_ctx = _EDGE_SIZES[edge % len(_EDGE_SIZES)]
    else:
        d_model, n_heads, d_head = 2 * draw.int(1, 8), draw.int(1, 3), draw.int(1, 8)
        d_vocab, n_ctx = draw.int(2, 12), draw.int(1, 10)
    return _cached(layers, d_model, n_heads, d_head, max(d_vocab, min_vocab), max(n_ctx, min_ctx),
                   draw.rng.randrange(1000))


def tokens(draw: Draw, d_vocab: int, n_ctx: int, edge: int | None = None, min_pos: int = 1) -> Tensor:
    """``[batch, pos]`` token ids, batch 1-2, pos ``min_pos`` .. ``n_ctx``; edges: one position, the
    whole context with the last id at the last position, one token repeated, two rows."""
    if edge == 0:
        return torch.full((1, max(1, min_pos)), d_vocab - 1)
    if edge == 1:
        out = torch.randint(0, d_vocab, (1, n_ctx), generator=draw.gen)
        out[0, -1] = d_vocab - 1
        return out
    if edge == 2:
        return torch.zeros(2, n_ctx, dtype=torch.long)
    return torch.randint(0, d_vocab, (draw.int(1, 2), draw.int(min(min_pos, n_ctx), n_ctx)), generator=draw.gen)


def causal_pattern(draw: Draw, batch: int, heads: int, n: int, edge: int | None = None, scale: float = 2.0) -> Tensor:
    """A ``[batch, heads, n, n]`` attention pattern: rows sum to 1 over the keys at or before the
    query. Edges: every query on its own token, every query on the first token (an [EOT] sink),
    every query on the previous token (the first on itself), uniform rows."""
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if edge in (0, 1, 2):
        keys = torch.arange(n) if edge == 0 else torch.zeros(n, dtype=torch.long) if edge == 1 else (
            torch.arange(n) - 1).clamp(min=0)
        one = torch.nn.functional.one_hot(keys, n).float()
        return one.expand(batch, heads, n, n).clone()
    if edge == 3:
        return (causal.float() / causal.sum(-1, keepdim=True)).expand(batch, heads, n, n).clone()
    scores = draw.randn(batch, heads, n, n, scale=scale).masked_fill(~causal, float("-inf"))
    return scores.softmax(-1)


def model_tokens(draw: Draw, n_layers: int | tuple[int, int] = 1, n_edges: int = 4, min_pos: int = 1,
                 min_ctx: int = 1, min_vocab: int = 2) -> tuple[Transformer, Tensor]:
    """A model and tokens for it: the first ``n_edges`` cases walk through the edge sizes and the
    edge token batches together (with ``n_layers`` a range, through its numbers of layers too)."""
    edge = draw.edge(n_edges)
    if edge is not None and not isinstance(n_layers, int):
        lo, hi = n_layers
        n_layers = lo + edge % (hi - lo + 1)
    m = model(draw, n_layers, min_ctx=max(min_ctx, min_pos), min_vocab=min_vocab, edge=edge)
    return m, tokens(draw, m.cfg.d_vocab, m.cfg.n_ctx, edge=edge, min_pos=min_pos)


def head(draw: Draw, n_heads: int, edge: int | None = None) -> int:
    """A head index: the first and the last head at the edges, else any."""
    if edge is not None:
        return 0 if edge % 2 == 0 else n_heads - 1
    return draw.rng.randrange(n_heads)


def pattern_case(draw: Draw):
    """A causal pattern ``[batch, head, q, k]`` (pos 2 or more: position 0 has no previous token);
    edges: every query on itself, on the first token, on the previous token, uniform rows, two
    positions, one row of the shipped context (4 heads x 128)."""
    edge = draw.edge(6)
    b, h, n = ((2, 3, 5), (1, 2, 4), (1, 1, 6), (2, 2, 3), (1, 1, 2), (1, 4, 128))[edge] if edge is not None else (
        draw.int(1, 2), draw.int(1, 4), draw.int(2, 10))
    return (causal_pattern(draw, b, h, n, edge if edge is not None and edge < 4 else None),)


def repeats(draw: Draw):
    """A pattern, ``[EOT]`` + copies of ``seq_len`` random tokens, and ``seq_len``; edges: one token
    copied twice, a token twice inside one copy (two keys match), attention exactly on the token
    after each earlier copy, uniform attention, batch 1 and one head."""
    edge = draw.edge(5)
    L, R, b, h = ((1, 2, 1, 2), (4, 2, 2, 1), (3, 4, 1, 2), (2, 3, 2, 2), (5, 2, 1, 1))[edge] if edge is not None else (
        draw.int(1, 6), draw.int(2, 4), draw.int(1, 2), draw.int(1, 3))
    seq = torch.randint(1, 9, (b, L), generator=draw.gen)
    note = ""
    if edge == 1:
        seq[:, 2] = seq[:, 0]
        note = "a token comes twice in each copy"
    tokens = torch.cat([torch.zeros(b, 1, dtype=torch.long), seq.repeat(1, R)], 1)
    n = tokens.shape[1]
    pattern = causal_pattern(draw, b, h, n, 3 if edge == 3 else None)
    if edge == 2:  # the induction stripe: query q on key q - L + 1
        keys = torch.arange(n)
        keys[1 + L:] -= L - 1
        pattern = torch.nn.functional.one_hot(keys, n).float().expand(b, h, n, n).clone()
        note = "each later query attends to the token after its earlier copy"
    return Case(note, (pattern, tokens, L))


def ablation_case(draw: Draw) -> Case:
    """A model of 1-3 layers, tokens (pos 2 or more), a head and a mode; edges: head (0, 0) and
    the last head of the last layer, both modes, one row of tokens."""
    edge = draw.edge(4)
    m, t = model_tokens(draw, (1, 3), min_pos=2)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    pair = ((0, 0), (L - 1, H - 1))[edge % 2] if edge is not None else (draw.rng.randrange(L), draw.rng.randrange(H))
    mode = ("zero", "mean")[edge // 2] if edge is not None else draw.choice(("zero", "mean"))
    args = (m, t, pair, mode)
    return Case("", args, others=other_heads(args, 2, [(l, h) for l in range(L) for h in range(H)]))


def head_case(draw: Draw, n_layers: int = 1, label: str = "head {}") -> Case:
    """A model, tokens and a head of its last layer (the first and the last head at the edges),
    with the other heads as neighbours."""
    m, t = model_tokens(draw, n_layers)
    args = (m, t, head(draw, m.cfg.n_heads, draw.edge(4)))
    return Case("", args, others=other_heads(args, 2, m.cfg.n_heads, label))


@functools.lru_cache(maxsize=64)
def _copying(base: Transformer) -> Transformer:
    """``base`` with W_U = W_E^T, its layer-0 heads copying (W_O = W_V^T) and its later heads
    suppressing (W_O = -W_V^T): accuracies far apart, where a random model's are all near 0."""
    m = copy.deepcopy(base)
    with torch.no_grad():
        m.W_U.copy_(m.W_E.T)
        for layer, block in enumerate(m.blocks):
            block.W_O.copy_(block.W_V.transpose(-1, -2) * (1 if layer == 0 else -1))
    return m


def head_sets(draw: Draw):
    """A model whose layer-0 heads copy and later heads suppress, and a list of its heads; edges:
    one head of a one-layer model, every head of two layers, the last head alone, every layer-0
    head of two layers."""
    edge = draw.edge(4)
    m = _copying(model(draw, 1 if edge == 0 else 2, edge=edge, min_vocab=16))
    every = [(l, h) for l in range(m.cfg.n_layers) for h in range(m.cfg.n_heads)]
    if edge is not None:
        return m, (every[:1], every, every[-1:], every[: m.cfg.n_heads])[edge]
    return m, sorted(draw.rng.sample(every, draw.int(1, len(every))))


def causal_rows(pattern: Tensor, *_) -> bool:
    """Whether ``pattern [..., q, k]`` is a causal attention pattern: nothing above the diagonal,
    each row summing to 1 (an identity the pattern exercises' texts state)."""
    n = pattern.shape[-1]
    upper = ~torch.ones(n, n, dtype=torch.bool).tril()
    return bool(pattern[..., upper].abs().max() < 1e-6 if upper.any() else True) and bool(
        torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-4))


def copies(tokens: Tensor, seq_len: int) -> bool:
    """Whether ``tokens [batch, pos]`` is one start token and copies of its first ``seq_len`` after it."""
    rest = tokens[:, 1:]
    if rest.shape[1] % seq_len:
        return False
    return bool((rest.reshape(len(rest), -1, seq_len) == rest[:, None, :seq_len]).all())
