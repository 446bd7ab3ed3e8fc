"""How long every behavioural score of every head of the three models takes (target: < 10 s in all).

    python benchmarks/bench_scores.py [--repeats 3] [--threads N]

Per shipped model (``attn-only-0l``, ``-1l``, ``-2l``): previous-token score on 16 windows of
validation text, prefix-matching (25 random tokens x 4) and copying scores, per-position loss on
repeated random tokens, the in-context-learning score on 64 validation windows, zero and
pattern-preserving ablation of each head alone, and (2L) the eigenvalue positivity of the
K-composition term and OV circuit of every layer-1 head. Prints the best of ``--repeats`` runs per
step and a total, and exits with status 1 if the total reaches 10 s.
"""

from __future__ import annotations

import sys

import torch
from _common import apply_threads, best_of, load_model, parser

from attncircuits.analysis import losses
from attncircuits.analysis import scores as S
from attncircuits.analysis.circuits.induction import induction_eigen_positivity
from attncircuits.checkpoints.pretrained import MODEL_NAMES, load_validation_tokens

LIMIT_S = 10.0


def main(argv=None) -> int:
    args = parser(__doc__).parse_args(argv)
    apply_threads(args)
    val = load_validation_tokens()
    rows: list[tuple[str, str, float]] = []
    for n_layers, name in enumerate(MODEL_NAMES):
        model, source = load_model(name), "shipped"
        n_ctx = model.cfg.n_ctx
        text = val[: 16 * n_ctx].reshape(16, n_ctx)
        icl_text = val[: 64 * n_ctx].reshape(64, n_ctx)
        rep = losses.repeated_tokens(model)
        steps = {
            "per-position loss, repeated random tokens": lambda: losses.repeated_loss_curve(model),
            "in-context-learning score (64 windows)": lambda: losses.in_context_learning_score(model, icl_text),
        }
        if n_layers:
            steps = {
                "previous-token score (16 windows)": lambda: S.previous_token_scores(model, text),
                "prefix-matching score (25 x 4)": lambda: S.prefix_matching_scores(model),
                "copying score": lambda: S.copying_scores(model),
                **steps,
                "zero ablation, each head": lambda: losses.ablation_effects(model, rep, "zero"),
                "pattern-preserving ablation, each head": lambda: losses.ablation_effects(model, rep, "pattern"),
            }
        if n_layers >= 2:
            steps["K-composition / OV eigenvalue positivity"] = lambda: induction_eigen_positivity(model)
        with torch.no_grad():
            for step, fn in steps.items():
                rows.append((f"{name} ({source})", step, best_of(fn, args.repeats)[0]))
    total = sum(s for *_, s in rows)
    w = max(len(m) for m, *_ in rows)
    print(f"{'model':<{w}}  {'score':<42} {'best s':>8}")
    for m, step, s in rows:
        print(f"{m:<{w}}  {step:<42} {s:>8.3f}")
    print(f"{'total':<{w}}  {'(all scores, all heads, three models)':<42} {total:>8.3f}   limit {LIMIT_S:.0f} s")
    print(f"torch threads: {torch.get_num_threads()}")
    return 0 if total < LIMIT_S else 1


if __name__ == "__main__":
    sys.exit(main())
