"""What HeadWatch costs: a plain PyTorch loop training chapter 7's live 2-layer model, timed with
and without the callback at its default interval (``every=100``). One thread, as the live run.

Two measures: the two runs' wall times (which other work on the machine disturbs), and, within the
watched run, the time spent inside the callback as a share of the time spent training (both
parts slowed alike by other work, so this one holds on a busy machine too)."""

import time

import torch

from attncircuits.data import repeated_rows
from attncircuits.models.parts import loss_fn
from attncircuits.train.live import live_configs
from attncircuits.train.watch import HeadWatch

STEPS = 600


def run(watch: bool) -> tuple[float, float]:
    torch.manual_seed(0)
    mcfg, _ = live_configs()
    model = mcfg.build()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    w = HeadWatch(model, display="none") if watch else None
    inside = 0.0
    t0 = time.perf_counter()
    for step in range(STEPS):
        toks = repeated_rows(16, 21, 3, mcfg.d_vocab, seed=step)
        loss = loss_fn(model(toks), toks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if w is not None:
            t1 = time.perf_counter()
            w(step)
            inside += time.perf_counter() - t1
    return time.perf_counter() - t0, inside


if __name__ == "__main__":
    torch.set_num_threads(1)
    base = min(run(False)[0] for _ in range(2))
    watched, inside = min(run(True) for _ in range(2))
    print(f"{STEPS} steps: {base:.1f} s without HeadWatch, {watched:.1f} s with it (every=100): "
          f"{100 * (watched / base - 1):+.1f}%; inside the callback {inside:.2f} s, "
          f"{100 * inside / (watched - inside):.1f}% of the training time of the same run")
