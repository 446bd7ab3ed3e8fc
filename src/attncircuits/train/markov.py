"""Attention-only models trained on in-context Markov chains (chapter 13; Edelman et al. 2024).

:func:`train_markov` trains members of the family (one head, a narrow residual stream, the
context as long as a sequence) side by side on the same batches of
:class:`~attncircuits.data.markov.MarkovChains`, with AdamW at a constant rate. Every
``eval_every`` steps each model is scored on one fixed evaluation batch: its loss and its KL
divergence to each exact predictor (uniform, in-context unigram, in-context bigram). Which
predictor is nearest names the model's *stage* (:func:`stage_of`); :func:`stage_steps` dates
the first evaluation of each stage.

``python -m attncircuits.train.markov`` (``make markov``) trains the 2- and 1-layer models on
several seeds and a few numbers of symbols and writes :data:`RESULTS`, which chapter 13 reads.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from attncircuits.core import durable
from attncircuits.data.markov import PREDICTORS, MarkovChains, cross_entropy, kl_to
from attncircuits.models.transformer import ModelConfig, Transformer

#: the committed results, beside chapter 13's clamp results
RESULTS = Path(__file__).resolve().parents[1] / "checkpoints" / "shipped" / "formation" / "markov.json"
EVAL_SEED = 10**6  # the evaluation batch, never a training batch (those use seeds below 10**6)


@dataclass
class MarkovRecipe:
    """The chapter's recipe; each default says why."""

    # Tried (k=3, length 50, 2 layers, seed 0 unless said; bigram stage from step ..., in 800 steps):
    #   1 head, lr 1e-3 to 1e-2, batch 32 or 64, length 50 or 100     never (still at the unigram)
    #   2 heads, lr 3e-3                                                750
    #   2 heads, lr 1e-2                                                325 (a noisy KL)
    #   4 heads, lr 3e-3                                                500
    #   2 heads, lr 5e-3, embedding scale 0.1 (this recipe)             275 (seed 1: 225)
    d_model: int = 32  # Edelman et al. use 16
    n_heads: int = 2  # one head a layer sat at the unigram for 1,500 steps; two leave it within ~300
    lr: float = 5e-3  # AdamW, constant
    batch_size: int = 32  # 32 sequences of 50: a step costs a few milliseconds on one core
    init_std_embed: float = 0.1  # small logits at step 0, so training starts at the uniform predictor
    eval_every: int = 25
    eval_size: int = 256  # sequences in the fixed evaluation batch

    def model_config(self, task: MarkovChains, n_layers: int) -> ModelConfig:
        return ModelConfig(n_layers=n_layers, d_model=self.d_model, n_heads=self.n_heads, d_vocab=task.k, n_ctx=task.length,
                           init_std_embed=self.init_std_embed)


@dataclass
class MarkovRun:
    """One model's run: the trained model and, per evaluation, its loss and KL to each predictor."""

    n_layers: int
    model: Transformer
    log: dict = field(default_factory=lambda: {"step": [], "loss": [], **{f"kl_{p}": [] for p in PREDICTORS}})

    def kl(self, i: int = -1) -> dict[str, float]:
        return {p: self.log[f"kl_{p}"][i] for p in PREDICTORS}


def stage_of(kl: dict[str, float]) -> str:
    """The stage a model is in: the predictor it is nearest to (smallest KL)."""
    return min(PREDICTORS, key=lambda p: kl[p])


def stage_steps(log: dict) -> dict[str, int | None]:
    """The first evaluated step of each stage (None: never reached)."""
    out: dict[str, int | None] = {p: None for p in PREDICTORS}
    for i, step in enumerate(log["step"]):
        s = stage_of({p: log[f"kl_{p}"][i] for p in PREDICTORS})
        if out[s] is None:
            out[s] = step
    return out


@torch.no_grad()
def evaluate_markov(model: Transformer, tokens: torch.Tensor, preds: dict) -> dict[str, float]:
    """Loss and KL to each predictor of ``model`` on ``tokens`` (``preds``: the task's predictors)."""
    logp = model.forward_checked(tokens).log_softmax(-1)
    out = {"loss": cross_entropy(logp.exp(), tokens)}
    out.update({f"kl_{p}": kl_to(preds[p], logp) for p in PREDICTORS})
    return out


def train_markov(task: MarkovChains, layers=(2, 1), steps: int | dict = 600, seed: int = 0,
                 recipe: MarkovRecipe | None = None, callback: Callable[[int, dict], None] | None = None,
                 threads: int | None = 1) -> dict[int, MarkovRun]:
    """Train one model per entry of ``layers`` (its number of layers) on the same batches.
    ``steps``: one budget for all, or ``{n_layers: steps}``. ``callback(step, runs)`` runs after
    every evaluation (the chapter's live figure)."""
    recipe = recipe or MarkovRecipe()
    budget = steps if isinstance(steps, dict) else {n: steps for n in layers}
    for n in layers:
        if isinstance(budget.get(n), bool) or not isinstance(budget.get(n), int) or budget[n] < 1:
            raise ValueError(f"steps for the {n}-layer model must be a whole number >= 1, got {budget.get(n)!r}")
    runs, opts = {}, {}
    for n in layers:
        torch.manual_seed(seed)
        model = recipe.model_config(task, n).build()
        runs[n] = MarkovRun(n, model)
        opts[n] = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    ev_tokens, _ = task.sample(recipe.eval_size, EVAL_SEED)
    preds = task.predictors(ev_tokens)
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with torch.enable_grad():
            for step in range(max(budget.values()) + 1):
                if step % recipe.eval_every == 0:
                    for n, run in runs.items():
                        if step <= budget[n]:
                            row = evaluate_markov(run.model, ev_tokens, preds)
                            for key, val in {"step": step, **row}.items():
                                run.log[key].append(val)
                    if callback is not None:
                        callback(step, runs)
                if step == max(budget.values()):
                    break
                tokens, _ = task.sample(recipe.batch_size, seed * 100_003 + step)
                for n, run in runs.items():
                    if step >= budget[n]:
                        continue
                    logits = run.model.forward_checked(tokens)
                    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
                    opts[n].zero_grad(set_to_none=True)
                    loss.backward()
                    opts[n].step()
    finally:
        torch.set_num_threads(old)
    for run in runs.values():
        run.model.eval()
    return runs


def predictor_losses(task: MarkovChains, n: int = 256) -> dict[str, float]:
    """Each exact predictor's loss on the evaluation batch."""
    tokens, _ = task.sample(n, EVAL_SEED)
    return {p: cross_entropy(q, tokens) for p, q in task.predictors(tokens).items()}


def load_results(path: Path = RESULTS) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no Markov-chain results at {path}; run `make markov` to write them")
    return json.loads(path.read_text())


def _record(task, seed, runs, wall) -> dict:
    return {"k": task.k, "length": task.length, "alpha": task.alpha, "seed": seed, "wall_s": round(wall, 1),
            "predictor_loss": predictor_losses(task),
            "runs": {str(n): {"stages": stage_steps(r.log), **{k: [round(x, 4) for x in v] if k != "step" else v
                                                              for k, v in r.log.items()}}
                     for n, r in runs.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="chapter 13's Markov-chain runs: 2 and 1 layers, several seeds and k")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--ks", type=int, nargs="+", default=[3])
    ap.add_argument("--steps", type=int, nargs=2, default=[1000, 1500], metavar=("TWO_LAYERS", "ONE_LAYER"))
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    for k in args.ks:
        for seed in args.seeds:
            done = load_results(args.out)["runs"] if args.out.is_file() else []
            if any(r["k"] == k and r["seed"] == seed for r in done):
                continue
            task = MarkovChains(k=k)
            t0 = time.perf_counter()
            runs = train_markov(task, (2, 1), dict(zip((2, 1), args.steps)), seed)
            rec = _record(task, seed, runs, time.perf_counter() - t0)
            print(f"k={k} seed {seed}: 2 layers {rec['runs']['2']['stages']}, 1 layer {rec['runs']['1']['stages']} "
                  f"({rec['wall_s']:.0f} s)", flush=True)
            done = load_results(args.out)["runs"] if args.out.is_file() else []
            done = sorted([r for r in done if not (r["k"] == k and r["seed"] == seed)] + [rec], key=lambda r: (r["k"], r["seed"]))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            durable.write_text(args.out, json.dumps({"recipe": MarkovRecipe().__dict__, "steps": dict(zip(("2", "1"), args.steps)), "runs": done},
                                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
