"""The shipped models' numbers: corpus, sizes, training speed, losses against the bigram floor, head scores.

Run: ``python benchmarks/report_models.py`` (about 20 s). The targets they must meet are asserted in
``tests/test_shipped_models.py``; this prints the measured values behind them.
"""

from __future__ import annotations

import torch
from _common import apply_threads, parser

from attncircuits import MODEL_NAMES, load_pretrained, loss_fn
from attncircuits.analysis.circuits import bigram_count_table, conditional_entropy, cross_entropy, smoothed_log_probs
from attncircuits.analysis.losses import repeated_token_loss
from attncircuits.analysis.scores import prefix_matching_scores, previous_token_scores
from attncircuits.checkpoints.pretrained import (
    PRETRAINED_DIR,
    corpus_info,
    load_train_bigram_counts,
    validation_windows,
)


def main(argv=None) -> int:
    args = parser(__doc__).parse_args(argv)
    apply_threads(args)
    info = corpus_info()
    n_bytes = info["train_bytes"] + info["validation_bytes"]
    n_tokens = info["train_tokens"] + info["validation_tokens"]
    print(f"corpus: {info['source']}")
    print(f"  {info['train_files'] + info['validation_files']} files, {n_bytes:,} bytes, {n_tokens:,} tokens "
          f"({info['train_tokens']:,} train / {info['validation_tokens']:,} validation), {n_bytes / n_tokens:.2f} bytes/token")

    windows = validation_windows()
    d_vocab = load_pretrained("attn-only-0l").model.cfg.d_vocab
    train_counts = bigram_count_table(*load_train_bigram_counts(), d_vocab=d_vocab)
    val_pairs = (windows[:, :-1].flatten(), windows[:, 1:].flatten())
    val_counts = bigram_count_table(*val_pairs, torch.ones_like(val_pairs[0]), d_vocab=d_vocab)
    floor = conditional_entropy(train_counts)
    print(f"training-split bigram conditional entropy (floor): {floor:.3f}; add-one bigram table on validation: "
          f"{cross_entropy(smoothed_log_probs(train_counts, 1.0), val_counts):.3f}")
    print(f"{'model':<14}{'MB':>6}{'tok/s':>9}{'train s':>9}{'val loss':>10}  notes")
    for name in MODEL_NAMES:
        ck = load_pretrained(name)
        model, hist = ck.model, ck.history
        mb = sum(p.stat().st_size for p in (PRETRAINED_DIR / name).rglob("*") if p.is_file()) / 1e6
        with torch.no_grad():
            val = sum(loss_fn(model(w), w).item() * len(w) for w in windows.split(256)) / len(windows)
        if model.cfg.n_layers == 0:
            with torch.no_grad():
                table = (model.W_E @ model.W_U).log_softmax(-1)
            train_loss = cross_entropy(table, train_counts)
            note = f"training-split loss {train_loss:.3f} = floor x {train_loss / floor:.3f}"
        else:
            pt = previous_token_scores(model, windows[::8][:64]).max(-1).values
            pm = prefix_matching_scores(model).max(-1).values
            rl = repeated_token_loss(model)
            note = (f"best prev-token per layer {[round(x, 3) for x in pt.tolist()]}, best prefix-matching per layer "
                    f"{[round(x, 3) for x in pm.tolist()]}, repeated tokens {rl.first:.2f} -> {rl.second:.2f} "
                    f"(ratio {rl.ratio:.3f})")
        print(f"{name:<14}{mb:>6.1f}{hist['tokens_per_s']:>9,.0f}{hist['wall_s'][-1]:>9.0f}{val:>10.3f}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
