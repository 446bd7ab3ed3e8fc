"""What the benchmark scripts share: the timing loop, the common command-line options, the model.

The scripts import this as ``from _common import ...``, which works when they are run directly
(``python benchmarks/bench_x.py`` puts ``benchmarks/`` first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import time

import torch

from attncircuits import Transformer, load_pretrained


def best_of(fn, repeats: int) -> tuple[float, float, object]:
    """Best wall-clock and best CPU (process, all threads) seconds over ``repeats`` runs, and the last result.

    On a busy machine the wall clock includes time spent waiting for a core; the CPU time does
    not, and with ``--threads 1`` it is what the step takes on an idle core."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return wall, cpu, out


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first line, with ``--repeats`` and ``--threads``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    return p


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU threads to ``--threads`` when it was given."""
    if args.threads:
        torch.set_num_threads(args.threads)


def load_model(name: str) -> Transformer:
    """The shipped model ``name`` (``attn-only-0l``, ``-1l`` or ``-2l``)."""
    return load_pretrained(name).model
