"""Clamp parts of the induction circuit while it trains (chapter 13): ``make clamps``.

Singh et al. (2024) ask which piece of an induction circuit holds its phase change back by fixing
("clamping") pieces to their final form from the first step and watching when the rest forms. Here
the pieces are attention patterns, and a clamp is the model's own ``patterns=`` hook, passed to the
training loop (:func:`attncircuits.train.loop.train`'s ``patterns``): every forward pass of
training uses the clamped head's target pattern instead of its own, so that head's queries and keys
get no gradient, while its values and output, and every other head, learn as usual.

Two targets (:data:`TARGETS`):

- ``previous``: each position attends only to the token ``distance`` places back (1: the previous
  token, the layer-0 head's job); positions with nothing that far back attend to the first.
- ``induction``: each position attends evenly to the tokens right after earlier copies of its own
  token (the layer-1 head's job, :func:`attncircuits.analysis.scores.prefix_match_targets`); a
  position whose token has no earlier copy spreads its attention evenly over the prefix.

:func:`clamp_train` trains chapter 7's live recipe (``attn-only-2l-live``) under one
:data:`CONDITIONS` entry and dates the circuit by the course's rule (:mod:`attncircuits.train.live`:
a layer-1 head's prefix-matching score at least 0.5 and the second copy of repeated random tokens
costing at most half the first), measured with the clamps in place, since the trained heads rely
on them. ``python -m attncircuits.train.clamps`` runs every condition on several seeds and writes
:data:`RESULTS`, which chapter 13 reads.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from attncircuits.analysis.losses import RepeatedLossCurve, per_token_loss
from attncircuits.analysis.scores import prefix_match_targets, prefix_matching_scores
from attncircuits.core import durable
from attncircuits.core.heads import head_name
from attncircuits.data import repeated_rows
from attncircuits.models.transformer import ModelConfig, Transformer
from attncircuits.train.live import TARGET_COPY_RATIO, TARGET_PREFIX_MATCHING, live_configs, live_streams
from attncircuits.train.loop import train

TARGETS = ("previous", "induction")
#: the committed results (``make clamps``), in the package's shipped files so Colab reads them too
RESULTS = Path(__file__).resolve().parents[1] / "checkpoints" / "shipped" / "formation" / "clamps.json"
SEEDS = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class Clamp:
    """Head ``head`` of layer ``layer`` attends to ``target`` (see :data:`TARGETS`) instead of
    where its own queries and keys point; ``distance`` is how far back ``previous`` looks."""

    layer: int
    head: int
    target: str = "previous"
    distance: int = 1

    def describe(self) -> str:
        what = "the previous token" if self.distance == 1 else f"the token {self.distance} back"
        return f"{head_name(self.layer, self.head)} clamped to {what if self.target == 'previous' else 'the induction target'}"


#: the four conditions of chapter 13: head 0 of layer 0 clamped to the previous token, head 0 of
#: layer 1 to the induction target, both, and nothing
CONDITIONS: dict[str, tuple[Clamp, ...]] = {
    "none": (),
    "previous": (Clamp(0, 0, "previous"),),
    "induction": (Clamp(1, 0, "induction"),),
    "both": (Clamp(0, 0, "previous"), Clamp(1, 0, "induction")),
}


def check_clamps(cfg: ModelConfig, clamps) -> tuple[Clamp, ...]:
    """``clamps`` checked against a model's config; each problem raises one line naming the fix."""
    clamps = tuple(clamps)
    for c in clamps:
        if not isinstance(c, Clamp):
            raise TypeError(f"a clamp must be a Clamp(layer, head, target), got {c!r}")
        if cfg.n_layers == 0:
            raise ValueError(f"cannot clamp head {c.layer}.{c.head}: this model has no attention layers (n_layers=0); "
                             "clamp a model with n_layers >= 1")
        if not (isinstance(c.layer, int) and 0 <= c.layer < cfg.n_layers and isinstance(c.head, int) and 0 <= c.head < cfg.n_heads):
            raise ValueError(f"cannot clamp head {c.layer}.{c.head}: the model has layers 0..{cfg.n_layers - 1} with heads "
                             f"0..{cfg.n_heads - 1} each; pick a head it has")
        if c.target not in TARGETS:
            raise ValueError(f"clamp target {c.target!r} is not one of {', '.join(map(repr, TARGETS))}")
        if c.target == "previous" and not (isinstance(c.distance, int) and 1 <= c.distance < cfg.n_ctx):
            raise ValueError(f"a clamp to the token {c.distance!r} back does not fit a context of n_ctx={cfg.n_ctx}; "
                             f"use a distance from 1 to {cfg.n_ctx - 1}")
    heads = [(c.layer, c.head) for c in clamps]
    if len(set(heads)) < len(heads):
        raise ValueError(f"a head is clamped twice in {heads}; give each head one clamp")
    return clamps


def target_pattern(clamp: Clamp, tokens: torch.Tensor) -> torch.Tensor:
    """``[batch, q, k]``: where a clamped head attends on ``tokens`` ``[batch, pos]`` (causal rows
    that sum to 1)."""
    b, n = tokens.shape
    if clamp.target == "previous":
        key = (torch.arange(n, device=tokens.device) - clamp.distance).clamp(min=0)
        pattern = torch.nn.functional.one_hot(key, n).float()
        return pattern.expand(b, n, n)
    match = prefix_match_targets(tokens).float()  # [batch, q, k]: after an earlier copy of q's token
    prefix = torch.ones(n, n, device=tokens.device).tril().expand(b, n, n)
    some = match.sum(-1, keepdim=True) > 0
    pattern = torch.where(some, match, prefix)
    return pattern / pattern.sum(-1, keepdim=True)


def clamp_patterns(clamps, tokens: torch.Tensor) -> dict:
    """The ``patterns=`` argument of a forward pass on ``tokens`` with ``clamps`` in place."""
    return {(c.layer, c.head): target_pattern(c, tokens) for c in clamps}


@torch.no_grad()
def clamped_scores(model: Transformer, clamps=()) -> dict:
    """The course's formation measures with ``clamps`` in place (as :func:`attncircuits.train.loop.evaluate`
    takes them): every head's prefix-matching score ``[layer][head]`` on random tokens repeated four
    times, and the loss of the first and second copy of random tokens repeated twice."""
    clamps = check_clamps(model.cfg, clamps)
    n_ctx, d_vocab = model.cfg.n_ctx, model.cfg.d_vocab
    seq = min(25, (n_ctx - 1) // 4)
    pm_rows = repeated_rows(16, seq, 4, d_vocab, 0).to(model.W_E.device)
    pm = prefix_matching_scores(model, seq, tokens=pm_rows, patterns=clamp_patterns(clamps, pm_rows))
    L = (n_ctx - 1) // 2
    rows = repeated_rows(16, L, 2, d_vocab, 0).to(model.W_E.device)
    nll = per_token_loss(model, rows, chunk=len(rows), patterns=clamp_patterns(clamps, rows))
    first, second = RepeatedLossCurve(nll.mean(0), L, 2).copy_means()
    return {"prefix_matching": pm.tolist(), "first": first, "second": second}


def formed(scores: dict) -> bool:
    """The course's rule (chapter 7): a layer-1 head prefix-matches at least 0.5 and the second copy
    costs at most half the first."""
    return (max(scores["prefix_matching"][-1]) >= TARGET_PREFIX_MATCHING
            and scores["second"] <= TARGET_COPY_RATIO * scores["first"])


@dataclass
class ClampRun:
    """One clamped run: its model and, per evaluation, the clamped scores and the loop's history."""

    condition: str
    seed: int
    model: Transformer
    log: dict
    formed_step: int | None
    wall_s: float

    def record(self) -> dict:
        """What :data:`RESULTS` keeps of the run (small: a few numbers per evaluation)."""
        return {"condition": self.condition, "seed": self.seed, "formed_step": self.formed_step,
                "wall_s": round(self.wall_s, 1), **{k: [round(x, 4) if isinstance(x, float) else x for x in v]
                                                     for k, v in self.log.items()}}


def clamp_train(condition: str = "both", seed: int = 0, steps: int = 1500, stop_at_formed: bool = True,
                streams=None, threads: int | None = 1, **overrides) -> ClampRun:
    """Train the live recipe (``overrides``: any of its settings) with ``CONDITIONS[condition]``
    clamped from step 0, scoring every evaluation with the clamps in place; stop at the first
    evaluation where the circuit has formed (:func:`formed`) unless ``stop_at_formed=False``.
    ``streams`` (train, validation tokens of :func:`~attncircuits.train.live.live_streams`) skips
    the data preparation."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; the conditions are {', '.join(map(repr, CONDITIONS))}")
    model_cfg, cfg = live_configs(steps=steps, seed=seed, **overrides)
    clamps = check_clamps(model_cfg, CONDITIONS[condition])
    clamped = {(c.layer, c.head) for c in clamps}
    streams = streams if streams is not None else live_streams(model_cfg.d_vocab)
    log: dict = {"step": [], "prefix_matching": [], "free_prefix_matching": [], "free_prev_token": [],
                 "first": [], "second": []}
    state = {"formed": None}

    def on_eval(step: int, model: Transformer, row: dict) -> bool:
        sc = clamped_scores(model, clamps)
        free = lambda layer, table: max(v for h, v in enumerate(table[layer]) if (layer, h) not in clamped)  # noqa: E731
        for key, val in (("step", step), ("prefix_matching", max(sc["prefix_matching"][1])),
                         ("free_prefix_matching", free(1, sc["prefix_matching"])),
                         ("free_prev_token", free(0, row["prev_token"])), ("first", sc["first"]), ("second", sc["second"])):
            log[key].append(val)
        if state["formed"] is None and formed(sc):
            state["formed"] = step
        return stop_at_formed and state["formed"] is not None

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with torch.enable_grad():
            t0 = time.perf_counter()
            model, _, _ = train(model_cfg, cfg, *streams, device="cpu", progress=False, callback=on_eval,
                                patterns=(lambda batch: clamp_patterns(clamps, batch)) if clamps else None)
    finally:
        torch.set_num_threads(old)
    return ClampRun(condition, seed, model, log, state["formed"], time.perf_counter() - t0)


def load_results(path: Path = RESULTS) -> dict:
    """The committed runs, ``{"runs": [record, ...], "steps": budget}`` (:func:`main` writes them)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no clamp results at {path}; run `make clamps` to write them")
    return json.loads(path.read_text())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="chapter 13's clamped runs: every condition on several seeds")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    ap.add_argument("--steps", type=int, default=1500, help="the budget of each run (it stops once the circuit forms)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    streams = live_streams(live_configs()[0].d_vocab)
    for seed in args.seeds:
        for condition in args.conditions:
            done = load_results(args.out)["runs"] if args.out.is_file() else []
            if any(r["condition"] == condition and r["seed"] == seed for r in done):
                continue
            run = clamp_train(condition, seed, args.steps, streams=streams)
            print(f"{condition:<10} seed {seed}: formed at step {run.formed_step} ({run.wall_s:.0f} s)", flush=True)
            done = load_results(args.out)["runs"] if args.out.is_file() else []  # another process may have added runs
            done = [r for r in done if not (r["condition"] == condition and r["seed"] == seed)] + [run.record()]
            done.sort(key=lambda r: (list(CONDITIONS).index(r["condition"]), r["seed"]))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            durable.write_text(args.out, json.dumps({"preset": "attn-only-2l-live", "steps": args.steps, "runs": done},
                                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
