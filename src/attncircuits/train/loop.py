"""The training loop: one function, :func:`train`, that every model of the course is trained by.

AdamW with linear warmup and cosine decay, fixed seeds, the device picked automatically (CUDA,
MPS or CPU), a tqdm bar with loss and tokens/s, and a history logged every ``eval_every`` steps:
train and validation loss and, for models with layers, each head's previous-token and
prefix-matching score and the loss on repeated random tokens. Output is a checkpoint directory
(see :mod:`attncircuits.checkpoints.pretrained`); nothing is pickled. The command line (argument
checks, output folders, Ctrl-C and ``--resume``) is :mod:`attncircuits.train.cli`.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from attncircuits import data
from attncircuits.data.split import TAIL_SUFFIX
from attncircuits.analysis.losses import in_context_learning_score, repeated_token_loss
from attncircuits.analysis.scores import prefix_matching_scores, previous_token_scores
from attncircuits.checkpoints.pretrained import CORPUS_DIR, save_corpus_files, state_dict_for_save
from attncircuits.core import devices, durable, validate
from attncircuits.models.transformer import ModelConfig
from attncircuits.models.parts import loss_fn
from attncircuits.models.transformer import Transformer



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



def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: no decay on the embedding (every model), nor on biases and LayerNorm gains
    (the models with them); decay on every other weight."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:  # fixed (chapter 10's sinusoidal positions)
            continue
        (no_decay if p is model.W_E or p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def step_memory_bytes(model_cfg: ModelConfig, batch_size: int) -> int:
    """A rough upper bound on one training step's memory: logits and attention patterns with their
    gradients (about four float32 copies each) and the residual stream's activations, plus weights,
    gradients and AdamW's two moments."""
    T, V, H, L = model_cfg.n_ctx, model_cfg.d_vocab, model_cfg.n_heads, model_cfg.n_layers
    per_row = 4 * T * V + 6 * L * H * T * T + 4 * T * (L + 1) * (model_cfg.d_model + 4 * H * model_cfg.d_head)
    per_row += 8 * T * L * getattr(model_cfg, "d_mlp", 0)  # chapter 10's MLPs
    params = 2 * V * model_cfg.d_model + 4 * L * H * model_cfg.d_model * model_cfg.d_head
    return 4 * (batch_size * per_row + 4 * params)


def memory_limit_bytes() -> int:
    """Half of this machine's physical memory (the rest is the system's and the notebook's)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): assume 8 GiB of RAM
        return 4 << 30


def pick_device(device: str | None = None) -> torch.device:
    """``device`` checked, or the best this machine has (:func:`attncircuits.core.devices.pick`)."""
    return devices.pick(device)


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def make_batch(tokens, cfg: TrainConfig, n_ctx: int, g: torch.Generator) -> torch.Tensor:
    """One training batch from the token stream ``tokens`` (any container of ids): windows of text,
    windows of text repeated, and random tokens repeated, in the proportions of ``cfg``."""
    stream = validate.token_ids(tokens, None, "tokens", ndim=1)
    if len(stream) < n_ctx:
        raise ValueError(f"the token stream has {len(stream)} tokens, fewer than n_ctx={n_ctx}")
    return make_batch_checked(stream, cfg, n_ctx, g, int(stream.max()) + 1)


def make_batch_checked(stream: torch.Tensor, cfg: TrainConfig, n_ctx: int, g: torch.Generator, d_vocab: int) -> torch.Tensor:
    """:func:`make_batch` for a checked stream (1-D int64, at least ``n_ctx`` ids; random tokens are
    drawn below ``d_vocab``): nothing is converted, scanned or read back, so a step waits for nothing."""
    n_rep = round(cfg.repeat_frac * cfg.batch_size)
    n_rand = round(cfg.random_repeat_frac * cfg.batch_size)
    parts = [data.random_windows_checked(stream, cfg.batch_size - n_rep - n_rand, n_ctx, g)]
    if n_rep:
        parts.append(data.repeated_windows_checked(stream, n_rep, n_ctx, g, 8, n_ctx // 2))
    if n_rand:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
        L = int(torch.randint(8, n_ctx // 2, (1,), generator=g))
        parts.append(data.repeated_rows(n_rand, L, n_ctx // L + 1, d_vocab, seed)[:, :n_ctx])
    return torch.cat(parts)


@torch.no_grad()
def evaluate(model: Transformer, val_batches: torch.Tensor) -> dict:
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


class TrainingDiverged(FloatingPointError):
    """The loss became NaN or infinite at ``step`` (learning rate ``lr``); the run stops there."""

    def __init__(self, step: int, lr: float, loss: float):
        super().__init__(f"training diverged at step {step}: the loss is {loss} at learning rate {lr:.3g}")
        self.step, self.lr, self.loss = step, lr, loss


def train(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    train_tokens: np.ndarray,
    val_tokens: np.ndarray,
    device: str | None = None,
    progress: bool = True,
    resume: dict | None = None,
    save_state: Callable[[dict], None] | None = None,
    callback: Callable[[int, Transformer, dict], bool | None] | None = None,
    patterns: Callable[[torch.Tensor], dict] | None = None,
) -> tuple[Transformer, dict, dict[int, dict]]:
    """Train a model; returns it, its history and the snapshots asked for in ``cfg``.

    ``save_state``, when given, receives everything a resumed run needs (weights, optimizer, RNG,
    history, snapshots) at every evaluation step and when Ctrl-C stops the run, which then raises
    :class:`TrainingInterrupted`; passing such a state as ``resume`` continues the run exactly
    where it stopped: on the same machine the result is bit-identical to an uninterrupted run.

    A NaN or infinite loss raises :class:`TrainingDiverged` naming its step and learning rate, at the
    next point where the loss is read (every 10th step with ``progress``, every evaluation), before
    any state is saved: the last state ``save_state`` received is then the last finite one.

    ``callback(step, model, row)`` runs after each evaluation (``row``: that step's history entries);
    when it returns True, training stops there (see ``live.py``).

    ``patterns(batch)``, when given, returns ``{(layer, head): pattern [batch, q, k]}`` that every
    training step's forward pass uses in place of those heads' own attention (the model's
    ``patterns=`` hook): chapter 13 clamps parts of the circuit this way (``clamps.py``). The
    history's evaluations run the model as it is.
    """
    cfg.check()
    dev = pick_device(device)
    torch.manual_seed(cfg.seed)
    model = model_cfg.build().to(dev)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)
    g = torch.Generator().manual_seed(cfg.seed)
    # The validation windows do not depend on the run's seed, so histories of runs with other
    # seeds are measured on the same text and compare (seed 0, the shipped runs', drew them with 1).
    val_g = torch.Generator().manual_seed(VALIDATION_SEED)
    n_ctx = model_cfg.n_ctx
    val_batches = torch.stack([data.random_windows(val_tokens, cfg.batch_size, n_ctx, val_g) for _ in range(cfg.eval_batches)])
    # The training stream is checked once, here: every step then slices it as it is.
    stream = validate.token_ids(train_tokens, model_cfg.d_vocab, "train_tokens", ndim=1)
    if len(stream) < n_ctx:
        raise ValueError(f"train_tokens has {len(stream)} tokens, fewer than n_ctx={n_ctx}; train on a longer text")
    stream_vocab = int(stream.max()) + 1
    history: dict = {"step": [], "tokens": [], "train_loss": [], "lr": [], "wall_s": []}
    snapshots: dict[int, dict] = {}
    # The loss's moving average stays on the device (float64 where the device has it), read back
    # only at evaluations and every 10th step for the bar: a training step waits for nothing.
    ema_dtype = torch.float32 if dev.type == "mps" else torch.float64
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
    ema_t = None if ema is None else torch.tensor(ema, dtype=ema_dtype, device=dev)
    # the first step whose loss was NaN or infinite, and that loss, kept on the device like the
    # moving average and read where it is: a diverged run stops there, before it saves a state
    bad_step = bad_loss = torch.tensor(-1.0, dtype=ema_dtype, device=dev)

    def ema_value() -> float | None:
        if int(bad_step) >= 0:
            raise TrainingDiverged(int(bad_step), lr_at(int(bad_step), cfg), float(bad_loss))
        return None if ema_t is None else float(ema_t)

    t0 = time.time() - wall0

    def state(step: int) -> dict:
        return {"step": step, "ema": ema_value(), "wall_s": time.time() - t0, "history": history, "snapshots": snapshots,
                "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                "optimizer": opt.state_dict()["state"], "generator": g.get_state(), "torch_rng": torch.get_rng_state()}

    bar = tqdm(range(start, cfg.steps + 1), disable=not progress, desc=f"{model_cfg.n_layers}L", mininterval=0.5,
               initial=start, total=cfg.steps + 1)
    # the first Ctrl-C only asks to stop at the next step boundary (so a state saved for --resume is
    # never half an optimizer step); a second one interrupts at once
    with durable.hold_signals((signal.SIGINT,)) as stop_requested:
        for step in bar:
            if stop_requested:
                if save_state is not None:
                    save_state(state(step))
                raise TrainingInterrupted(step)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                ema_value()
            if save_state is not None and step % cfg.eval_every == 0 and start < step < cfg.steps:
                save_state(state(step))
            if step in cfg.snapshot_steps:
                snapshots[step] = state_dict_for_save(model)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                ev = evaluate(model, val_batches)
                for key, val in {"step": step, "tokens": step * cfg.batch_size * n_ctx, "train_loss": ema_value(),
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
            batch = make_batch_checked(stream, cfg, n_ctx, g, stream_vocab).to(dev)
            clamp = None if patterns is None else patterns(batch)
            loss = loss_fn(model.forward_checked(batch, patterns=clamp), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            loss_t = loss.detach().to(ema_dtype)
            newly = ~torch.isfinite(loss_t) & (bad_step < 0)
            bad_step, bad_loss = torch.where(newly, step, bad_step), torch.where(newly, loss_t, bad_loss)
            ema_t = loss_t if ema_t is None else 0.98 * ema_t + 0.02 * loss_t
            if step % 10 == 0 and progress:
                tps = (step + 1 - start) * cfg.batch_size * n_ctx / (time.time() - t0 - wall0)
                bar.set_postfix(loss=f"{ema_value():.3f}", tok_s=f"{tps:,.0f}")
    history["tokens_per_s"] = step * cfg.batch_size * n_ctx / (time.time() - t0)
    model.eval()
    return model, history, snapshots


def prepare_corpus(vocab_size: int = data.DEFAULT_VOCAB_SIZE, directory: Path = CORPUS_DIR,
                   corpus: data.Corpus | None = None, tokenizer_path: Path | None = None) -> Path:
    """Train the tokenizer on ``corpus``'s training split (default: the standard-library corpus) and
    write it with the corpus files (tokenized validation split, training bigram counts,
    ``corpus.json``) into ``directory`` (default: the shipped ones, which ``make train`` rebuilds);
    with ``tokenizer_path``, that tokenizer is copied there instead of training one. Returns the
    tokenizer's path in ``directory``."""
    source = None if corpus is None else (f"{len({n.removesuffix(TAIL_SUFFIX) for n, _ in corpus.train + corpus.validation})} "
                                          f"local text files; held out for validation: {corpus.held_out}")
    corpus = corpus or data.load_corpus()
    t = time.time()
    directory.mkdir(parents=True, exist_ok=True)
    tok_path = directory / "tokenizer.json"
    if tokenizer_path is None:
        data.train_tokenizer([text for _, text in corpus.train], vocab_size).save(str(tok_path))
    elif Path(tokenizer_path).resolve() != tok_path.resolve():
        tok_path.write_bytes(Path(tokenizer_path).read_bytes())
    tok = data.load_tokenizer(tok_path)
    tr, va, _ = corpus_streams(tok, corpus)
    info = {
        "source": source or f"Python {sys.version.split()[0]} standard library (*.py, *.txt; test folders excluded)",
        "train_files": len(corpus.train), "validation_files": len(corpus.validation),
        "train_bytes": sum(len(x.encode()) for _, x in corpus.train),
        "validation_bytes": sum(len(x.encode()) for _, x in corpus.validation),
        "train_tokens": int(len(tr)), "validation_tokens": int(len(va)), "vocab_size": tok.get_vocab_size(),
        "validation_file_names": [n for n, _ in corpus.validation],
    }
    save_corpus_files(va, tr, info, directory)
    print(f"corpus: {corpus.describe()}; {len(tr):,} + {len(va):,} tokens; tokenizer in {time.time() - t:.1f}s")
    return tok_path
