"""A family of models trained side by side on one recipe, to ask where and when induction heads
form: ``make family`` (``python -m attncircuits.train.family [--seed N]``).

The members (:data:`MEMBERS`) are Olsson et al. (2022)'s grid, 1 to 6 layers attention-only and
with MLPs and LayerNorm, plus the 2-layer attention-only model with each other position scheme of
the family (learned positions in the residual stream, rotary, none). Every member trains on the
same tokens, with the same seed and schedule: chapter 7's live recipe (:data:`RECIPE`), whose
2-layer model forms induction heads in about 450 steps; the budget of 1,500 steps is over three
times that, so a member that forms none in it has had the time the 2-layer model needed, thrice.

Every 25 steps the training loop records the validation loss, the in-context-learning score and
every head's previous-token and prefix-matching scores; this module adds the per-token loss at one
fixed set of (window, position) pairs (:data:`N_WINDOWS` windows of validation text, every
position), for the per-token-loss PCA. At the end every detector of the registry scores every
head. Each member's results are one JSON file and one ``.npz`` in ``results/family/seed-N/``,
written when the member finishes; an interrupted run keeps each member's last evaluation in
``<member>.partial.pt`` and the same command resumes from there (nothing trained is lost).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from attncircuits.analysis import losses
from attncircuits.analysis.scores import head_scores
from attncircuits.core import durable
from attncircuits.train.live import live_configs, live_streams, live_text
from attncircuits.train.loop import TrainingInterrupted, train

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "results" / "family"
#: chapter 7's live recipe, with a budget over three times the steps its 2-layer model needs
RECIPE = dict(steps=1500, eval_every=25)
#: the windows of validation text whose every position's loss is kept for the PCA
N_WINDOWS = 16

MEMBERS: dict[str, dict] = {
    **{f"attn-{n}l": {"n_layers": n} for n in range(1, 7)},
    **{f"ln-mlp-{n}l": {"n_layers": n, "d_mlp": 512, "layernorm": True} for n in range(1, 7)},
    "attn-2l-learned": {"n_layers": 2, "positions": "learned"},
    "attn-2l-rotary": {"n_layers": 2, "positions": "rotary"},
    "attn-2l-none": {"n_layers": 2, "positions": "none"},
}


def member_configs(name: str, seed: int = 0):
    """The model and training configs of member ``name`` (:data:`MEMBERS`), on :data:`RECIPE`."""
    if name not in MEMBERS:
        raise ValueError(f"no family member {name!r}; the members are {', '.join(MEMBERS)}")
    return live_configs(**MEMBERS[name], **RECIPE, seed=seed)


def recipe_id(seed: int) -> dict:
    """What makes two results files comparable: the members' configs and the recipe."""
    rid = {"seed": seed, "recipe": vars(member_configs("attn-2l", seed)[1]),
           "members": {n: member_configs(n, seed)[0].to_dict() for n in MEMBERS}}
    return json.loads(json.dumps(rid))  # as it reads back from recipe.json


def train_member(name: str, seed: int, out: Path, streams=None) -> dict:
    """Train one member (resuming its partial state if there is one) and write its results."""
    torch.set_num_threads(1)
    mcfg, cfg = member_configs(name, seed)
    tr, va = streams if streams is not None else live_streams(mcfg.d_vocab)
    partial = out / f"{name}.partial.pt"
    state = torch.load(partial, weights_only=False) if partial.is_file() else None
    fixed = {}  # [window, pos]: the same pairs for every member, read at the first evaluation
    per_token = list(state["per_token"]) if state else []

    def on_eval(step, model, row):
        if not fixed:
            fixed["tokens"] = live_text(model, N_WINDOWS)
        nll = losses.per_token_loss(model, fixed["tokens"]).flatten()
        per_token.append(nll.to(torch.float16).numpy())

    def save_state(st):
        tmp = partial.with_suffix(".tmp")
        torch.save({**st, "per_token": per_token}, tmp)
        os.replace(tmp, partial)  # a kill at any moment leaves the last whole state

    t0 = time.perf_counter()
    model, history, _ = train(mcfg, cfg, tr, va, device="cpu", progress=False, resume=state,
                              save_state=save_state, callback=on_eval)
    scores = head_scores(model, live_text(model, 32), seq_len=15, n_repeats=4)
    result = {
        "member": name, "config": mcfg.to_dict(), "seed": seed, "n_params": model.n_params(),
        "tokens_per_step": cfg.batch_size * mcfg.n_ctx, "wall_s": time.perf_counter() - t0,
        "history": {k: history[k] for k in ("step", "val_loss", "icl_score", "prev_token", "prefix_matching")},
        "final_scores": {k: v.tolist() for k, v in scores.scores.items()},
    }
    np.savez_compressed(out / f"{name}.npz", per_token=np.stack(per_token))
    durable.write_text(out / f"{name}.json", json.dumps(result) + "\n")
    partial.unlink(missing_ok=True)
    return result


def _worker(args):
    name, seed, out, streams = args
    try:
        r = train_member(name, seed, out, streams)
        return name, f"{r['wall_s']:.0f} s"
    except TrainingInterrupted:
        return name, "interrupted (its state is kept)"


def run(seed: int = 0, processes: int = 2, members: list[str] | None = None, out: Path | None = None,
        streams=None) -> Path:
    """Train every member of the family not yet in ``out`` (default ``results/family/seed-N``),
    ``processes`` at a time, and print the closing table; a results folder of another recipe is
    refused before anything is trained. ``streams`` (train, validation tokens) replaces the live
    recipe's (tests pass small ones)."""
    out = out or RESULTS / f"seed-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    rid = recipe_id(seed)
    id_file = out / "recipe.json"
    if id_file.is_file() and json.loads(id_file.read_text()) != rid:
        raise SystemExit(f"{id_file} was written by another recipe; move {out} away to train this one")
    durable.write_text(id_file, json.dumps(rid, indent=1) + "\n")
    asked = list(members or MEMBERS)
    todo = [n for n in asked if not (out / f"{n}.json").is_file()]
    print(f"family seed {seed}: {len(asked) - len(todo)} of {len(asked)} members done, training {len(todo)}", flush=True)
    jobs = [(n, seed, out, streams) for n in todo]
    if processes == 1:  # here, one after the other
        done = map(_worker, jobs)
    else:  # side by side, one thread each: these small models use a core about as well as two
        pool = multiprocessing.get_context("spawn").Pool(processes)
        done = pool.imap_unordered(_worker, jobs)
    for name, what in done:
        print(f"  {name}: {what}", flush=True)
    if processes != 1:
        pool.close()
    print(table(out))
    return out


def load(out: Path) -> dict[str, dict]:
    """Every finished member's results in ``out``, with its per-token losses (``per_token``)."""
    res = {}
    for name in MEMBERS:
        f = out / f"{name}.json"
        if f.is_file():
            r = json.loads(f.read_text())
            r["per_token"] = np.load(out / f"{name}.npz")["per_token"].astype(np.float32)
            res[name] = r
    return res


def table(out: Path) -> str:
    lines = [f"{'member':<16} {'params':>8} {'val loss':>8} {'ICL':>6} {'best prefix':>11}"]
    for name, r in load(out).items():
        h = r["history"]
        pm = max(max(row) for row in h["prefix_matching"][-1])
        lines.append(f"{name:<16} {r['n_params']:>8,} {h['val_loss'][-1]:>8.3f} {h['icl_score'][-1]:>+6.2f} {pm:>11.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attncircuits.train.family", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--members", nargs="*", choices=list(MEMBERS))
    a = p.parse_args(argv)
    run(a.seed, a.processes, a.members)
    return 0


if __name__ == "__main__":
    sys.exit(main())
