"""Search for a recipe that forms induction heads fast: one training run per call, stopped early.

    python benchmarks/live_recipe_search.py --name base --vocab 2048 --set n_ctx=128 lr=5e-3

Each evaluation prints step, wall time, tokens/s, the best layer-0 previous-token score, the best
last-layer prefix-matching score and the loss on the first and second copy of repeated random
tokens; the run stops when prefix matching >= 0.5 and the second copy costs <= 1/2 of the first.
One JSON line per run is appended to ``--log``. Token streams are cached under ``--cache``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from attncircuits import data
from attncircuits.checkpoints.pretrained import CORPUS_DIR, load_validation_tokens
from attncircuits.models.transformer import ModelConfig
from attncircuits.train import TrainConfig, train


def streams(vocab: str, cache: Path) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation tokens: ``2048`` (the shipped BPE), ``rK`` (its ids ranked by frequency,
    the K-1 most frequent kept and every other id mapped to one), ``bytes`` (UTF-8 bytes + EOT)."""
    cache.mkdir(parents=True, exist_ok=True)
    f = cache / "train2048.npy"
    if not f.exists():
        corpus = data.load_corpus()
        np.save(f, data.tokenize_documents(data.load_tokenizer(CORPUS_DIR / "tokenizer.json"), corpus.train))
    tr, va = np.load(f), load_validation_tokens().numpy().astype(np.uint16)
    if vocab == "2048":
        return tr, va
    if vocab.startswith("r"):
        k = int(vocab[1:])
        counts = np.bincount(tr, minlength=2048)
        counts[0] = counts.max() + 1  # EOT keeps id 0
        rank = np.empty(2048, dtype=np.int64)
        rank[np.argsort(-counts, kind="stable")] = np.arange(2048)
        new = np.minimum(rank, k - 1).astype(np.uint16)
        return new[tr], new[va]
    raise ValueError(vocab)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--vocab", default="2048")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", nargs="*", default=[], help="field=value for ModelConfig or TrainConfig")
    p.add_argument("--log", type=Path, default=Path("live_recipes.jsonl"))
    p.add_argument("--cache", type=Path, default=Path(".live_cache"))
    p.add_argument("--pm", type=float, default=0.5)
    p.add_argument("--ratio", type=float, default=0.5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tr, va = streams(args.vocab, args.cache)
    mk = {"n_layers": 2, "d_vocab": int(max(tr.max(), va.max())) + 1}
    tk = {"min_lr_frac": 1.0, "eval_batches": 2, "eval_every": 100, "steps": 4000}
    for kv in args.set:
        k, v = kv.split("=")
        target = mk if k in ModelConfig.__dataclass_fields__ else tk
        target[k] = type(getattr(ModelConfig() if target is mk else TrainConfig(), k))(float(v) if "e" in v or "." in v else int(v))
    mcfg, cfg = ModelConfig(**mk), TrainConfig(**tk)
    rows, reached = [], {}
    t0 = time.time()

    def cb(step, model, row):
        pt, pm = max(row["prev_token"][0]), max(row["prefix_matching"][-1])
        first, second = row["repeated_loss_first"], row["repeated_loss_second"]
        tps = step * cfg.batch_size * mcfg.n_ctx / max(row["wall_s"], 1e-9)
        rows.append(dict(step=step, wall=row["wall_s"], tps=tps, pt=pt, pm=pm, first=first, second=second))
        if pm >= args.pm and "pm" not in reached:
            reached["pm"] = (step, row["wall_s"])
        if second <= args.ratio * first and "ratio" not in reached:
            reached["ratio"] = (step, row["wall_s"])
        print(f"step {step:>5} wall {row['wall_s']:6.1f}s {tps:7.0f} tok/s prev {pt:.2f} pm {pm:.2f} "
              f"copy {first:.2f} -> {second:.2f} ({second / first:.2f})", flush=True)
        return "pm" in reached and "ratio" in reached

    train(mcfg, cfg, tr, va, device="cpu", progress=False, callback=cb)
    out = dict(name=args.name, vocab=args.vocab, threads=args.threads, model=mk, train=tk, reached=reached,
               last=rows[-1], total_s=time.time() - t0, load=open("/proc/loadavg").read().split()[0])
    print(json.dumps(out))
    with open(args.log, "a") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
