"""Our forward pass against TransformerLens's on the same weights (target: ours at least 1.5x as fast).

    python benchmarks/bench_transformer_lens.py [--repeats 10] [--threads 1]

For the shipped 1- and 2-layer models: the same 32 x 128 tokens through ``model(tokens)`` and
``model.run_with_cache(tokens)``, and through the equivalent TransformerLens ``HookedTransformer``
(``attncircuits.interop.to_transformer_lens``) with ``tl_model(tokens)`` and
``tl_model.run_with_cache(tokens)``. The two are timed alternately, one call each in turn, so that
a busy machine slows both alike; the table gives the best CPU time of each (with one thread, the
time the call takes on an idle core) and the ratio TransformerLens / ours. Exits with status 1 if a
ratio is below the target. One thread by default: the ratio then compares the code, not how each
library splits the work across cores.
"""

from __future__ import annotations

import sys

import torch
from _common import apply_threads, best_of, load_model, parser

from attncircuits.interop import to_transformer_lens

TARGET = 1.5  # ours at least this many times as fast as TransformerLens
BATCH, POS = 32, 128


def side_by_side(fns: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Best (wall, CPU) seconds of each function, calling them in turn ``repeats`` times."""
    for fn in fns.values():
        fn()  # warm-up: first-call allocations and lazy imports
    best = {name: (float("inf"), float("inf")) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu, _ = best_of(fn, 1)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def main(argv=None) -> int:
    p = parser(__doc__)
    p.set_defaults(repeats=10, threads=1)
    args = p.parse_args(argv)
    apply_threads(args)
    rows = []
    for name in ("attn-only-1l", "attn-only-2l"):
        model = load_model(name)
        tl_model = to_transformer_lens(model)
        tokens = torch.randint(0, model.cfg.d_vocab, (BATCH, POS), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            err = (model(tokens).log_softmax(-1) - tl_model(tokens).log_softmax(-1)).abs().max().item()
            calls = {
                "forward": (lambda: model(tokens), lambda: tl_model(tokens)),
                "forward with cache": (lambda: model.run_with_cache(tokens), lambda: tl_model.run_with_cache(tokens)),
            }
            for call, (ours, theirs) in calls.items():
                t = side_by_side({"ours": ours, "tl": theirs}, args.repeats)
                rows.append((name, call, t["ours"][1], t["tl"][1], t["tl"][1] / t["ours"][1], err))
    print(
        f"{BATCH} x {POS} tokens, best CPU time of {args.repeats} alternating calls, torch threads: {torch.get_num_threads()}"
    )
    print(f"{'model':<13} {'call':<19} {'ours ms':>8} {'TL ms':>8} {'TL/ours':>8}  max |Δ log-prob|")
    for name, call, ours, theirs, ratio, err in rows:
        flag = "" if ratio >= TARGET else f"  below the target {TARGET}x"
        print(f"{name:<13} {call:<19} {ours * 1e3:>8.1f} {theirs * 1e3:>8.1f} {ratio:>7.2f}x  {err:.1e}{flag}")
    return 0 if all(r[4] >= TARGET for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
