"""How long the zero-layer chapter's full ``d_vocab x d_vocab`` tables take (target: < 1 s each).

    python benchmarks/bench_bigrams.py [--repeats 3] [--threads N]

Uses the shipped ``attn-only-0l`` model and the shipped training-split bigram counts. Prints the best
of ``--repeats`` runs per step (wall clock, and CPU time summed over threads, which other busy
programs on the machine do not inflate) and exits with status 1 if any step takes 1 s or more.
"""

from __future__ import annotations

import sys

import torch
from _common import apply_threads, best_of, load_model, parser

from attncircuits.analysis.circuits import bigrams as B
from attncircuits.checkpoints.pretrained import load_train_bigram_counts, load_validation_tokens

LIMIT_S = 1.0


def main(argv=None) -> int:
    args = parser(__doc__).parse_args(argv)
    apply_threads(args)
    model, source = load_model("attn-only-0l"), "shipped attn-only-0l"
    V = model.cfg.d_vocab
    prev, nxt, cnt = load_train_bigram_counts()
    val = load_validation_tokens()

    rows = []

    def run(name, fn):
        wall, cpu, out = best_of(fn, args.repeats)
        rows.append((name, wall, cpu))
        return out

    logp = run("bigram_log_probs (W_E @ W_U, log-softmax)", lambda: B.bigram_log_probs(model))
    run("bigram_logits (W_E @ W_U)", lambda: B.bigram_logits(model))
    counts = run(
        f"bigram_count_table ({len(cnt):,} sparse train pairs)", lambda: B.bigram_count_table(prev, nxt, cnt, V)
    )
    run(f"count_bigrams (validation stream, {len(val):,} tokens)", lambda: B.count_bigrams(val, V))
    alpha = run("fit_smoothing (leave-one-out, 40 alphas)", lambda: B.fit_smoothing(counts))
    run("smoothed_log_probs", lambda: B.smoothed_log_probs(counts, alpha))
    run("conditional_entropy (bigram floor)", lambda: B.conditional_entropy(counts))
    run("cross_entropy (0L loss from counts)", lambda: B.cross_entropy(logp, counts))
    run("compare_bigram_tables (corr, KL, top-1/5)", lambda: B.compare_bigram_tables(logp, counts))
    run("self_prediction", lambda: B.self_prediction(logp))

    print(f"d_vocab = {V} ({V * V / 1e6:.1f} M-entry tables), {source}, torch threads = {torch.get_num_threads()}, "
          f"best of {args.repeats}")
    width = max(len(n) for n, *_ in rows)
    print(f"{'step':<{width}}  {'wall s':>7}  {'CPU s':>7}  wall < {LIMIT_S:g} s")
    print("-" * (width + 30))
    for name, wall, cpu in rows:
        print(f"{name:<{width}}  {wall:7.3f}  {cpu:7.3f}  {'yes' if wall < LIMIT_S else 'NO'}")
    return 0 if all(wall < LIMIT_S for _, wall, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
