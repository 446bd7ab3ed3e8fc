"""The fuzz of the public analysis API, run longer than in the tests, with its totals.

    python benchmarks/fuzz_report.py [--examples 60] [--seed 0] [--show deep,silent,refused]

Every public function that takes token ids (meta-device tensors, ragged lists and single numbers
among them), heads, layers, token strings, sizes, ablation values, attention patterns, config
fields, checkpoint paths, devices or models to convert is called
``--examples`` times with values drawn (by hypothesis, from ``--seed``) from pools of valid and
invalid values of each kind (``tests/fuzz_harness.py``). Each call is one of: ``clear`` (invalid input
refused with a message naming it), ``correct`` (valid input, finite result of the right shape),
``deep`` (a traceback from torch/numpy/Python internals, or a message naming no bad input),
``silent`` (invalid input accepted, or a NaN/inf or misshapen result) or ``refused`` (valid input
refused). Prints one line per function with any deep/silent/refused call, the calls named in
``--show``, and the totals. Exits with status 1 if any call is deep or silent.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_harness import OUTCOMES, run, targets, totals  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=60, help="calls per function (default 60)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    ap.add_argument("--show", default="", help="comma-separated outcomes whose calls to print, e.g. deep,silent")
    args = ap.parse_args(argv)
    show = {s for s in args.show.split(",") if s}
    t0 = time.perf_counter()
    everything = []
    for target in targets():
        n = args.examples if target.examples >= 8 else max(1, args.examples // 8)
        results = run(target, n, derandomize=False, seed=args.seed)
        everything += results
        c = Counter(r[0] for r in results)
        if c["deep"] or c["silent"] or c["refused"]:
            print(f"{target.name:45s} " + " ".join(f"{k}={c[k]}" for k in OUTCOMES))
        for outcome, call, detail in results:
            if outcome in show:
                print(f"    {outcome}: {call} -> {detail}")
    tot = totals(everything)
    print(f"\n{len(everything)} calls in {time.perf_counter() - t0:.1f} s (seed {args.seed}, {args.examples} per function): "
          + " / ".join(f"{k} {tot[k]}" for k in OUTCOMES))
    return 1 if tot["deep"] or tot["silent"] else 0


if __name__ == "__main__":
    sys.exit(main())
