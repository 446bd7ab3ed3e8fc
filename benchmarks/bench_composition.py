"""How long the two-layer chapter's analyses take (targets: all composition scores plus the random
baseline < 1 s; term importance on >= 100k validation tokens < 30 s).

    python benchmarks/bench_composition.py [--model attn-only-2l] [--repeats 3] [--tokens 100000] [--threads N]

Composition scores are computed on the factors (``FactoredMatrix``): every product has rank at most
``d_head``, so its Frobenius norm comes from ``d_head x d_head`` Gram matrices and no
``d_model x d_model`` matrix is formed. Term importance runs one forward pass per batch of windows
(patterns frozen there) and unembeds three partial residual streams; the direct path's loss comes
from the ``W_E W_U`` table. Also times the 2-layer path expansion on 8 windows.

Uses the shipped model. Prints the best of ``--repeats`` runs per step, wall-clock and CPU seconds
(on a busy machine, run with ``--threads 1`` and read the CPU column), and exits with status 1 if
a target is missed on the wall clock.
"""

from __future__ import annotations

import math
import sys

import torch
from _common import apply_threads, best_of, load_model, parser

from attncircuits.analysis.circuits import composition_scores, term_importance, two_layer_path_expansion
from attncircuits.checkpoints.pretrained import load_validation_tokens


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--model", default="attn-only-2l")
    p.add_argument("--tokens", type=int, default=100_000, help="predicted validation tokens for term importance")
    args = p.parse_args(argv)
    apply_threads(args)
    model, source = load_model(args.model), f"shipped {args.model}"
    cfg = model.cfg
    val = load_validation_tokens()
    n_windows = math.ceil(args.tokens / (cfg.n_ctx - 1))
    if n_windows * cfg.n_ctx > len(val):
        raise SystemExit(
            f"--tokens {args.tokens} needs {n_windows * cfg.n_ctx} validation tokens; the split has {len(val)}"
        )
    windows = val[: n_windows * cfg.n_ctx].view(n_windows, cfg.n_ctx)

    rows = []  # (step, wall seconds, cpu seconds, limit or None)

    def run(name, fn, limit=None, repeats=args.repeats):
        wall, cpu, out = best_of(fn, repeats)
        rows.append((name, wall, cpu, limit))
        return out

    comp = run(
        f"composition scores: 3 x {cfg.n_heads}² pairs + baseline (3 x 500 random pairs)",
        lambda: composition_scores(model),
        1.0,
    )
    run(
        f"composition scores alone (3 x {cfg.n_heads}² pairs, no baseline)",
        lambda: composition_scores(model, n_baseline=2),
    )
    run(
        f"2-layer path expansion, 8 windows ({1 + 2 * cfg.n_heads + cfg.n_heads**2} terms, residual space)",
        lambda: two_layer_path_expansion(model, windows[:8]),
    )
    ti = run(f"term importance, {n_windows} windows", lambda: term_importance(model, windows), 30.0, repeats=1)

    print(f"{source}, torch threads = {torch.get_num_threads()}, best of {args.repeats} (term importance: 1 run)")
    width = max(len(r[0]) for r in rows)
    print(f"{'step':<{width}}  {'wall s':>8}  {'cpu s':>8}  {'target':>8}  met (wall)")
    print("-" * (width + 45))
    for name, wall, cpu, limit in rows:
        met = "" if limit is None else ("yes" if wall < limit else "NO")
        print(f"{name:<{width}}  {wall:8.3f}  {cpu:8.3f}  {'' if limit is None else f'< {limit:g} s':>8}  {met}")
    print(
        f"\nterm importance on {ti.n_tokens:,} predicted tokens (nats/token): uniform {ti.uniform:.3f}, direct {ti.direct:.3f}, "
        f"first order {ti.first_order:.3f}, full {ti.full:.3f}"
    )
    for kind in "qkv":
        print(
            f"{kind.upper()}-composition: baseline {comp.baseline.mean(kind):.4f} ± {comp.baseline.std(kind):.4f}, "
            f"max score {comp[kind].max():.3f}"
        )
    return 0 if all(limit is None or wall < limit for _, wall, _, limit in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
