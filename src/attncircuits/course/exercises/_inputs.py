"""Inputs for the checks' cases: the shipped models (restored when anything edited them), seeded
random models and tokens, and the neighbouring heads a wrong answer may belong to.

Part of the check machinery (see :mod:`._core`).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor

from attncircuits.checkpoints.pretrained import load_pretrained
from attncircuits.models.transformer import ModelConfig
from attncircuits.models.transformer import Transformer

__all__ = ["other_heads", "random_model", "random_tokens", "shipped"]


def other_heads(args: tuple, index: int, n: int, label: str = "head {}") -> Callable[[], list[tuple[str, tuple]]]:
    """``Case.others`` for a head argument at position ``index`` of ``args``: the same call on each
    other head ``0 .. n - 1`` (or, for a ``(layer, head)`` pair, each other pair of ``n`` layers x
    the model's heads is not guessed: pass the pairs). When the learner's answer is the reference's
    on one of them, the message says so ("this is head 2's answer")."""

    def others():
        here = args[index]
        out = []
        for h in range(n) if not isinstance(n, (list, tuple)) else n:
            if h != here:
                out.append((label.format(h if not isinstance(h, tuple) else ".".join(map(str, h))),
                            args[:index] + (h,) + args[index + 1 :]))
        return out

    return others


@functools.lru_cache(maxsize=None)
def _loaded(name: str):
    ckpt = load_pretrained(name)
    return ckpt, {k: v.detach().clone() for k, v in ckpt.model.state_dict().items()}, ckpt.model.cfg.to_dict()


def shipped(name: str):
    """A shipped checkpoint (``attn-only-0l``, ``-1l`` or ``-2l``), loaded once per session.

    Before it is handed out its weights and config are compared with the copy kept at loading (a
    few milliseconds), and restored when anything changed them: a learner's code that edits the
    model a check uses cannot make later checks fail."""
    ckpt, state, cfg = _loaded(name)
    model = ckpt.model
    try:
        now = model.state_dict()
        intact = (model.cfg.to_dict() == cfg and now.keys() == state.keys()
                  and all(now[k].shape == v.shape and torch.equal(now[k], v) for k, v in state.items()))
    except Exception:
        intact = False
    if not intact:
        _loaded.cache_clear()
        ckpt = _loaded(name)[0]
    ckpt.model.eval()
    for param in ckpt.model.parameters():
        param.requires_grad_(False)
    return ckpt


def random_model(n_layers: int = 1, seed: int = 0, **config) -> Transformer:
    """A small model with seeded random weights (default sizes: d_model 32, 4 heads of 8, 64
    tokens, n_ctx 16); keyword arguments override :class:`ModelConfig` fields."""
    sizes = dict(d_model=32, n_heads=4, d_head=8, d_vocab=64, n_ctx=16)
    sizes.update(config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Transformer(ModelConfig(n_layers=n_layers, **sizes)).eval()


def random_tokens(d_vocab: int, shape: tuple[int, ...], seed: int = 0) -> Tensor:
    """Seeded uniformly random token ids of the given shape (a long tensor)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, d_vocab, shape, generator=gen)

