"""What the training loop no longer does per step: convert and scan the whole token stream when a
batch is drawn, and check the batch again in the forward pass. Times ``make_batch`` (checks the
stream, as every step did before) against ``make_batch_checked`` (the stream checked once), and
the token check the forward pass used to run on every batch. One thread; a stream as long as the
shipped training split (3.6M uint16 ids). Usage: ``python benchmarks/bench_train_step_checks.py``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from attncircuits import ModelConfig, Transformer
from attncircuits.core import validate
from attncircuits.train import TrainConfig, make_batch, make_batch_checked


def per_call_ms(fn, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    cfg = TrainConfig()
    model = Transformer(ModelConfig(n_layers=2))
    n_ctx, d_vocab = model.cfg.n_ctx, model.cfg.d_vocab
    stream_np = np.random.default_rng(0).integers(1, d_vocab, 3_633_287).astype(np.uint16)
    stream = validate.token_ids(stream_np, d_vocab, "train_tokens", ndim=1)
    g = torch.Generator().manual_seed(0)
    batch = make_batch_checked(stream, cfg, n_ctx, g, d_vocab)
    old = per_call_ms(lambda: make_batch(stream_np, cfg, n_ctx, g))
    new = per_call_ms(lambda: make_batch_checked(stream, cfg, n_ctx, g, d_vocab))
    check = per_call_ms(lambda: validate.tokens(model, batch), reps=200)
    step = per_call_ms(lambda: torch.nn.functional.cross_entropy(model.forward_checked(batch)[:, :-1].flatten(0, 1),
                                                                 batch[:, 1:].flatten()).backward(), reps=5)
    print(f"{'per step':<44}{'ms':>8}")
    print(f"{'make_batch (stream checked every step)':<44}{old:>8.2f}")
    print(f"{'make_batch_checked (stream checked once)':<44}{new:>8.2f}")
    print(f"{'token check of the batch in forward':<44}{check:>8.2f}")
    print(f"{'forward + backward of the batch':<44}{step:>8.1f}")
    print(f"saved per step: {old - new + check:.2f} ms of {step + old:.1f} ms ({(old - new + check) / (step + old):.1%})")


if __name__ == "__main__":
    main()
