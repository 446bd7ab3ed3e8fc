"""``python -m attncircuits.train.family`` (``make family [SEED=n]``): the command line of
:mod:`attncircuits.train.family`, each argument checked in one line before anything runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attncircuits.train import cluster, family, replicate


def _whole(lo: int, hi: int):
    """An argparse type: a whole number in [lo, hi], else one line saying what is allowed."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from {lo:,} to {hi:,}")
        return value
    return parse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attncircuits.train.family",
                                description="Train the model family of chapter 11 (make family [SEED=n]).")
    p.add_argument("--seed", type=_whole(0, 2**62 - 1), default=0,
                   help="the family's seed (default 0, the committed results); each seed has its own folder")
    p.add_argument("--processes", type=_whole(1, 64), default=2,
                   help="members trained side by side, one thread each (default 2)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: a CUDA GPU where torch finds one, else the CPU)")
    p.add_argument("--members", nargs="*", choices=list(family.MEMBERS), metavar="MEMBER",
                   help=f"train only these (default all {len(family.MEMBERS)}): {', '.join(family.MEMBERS)}")
    p.add_argument("--out", type=Path, default=None,
                   help="the results folder (default: the committed one for seed 0, replicates/family-seed-N "
                        "for another); on a Ray cluster, a folder every node sees")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help=f"train each member as a task on the Ray cluster at ADDRESS (host:port, ray://host:port, "
                        f"auto; alone: ${cluster.ENV}, else a Ray instance started here); ${cluster.ENV} set "
                        "does the same without the flag")
    p.add_argument("--record", action="store_true",
                   help="then run chapter 11 on this seed and write its claims held to "
                        "replicates/family-seed-N/results.json (seed 0's the chapter asserts)")
    a = p.parse_args(argv)
    if a.seed != 0:  # the commit its training starts at, kept for its record (the first, when resumed)
        start = a.out or family.default_out(a.seed)
        replicate.training_commit(start, started=start.is_dir() and any(start.iterdir()))
    out = family.run(a.seed, a.processes, a.members, out=a.out, device=a.device, ray=cluster.address_from(a.ray))
    if a.record and a.seed == 0:
        print("seed 0 is the committed family: chapter 11 asserts its claims; nothing to record")
    elif a.record:
        path = family.record(a.seed, out)
        ch = json.loads(path.read_text())["chapters"][family.CHAPTER]
        print(f"chapter 11 on seed {a.seed}: {ch['cells_passed']} of {ch['cells']} cells, {ch['claims_held']} of "
              f"{ch['claims']} claims held; recorded in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
