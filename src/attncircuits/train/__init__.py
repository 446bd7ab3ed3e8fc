"""Training: one function and a CLI, ``python -m attncircuits.train --preset attn-only-2l``.

AdamW with linear warmup and cosine decay, fixed seeds, the device picked automatically (CUDA,
MPS or CPU), a tqdm bar with loss and tokens/s, and a history logged every ``eval_every`` steps:
train and validation loss and, for models with layers, each head's previous-token and
prefix-matching score and the loss on repeated random tokens. Output is a checkpoint directory
(see ``pretrained.py``); nothing is pickled. The command line (argument checks, output folders,
Ctrl-C and ``--resume``) is in ``train_cli.py``; ``train/__main__.py`` runs it, so that
``python -m attncircuits.train`` works while this module never imports the command line above it.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import data
from ..hooked import HookedConfig, build_model  # noqa: F401  (HookedConfig: a train() model_cfg type)
from ..losses import in_context_learning_score, repeated_token_loss
from ..model import AttnOnlyConfig, AttnOnlyTransformer, loss_fn
from ..pretrained import CORPUS_DIR, save_corpus_files, state_dict_for_save
from ..scores import prefix_matching_scores, previous_token_scores


@dataclass
class TrainConfig:
    steps: int = 8000
    batch_size: int = 16  # 16 x 128 = 2k tokens a step: many small steps beat few big ones on a CPU
    lr: float = 5e-3  # high for a transformer, fine for one this small with a unit-scale residual;
    # 3e-3 gave a previous-token head of only 0.24 after 2,750 steps, 5e-3 (with repeat_frac 0.5) 0.59
    warmup_steps: int = 200
    min_lr_frac: float = 0.1  # cosine decay ends at 10% of lr
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    # Fraction of each batch that is a window of real text repeated to fill the context. Natural
    # text repeats too rarely in 128 tokens for induction heads to pay off within a CPU budget;
    # with half the rows repeated, copying from context is worth learning early (0.3 was too slow).
    repeat_frac: float = 0.5
    # Fraction of rows that are uniformly random tokens repeated: every token of the vocabulary,
    # rare ones included, then has to be copied somewhere, so the OV circuits learn to copy all
    # tokens rather than only frequent ones. Measured on the 2-layer model: without these rows the
    # second copy of repeated random tokens kept 62% of the first copy's loss after 8k steps; with
    # 2 rows in 16, under half by step 3,250.
    random_repeat_frac: float = 0.125
    seed: int = 0
    eval_every: int = 250
    eval_batches: int = 16  # x batch_size windows of validation text per evaluation (ICL score needs many)
    snapshot_steps: list[int] = field(default_factory=list)

    def problems(self) -> list[tuple[str, str]]:
        """``(field, what is wrong)`` for every value that would fail or train nothing."""
        out = []

        def need(name: str, ok: bool, what: str) -> None:
            if not ok:
                out.append((name, f"must be {what} (got {getattr(self, name)!r})"))

        def finite(x) -> bool:
            return isinstance(x, (int, float)) and math.isfinite(x)

        for name in ("steps", "batch_size", "eval_every", "eval_batches"):
            need(name, isinstance(getattr(self, name), int) and getattr(self, name) >= 1, "a whole number >= 1")
        need("warmup_steps", isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "a whole number >= 0")
        need("seed", isinstance(self.seed, int) and 0 <= self.seed < 2**62, "a whole number >= 0")
        need("lr", finite(self.lr) and self.lr > 0, "a number > 0")
        need("grad_clip", finite(self.grad_clip) and self.grad_clip > 0, "a number > 0")
        need("weight_decay", finite(self.weight_decay) and self.weight_decay >= 0, "a number >= 0")
        for name in ("min_lr_frac", "repeat_frac", "random_repeat_frac"):
            need(name, finite(getattr(self, name)) and 0 <= getattr(self, name) <= 1, "between 0 and 1")
        if not out and round(self.repeat_frac * self.batch_size) + round(self.random_repeat_frac * self.batch_size) > self.batch_size:
            out.append(("repeat_frac", f"plus random_repeat_frac must be at most 1 (got {self.repeat_frac} + {self.random_repeat_frac})"))
        bad = [s for s in self.snapshot_steps if not (isinstance(s, int) and 0 <= s <= self.steps)]
        if bad and finite(self.steps):
            out.append(("snapshot_steps", f"must lie between 0 and steps={self.steps} (got {bad})"))
        return out

    def check(self) -> None:
        """Raise a ValueError naming every bad value (the CLI reports each as its flag)."""
        if problems := self.problems():
            raise ValueError("; ".join(f"TrainConfig.{name} {what}" for name, what in problems))


VALIDATION_SEED = 1  # the validation windows of every run's history, whatever its seed

PRESETS: dict[str, tuple[dict, dict]] = {
    # A zero-layer model sees only the current token, so repeated rows cannot help it and would
    # only blur its bigram statistics: it trains on plain text, to be compared with the bigram table.
    "attn-only-0l": ({"n_layers": 0}, {"repeat_frac": 0.0, "random_repeat_frac": 0.0}),
    # The 1- and 2-layer models share one recipe, so they differ in nothing but depth.
    "attn-only-1l": ({"n_layers": 1}, {}),
    # Snapshots before, during and after the induction heads form (steps ~1,750-3,500).
    "attn-only-2l": ({"n_layers": 2}, {"snapshot_steps": [0, 1000, 1500, 2000, 2500, 3000, 4000, 6000]}),
    # Induction heads formed live in chapter 7 (attncircuits.live, which builds its token streams),
    # in a few minutes at most on a 2-core CPU. Each choice against the shipped 2-layer recipe:
    "attn-only-2l-live": (
        {"n_layers": 2,
         # the 255 most frequent BPE tokens and one id for all others (live.vocab_map): the
         # unembedding is most of a step at 2048 ids; 256 makes a step ~2x cheaper here
         "d_vocab": 256,
         # room for repeats at distances 8..31 and for the scores (4 copies of 15 tokens)
         "n_ctx": 64},
        {"steps": 1500,  # a budget 3x the ~450 steps the heads take, so the run ends by its targets
         # constant after warm-up: the shipped cosine squeezed into 2,500 steps formed nothing,
         # because the rate had decayed by the time the heads would form; 1e-2 formed nothing
         # in 2,400 steps, 5e-3 formed them by step 600
         "lr": 5e-3, "warmup_steps": 100, "min_lr_frac": 1.0,
         # three quarters of each batch random tokens repeated: copying is the only way to
         # predict them, so the heads pay off from the first step (a quarter: 900 steps, a half:
         # 600, three quarters: 450); the rest real text, half of it repeated
         "repeat_frac": 0.125, "random_repeat_frac": 0.75,
         # scores every 25 steps (~2 steps' cost each) for the figure and the stopping rule;
         # 2 validation batches are enough for the loss, the targets are on random tokens
         "eval_every": 25, "eval_batches": 2},
    ),
    # Recipes tried (2 layers, d_model 128 = 4 x 32, 16 rows a step, lr 5e-3 constant after 100
    # warm-up steps, 1 thread, seed 0; V d_vocab, T n_ctx, P repeat_frac, R random_repeat_frac;
    # steps to prefix matching >= 0.5 / to 2nd copy <= 1/2 of the 1st):
    #   shipped attn-only-2l, V 2048 T 128 P .5 R .125, cosine over 8,000:  2,750 / 3,250
    #   the same with --steps 2500 (cosine compressed):        never (pm 0.08 at 2,500)
    #   V 256 T 64 P .5   R .25                                  750 /   900
    #   V 256 T 64 P .25  R .5                                   550 /   600
    #   V 256 T 64 P .125 R .75  (this preset)                   400 /   450
    #   V 256 T 64 P .25  R .5,  lr 1e-2                       never (pm 0.06 at 2,400)
    #   V 256 T 64 P .25  R .5,  d_model 64 = 4 x 16           1,150 / 1,300
    #   V 256 T 64 P .125 R .75, 8 rows a step                   700 /   900 (same tokens)
    #   V 2048 T 64 P .125 R .75                                never (pm 0.07 at 1,200)
    #   one layer, P .25 R .5 / P .125 R .75, 1,500 steps      never (pm 0.06 / 0.07)
    # With eval_every 25 the preset stops at step 425 (0.44 M tokens): on a fresh clone, on a
    # 2-core machine busy with other jobs, 68 s of training at 6,413 tokens/s + 9 s of data.
    # a seconds-long run for the first chapter and the tests
    # Chapter 10: pre-LayerNorm blocks with GELU MLPs (a TransformerLens HookedTransformer), four
    # layers, the same tokenizer, corpus, context, positions (shortformer: in queries and keys only),
    # batch size and rate as the 2-layer model. A step costs ~3x the 2-layer model's on a CPU, so
    # 5,000 steps instead of 8,000, with the cosine ending at 30% of the rate instead of 10% (a
    # schedule squeezed to fewer steps decays before the heads form: chapter 7's recipe search);
    # a quarter of the rows random tokens repeated instead of an eighth (taken from the text
    # repeats: the plain-text share stays 3/8), which that search found brings the heads earlier.
    # Tried first: positions added to the residual stream and the cosine to 10%: no induction
    # head by step 2,750 (prefix matching 0.04, previous-token 0.16).
    "ln-mlp-4l": ({"architecture": "hooked-ln-mlp", "n_layers": 4, "d_mlp": 512,
                   "positional_embedding_type": "shortformer"},
                  {"steps": 5000, "min_lr_frac": 0.3, "repeat_frac": 0.375, "random_repeat_frac": 0.25,
                   "snapshot_steps": [0, 500, 1000, 1500, 2000, 2500, 3500]}),
    "tiny": ({"n_layers": 1, "d_model": 32, "n_heads": 2, "d_head": 16, "n_ctx": 64}, {"steps": 60, "eval_every": 20}),
}


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: no decay on the embedding (every model), nor on biases and LayerNorm gains
    (the models with them); decay on every other weight."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (no_decay if p is model.W_E or p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def make_batch(tokens, cfg: TrainConfig, n_ctx: int, g: torch.Generator) -> torch.Tensor:
    n_rep = round(cfg.repeat_frac * cfg.batch_size)
    n_rand = round(cfg.random_repeat_frac * cfg.batch_size)
    parts = [data.random_windows(tokens, cfg.batch_size - n_rep - n_rand, n_ctx, g)]
    if n_rep:
        parts.append(data.repeated_windows(tokens, n_rep, n_ctx, g))
    if n_rand:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
        L = int(torch.randint(8, n_ctx // 2, (1,), generator=g))
        rows = data.repeated_random_tokens(n_rand, L, n_ctx // L + 1, n_ctx=None, seed=seed,
                                           d_vocab=int(tokens.max()) + 1)[:, :n_ctx]
        parts.append(rows)
    return torch.cat(parts)


@torch.no_grad()
def evaluate(model: AttnOnlyTransformer, val_batches: torch.Tensor) -> dict:
    model.eval()
    dev = model.W_E.device
    out = {"val_loss": float(np.mean([loss_fn(model(b.to(dev)), b.to(dev)).item() for b in val_batches]))}
    out["icl_score"] = in_context_learning_score(model, val_batches.flatten(0, 1).to(dev))
    if model.cfg.n_layers:
        out["prev_token"] = previous_token_scores(model, val_batches[0].to(dev)).tolist()
        # Olsson's 25 random tokens x 4 copies; shorter copies when the context is too small
        out["prefix_matching"] = prefix_matching_scores(model, seq_len=min(25, (model.cfg.n_ctx - 1) // 4)).tolist()
        rl = repeated_token_loss(model)
        out["repeated_loss_first"], out["repeated_loss_second"] = rl.first, rl.second
    model.train()
    return out


def _summary(step: int, ev: dict) -> str:
    line = f"step {step:>6}: val loss {ev['val_loss']:.3f}, ICL {ev['icl_score']:+.2f}"
    if "prev_token" in ev:
        line += (f", best prev-token {max(max(r) for r in ev['prev_token']):.2f}"
                 f", best prefix-matching {max(max(r) for r in ev['prefix_matching']):.2f}"
                 f", repeated tokens loss {ev['repeated_loss_first']:.2f} -> {ev['repeated_loss_second']:.2f}")
    return line


def corpus_streams(tokenizer, corpus: data.Corpus | None = None) -> tuple[np.ndarray, np.ndarray, data.Corpus]:
    """Training and validation token streams of ``corpus`` (default: the standard-library corpus)."""
    corpus = corpus or data.load_corpus()
    return data.tokenize_documents(tokenizer, corpus.train), data.tokenize_documents(tokenizer, corpus.validation), corpus


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`train` between two steps; ``step`` is the first step not taken."""

    def __init__(self, step: int):
        super().__init__(f"training interrupted before step {step}")
        self.step = step


@contextmanager
def _stop_between_steps():
    """While training, the first Ctrl-C only asks to stop at the next step boundary (so the state
    saved for ``--resume`` is never half an optimizer step); a second one interrupts at once."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum, frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def train(
    model_cfg: AttnOnlyConfig,
    cfg: TrainConfig,
    train_tokens: np.ndarray,
    val_tokens: np.ndarray,
    device: str | None = None,
    progress: bool = True,
    resume: dict | None = None,
    save_state: Callable[[dict], None] | None = None,
    callback: Callable[[int, AttnOnlyTransformer, dict], bool | None] | None = None,
) -> tuple[AttnOnlyTransformer, dict, dict[int, dict]]:
    """Train a model; returns it, its history and the snapshots asked for in ``cfg``.

    ``save_state``, when given, receives everything a resumed run needs (weights, optimizer, RNG,
    history, snapshots) at every evaluation step and when Ctrl-C stops the run, which then raises
    :class:`TrainingInterrupted`; passing such a state as ``resume`` continues the run exactly
    where it stopped: on the same machine the result is bit-identical to an uninterrupted run.

    ``callback(step, model, row)`` runs after each evaluation (``row``: that step's history entries);
    when it returns True, training stops there (see ``live.py``).
    """
    cfg.check()
    dev = pick_device(device)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg).to(dev)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
    g = torch.Generator().manual_seed(cfg.seed)
    # The validation windows do not depend on the run's seed, so histories of runs with other
    # seeds are measured on the same text and compare (seed 0, the shipped runs', drew them with 1).
    val_g = torch.Generator().manual_seed(VALIDATION_SEED)
    n_ctx = model_cfg.n_ctx
    val_batches = torch.stack([data.random_windows(val_tokens, cfg.batch_size, n_ctx, val_g) for _ in range(cfg.eval_batches)])
    history: dict = {"step": [], "tokens": [], "train_loss": [], "lr": [], "wall_s": []}
    snapshots: dict[int, dict] = {}
    start, ema, wall0 = 0, None, 0.0
    if resume is not None:
        start, ema, wall0 = resume["step"], resume["ema"], resume["wall_s"]
        model.load_state_dict(resume["model"])
        opt_state = opt.state_dict()
        opt_state["state"] = resume["optimizer"]
        opt.load_state_dict(opt_state)
        g.set_state(resume["generator"])
        torch.set_rng_state(resume["torch_rng"])
        history = {k: list(v) for k, v in resume["history"].items()}
        snapshots = dict(resume["snapshots"])
    t0 = time.time() - wall0

    def state(step: int) -> dict:
        return {"step": step, "ema": ema, "wall_s": time.time() - t0, "history": history, "snapshots": snapshots,
                "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                "optimizer": opt.state_dict()["state"], "generator": g.get_state(), "torch_rng": torch.get_rng_state()}

    bar = tqdm(range(start, cfg.steps + 1), disable=not progress, desc=f"{model_cfg.n_layers}L", mininterval=0.5,
               initial=start, total=cfg.steps + 1)
    with _stop_between_steps() as stop_requested:
        for step in bar:
            if stop_requested.is_set():
                if save_state is not None:
                    save_state(state(step))
                raise TrainingInterrupted(step)
            if save_state is not None and step % cfg.eval_every == 0 and start < step < cfg.steps:
                save_state(state(step))
            if step in cfg.snapshot_steps:
                snapshots[step] = state_dict_for_save(model)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                ev = evaluate(model, val_batches)
                for key, val in {"step": step, "tokens": step * cfg.batch_size * n_ctx, "train_loss": ema,
                                 "lr": lr_at(step, cfg), "wall_s": time.time() - t0, **ev}.items():
                    history.setdefault(key, []).append(val)
                if progress:
                    bar.write(_summary(step, ev))
                if callback is not None and callback(step, model, {k: v[-1] for k, v in history.items()}):
                    break
            if step == cfg.steps:
                continue  # the last step only evaluates; the bar then ends at its total
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            batch = make_batch(train_tokens, cfg, n_ctx, g).to(dev)
            loss = loss_fn(model(batch), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
            if step % 10 == 0:
                tps = (step + 1 - start) * cfg.batch_size * n_ctx / (time.time() - t0 - wall0)
                bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{tps:,.0f}")
    history["tokens_per_s"] = step * cfg.batch_size * n_ctx / (time.time() - t0)
    model.eval()
    return model, history, snapshots


def prepare_corpus(vocab_size: int = data.DEFAULT_VOCAB_SIZE, directory: Path = CORPUS_DIR) -> Path:
    """Train the tokenizer on the default corpus and write the corpus files into ``directory``
    (default: the shipped ones, which ``make train`` rebuilds); returns the tokenizer's path."""
    corpus = data.load_corpus()
    t = time.time()
    tok = data.train_tokenizer([text for _, text in corpus.train], vocab_size)
    directory.mkdir(parents=True, exist_ok=True)
    tok_path = directory / "tokenizer.json"
    tok.save(str(tok_path))
    tr, va, _ = corpus_streams(tok, corpus)
    info = {
        "source": f"Python {sys.version.split()[0]} standard library (*.py, *.txt; test folders excluded)",
        "train_files": len(corpus.train), "validation_files": len(corpus.validation),
        "train_bytes": sum(len(x.encode()) for _, x in corpus.train),
        "validation_bytes": sum(len(x.encode()) for _, x in corpus.validation),
        "train_tokens": int(len(tr)), "validation_tokens": int(len(va)), "vocab_size": vocab_size,
        "validation_file_names": [n for n, _ in corpus.validation],
    }
    save_corpus_files(va, tr, info, directory)
    print(f"corpus: {corpus.describe()}; {len(tr):,} + {len(va):,} tokens; tokenizer in {time.time() - t:.1f}s")
    return tok_path
