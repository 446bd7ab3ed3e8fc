"""How long the one-layer chapters' full-vocabulary analyses take (target: < 2 s together, < 2 GB).

    python benchmarks/bench_one_layer.py [--model attn-only-1l] [--repeats 3] [--threads N] [--compare-dense]

The target covers the eigenvalue copying summaries of all heads plus the top skip-trigrams of all
heads over the whole vocabulary. Both go through the factored circuits: a head's OV circuit
``W_E W_V W_O W_U`` is ``[d_vocab, d_head] @ [d_head, d_vocab]``, so its eigenvalues come from the
``d_head x d_head`` product ``B @ A`` and its top entries from blocks of rows that are reduced to their
top ``k`` as soon as they are built; no ``d_vocab x d_vocab`` matrix is kept. ``--compare-dense``
also times the dense route for one head (``torch.linalg.eigvals`` of the 2048 x 2048 product).

Uses the shipped model. Prints the best of ``--repeats`` runs per step (wall clock) and the
process's peak resident memory; exits with status 1 if the target is missed.
"""

from __future__ import annotations

import resource
import sys

import torch
from _common import apply_threads, best_of, load_model, parser

from attncircuits.analysis.circuits.bigrams import bigram_count_table
from attncircuits.analysis.circuits.copying import copying_summary, eigen_copying_score
from attncircuits.analysis.circuits.factored import full_ov_circuit
from attncircuits.analysis.circuits.paths import path_expansion
from attncircuits.analysis.circuits.skip_trigrams import find_skip_trigram_bugs, top_skip_trigrams
from attncircuits.checkpoints.pretrained import load_train_bigram_counts, load_validation_tokens

LIMIT_S = 2.0
LIMIT_BYTES = 2 * 2**30


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--model", default="attn-only-1l", help="shipped model name (default attn-only-1l)")
    p.add_argument("--compare-dense", action="store_true", help="also time dense eigenvalues of one head")
    args = p.parse_args(argv)
    apply_threads(args)
    model, source = load_model(args.model), f"shipped {args.model}"
    cfg = model.cfg
    counts = bigram_count_table(*load_train_bigram_counts(), cfg.d_vocab)
    text = load_validation_tokens()[: 16 * cfg.n_ctx].view(16, cfg.n_ctx)
    rss_before = peak_rss_bytes()

    rows, target = [], 0.0

    def run(name, fn, in_target=False):
        nonlocal target
        s, _, out = best_of(fn, args.repeats)
        rows.append((name, s, in_target))
        target += s if in_target else 0.0
        return out

    for layer in range(cfg.n_layers):
        run(
            f"L{layer} eigen-summaries Σλ/Σ|λ|, all heads",
            lambda layer=layer: eigen_copying_score(full_ov_circuit(model, layer).eigenvalues()),
            in_target=True,
        )
        run(
            f"L{layer} top-10 skip-trigrams, all heads, full vocab",
            lambda layer=layer: top_skip_trigrams(model, layer, k=10),
            in_target=True,
        )
        run(
            f"L{layer} copying_summary (+50 shuffles, diagonal, top-k)",
            lambda layer=layer: copying_summary(model, layer),
        )
        run(
            f"L{layer} find_skip_trigram_bugs (all heads, k=8)",
            lambda layer=layer: find_skip_trigram_bugs(model, layer, counts),
        )
    run(f"path expansion, {text.shape[0]} x {text.shape[1]} tokens", lambda: path_expansion(model, text))
    if args.compare_dense:
        ov = full_ov_circuit(model, 0, 0)
        run(
            "dense route: eigvals of one 2048x2048 OV (for comparison)",
            lambda: torch.linalg.eigvals(ov.dense()),
        )

    peak = peak_rss_bytes()
    dense_mib = 2 * cfg.n_heads * cfg.d_vocab**2 * 4 / 2**20
    print(
        f"{source}: {cfg.n_layers} layer(s) x {cfg.n_heads} heads, d_head {cfg.d_head}, d_vocab {cfg.d_vocab}; "
        f"torch threads = {torch.get_num_threads()}, best of {args.repeats}"
    )
    print(
        f"(dense QK + OV circuits of one layer would be {dense_mib:.0f} MiB; at d_vocab 50257 "
        f"{2 * cfg.n_heads * 50257**2 * 4 / 2**30:.0f} GiB)"
    )
    width = max(len(n) for n, _, _ in rows)
    print(f"{'step':<{width}}  {'seconds':>8}  in target")
    print("-" * (width + 21))
    for name, s, in_t in rows:
        print(f"{name:<{width}}  {s:8.3f}  {'yes' if in_t else ''}")
    print("-" * (width + 21))
    ok_t, ok_m = target < LIMIT_S, peak < LIMIT_BYTES
    print(
        f"{'target: eigen-summaries + skip-trigrams':<{width}}  {target:8.3f}  < {LIMIT_S:g} s: {'yes' if ok_t else 'NO'}"
    )
    print(
        f"peak resident memory of this process: {peak / 2**20:.0f} MiB (after loading: {rss_before / 2**20:.0f} MiB); "
        f"< {LIMIT_BYTES / 2**30:g} GiB: {'yes' if ok_m else 'NO'}"
    )
    return 0 if ok_t and ok_m else 1


if __name__ == "__main__":
    sys.exit(main())
