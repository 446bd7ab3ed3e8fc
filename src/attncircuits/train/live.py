"""Watch induction heads form: a two-layer model trained live, in minutes, on a laptop CPU.

:func:`live_train` trains the ``attn-only-2l-live`` preset of :mod:`attncircuits.train` from random weights with
``train.train``'s own loop. Every ``eval_every`` steps a callback reads the scores the loop has just
measured (the best layer-0 previous-token head, the best last-layer prefix-matching head, the loss
on the first and second copy of repeated random tokens), redraws a figure in place and stops the
run once both targets are met: a prefix-matching score of at least 0.5 and a second copy that
costs at most half of the first.

The preset reads a small vocabulary: the shipped BPE tokens ranked by how often they occur in the
training split, the most frequent ``d_vocab - 1`` kept and all others merged into one id. The
unembedding is most of a step's cost at 2048 tokens, so this makes every step several times
cheaper while repeated text still repeats.

Every number a learner can change is checked before the first step: the context must hold the
repeats the scores need, one step must fit in memory and the whole step budget in ``max_minutes``
(measured on this machine); each failure says which limit it hit and what would fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from attncircuits import data
from attncircuits.checkpoints.pretrained import (
    CORPUS_DIR,
    load_train_bigram_counts,
    load_validation_tokens,
    validation_windows,
)
from attncircuits.analysis import definitions as D
from attncircuits.analysis.quantities import HISTORY_WINDOWS
from attncircuits.core import validate
from attncircuits.models.transformer import ModelConfig
from attncircuits.models.parts import loss_fn
from attncircuits.models.transformer import Transformer
from attncircuits.show.plotting.base import MAX_WIDTH_IN, place_legend
from attncircuits.train.loop import (  # noqa: F401 (re-exported)
    TrainConfig,
    evaluate,
    make_batch,
    memory_limit_bytes,
    step_memory_bytes,
    train,
)
from attncircuits.train.presets import PRESETS

LIVE_PRESET = "attn-only-2l-live"
TARGET_PREFIX_MATCHING = D.FORMED.value  # "formed" (analysis.definitions): half the weight after the match
TARGET_COPY_RATIO = 0.5  # the second copy of random tokens costs at most half the first
MIN_REPEAT = 8  # the shortest repeat in training batches (train.make_batch, data.repeated_windows)


# ---- data ---------------------------------------------------------------------------------------
def vocab_map(d_vocab: int) -> np.ndarray:
    """``new_id[old_id]``: the shipped tokens ranked by training-split frequency (``<|endoftext|>``
    stays 0), the ``d_vocab - 1`` most frequent kept, every rarer token merged into id ``d_vocab - 1``."""
    n = data.DEFAULT_VOCAB_SIZE
    if not 2 <= d_vocab <= n:
        raise ValueError(f"d_vocab={d_vocab} must be between 2 and the shipped vocabulary's {n}")
    prev, _, count = load_train_bigram_counts(CORPUS_DIR)  # the live run reads the shipped corpus, whatever the set
    freq = np.bincount(prev.numpy(), weights=count.numpy(), minlength=n)
    freq[0] = np.inf  # the document separator keeps id 0
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(-freq, kind="stable")] = np.arange(n)
    return np.minimum(rank, d_vocab - 1).astype(np.uint16)


def live_streams(d_vocab: int, file_stride: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Training tokens (every ``file_stride``-th file of the standard-library training split, a few
    seconds to tokenize) and the shipped validation tokens, both mapped by :func:`vocab_map`."""
    corpus = data.load_corpus()
    tok = data.load_tokenizer(CORPUS_DIR / "tokenizer.json")
    new = vocab_map(d_vocab)
    train_tokens = data.tokenize_documents(tok, corpus.train[::file_stride])
    return new[train_tokens], new[load_validation_tokens(CORPUS_DIR).numpy()]


def live_text(model: Transformer, n_windows: int = 64) -> torch.Tensor:
    """``n_windows`` validation windows of ``model``'s context, in its vocabulary (for the
    previous-token score of a live model)."""
    new = torch.from_numpy(vocab_map(model.cfg.d_vocab).astype(np.int64))
    return new[validation_windows(n_windows, model.cfg.n_ctx, CORPUS_DIR)]


def live_token_strs(ids, d_vocab: int = 256) -> list[str]:
    """Each id of a live model's vocabulary (:func:`vocab_map`) as readable text: the shipped token
    it stands for, or ``<rare>`` for the last id, which every rarer token shares."""
    new = vocab_map(d_vocab)
    old = np.full(d_vocab, -1, dtype=np.int64)
    kept = new < d_vocab - 1
    old[new[kept]] = np.nonzero(kept)[0]
    tok = data.load_tokenizer(CORPUS_DIR / "tokenizer.json")
    ids = torch.as_tensor(ids).flatten().tolist()
    return ["<rare>" if old[i] < 0 else data.token_str(tok, int(old[i])) for i in ids]


# ---- checks before the first step ---------------------------------------------------------------
def min_context() -> int:
    """The shortest context the live scores fit in: four copies of ``MIN_REPEAT`` tokens + start."""
    return 4 * MIN_REPEAT + 1


def check_live_config(model_cfg: ModelConfig, cfg: TrainConfig, memory_limit: int | None = None) -> None:
    """Raise a ValueError naming the limit when the numbers cannot give a live run."""
    if model_cfg.n_layers < 1:
        raise ValueError("n_layers must be at least 1: a model without attention layers has no heads to score")
    if model_cfg.n_ctx < min_context():
        raise ValueError(
            f"n_ctx={model_cfg.n_ctx} is too short: the scores need four copies of at least {MIN_REPEAT} "
            f"random tokens after a start token, so n_ctx >= {min_context()}"
        )
    if model_cfg.d_vocab < 3:
        raise ValueError(f"d_vocab={model_cfg.d_vocab} is too small: random tokens need at least 3 ids")
    cfg.check()  # every training setting, as `make train` checks it
    if cfg.eval_every > cfg.steps:
        raise ValueError(f"eval_every={cfg.eval_every} is more than steps={cfg.steps}: the figure would get no point; use eval_every <= {cfg.steps}")
    limit = memory_limit_bytes() if memory_limit is None else memory_limit
    need = step_memory_bytes(model_cfg, cfg.batch_size)
    if need > limit:
        fixed, per_row = step_memory_bytes(model_cfg, 0), step_memory_bytes(model_cfg, 1) - step_memory_bytes(model_cfg, 0)
        fix = f"use batch_size <= {(limit - fixed) // per_row}" if limit - fixed >= per_row else "use a smaller model"
        raise ValueError(
            f"one step of batch_size={cfg.batch_size} x n_ctx={model_cfg.n_ctx} needs about {need / 2**30:.2f} GiB, "
            f"more than the {limit / 2**30:.2f} GiB allowed (half this machine's memory); {fix}"
        )


@torch.no_grad()
def _eval_seconds(model: Transformer, val_batches: torch.Tensor) -> float:
    t = time.perf_counter()
    evaluate(model, val_batches)
    return time.perf_counter() - t


def estimate_seconds(model_cfg: ModelConfig, cfg: TrainConfig, train_tokens, val_tokens, n_steps: int = 3) -> tuple[float, float]:
    """(seconds for the whole step budget, training tokens/s), timed on a throwaway model here:
    ``n_steps`` forward and backward passes (after one warm-up) and one evaluation."""
    torch.manual_seed(cfg.seed)
    model = Transformer(model_cfg)
    g = torch.Generator().manual_seed(cfg.seed)
    batches = [make_batch(train_tokens, cfg, model_cfg.n_ctx, g) for _ in range(n_steps + 1)]
    for i, batch in enumerate(batches):
        if i == 1:
            t = time.perf_counter()
        loss_fn(model(batch), batch).backward()
    step_s = (time.perf_counter() - t) / n_steps * 1.15  # + the optimizer step and the batch
    val = torch.stack([data.random_windows(val_tokens, cfg.batch_size, model_cfg.n_ctx, g) for _ in range(cfg.eval_batches)])
    total = cfg.steps * step_s + (cfg.steps // cfg.eval_every + 1) * _eval_seconds(model, val)
    return total, cfg.batch_size * model_cfg.n_ctx / step_s


# ---- the figure ----------------------------------------------------------------------------------
class LiveFigure:
    """Progress bar on top, then the best heads' scores and the repeated-token losses over steps.
    In IPython it is displayed once and redrawn in place (one output, its last state kept)."""

    def __init__(self, steps: int, n_layers: int, min_redraw_s: float = 2.0):
        self.steps, self.n_layers, self.min_redraw_s = steps, n_layers, min_redraw_s
        self.fig = plt.figure(figsize=(MAX_WIDTH_IN, 5.2), layout="constrained")  # the column
        gs = self.fig.add_gridspec(3, 1, height_ratios=[0.25, 1, 1])
        self.ax_bar, self.ax_score = self.fig.add_subplot(gs[0]), self.fig.add_subplot(gs[1])
        self.ax_loss = self.fig.add_subplot(gs[2], sharex=self.ax_score)
        self.handle, self._last = None, -float("inf")
        plt.close(self.fig)  # never shown by the inline backend; only through the display handle

    def show(self) -> None:
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            return
        if get_ipython() is not None:
            self.handle = display(self.fig, display_id=True)

    def update(self, log: dict, done: bool = False, note: str = "") -> None:
        if not done and time.perf_counter() - self._last < self.min_redraw_s:
            return
        self._last = time.perf_counter()
        self.draw(log, note)
        if self.handle is not None:
            self.handle.update(self.fig)

    def draw(self, log: dict, note: str = "") -> None:
        steps = log["step"]
        last = self.n_layers - 1
        self.ax_bar.clear()
        self.ax_bar.barh([0], [steps[-1]], color="tab:green", height=1)
        self.ax_bar.set(xlim=(0, self.steps), ylim=(-0.5, 0.5), yticks=[])
        self.ax_bar.tick_params(labelsize=7)
        self.ax_bar.set_title(f"step {steps[-1]:,} of {self.steps:,}, {log['wall_s'][-1]:.0f} s{note}", fontsize=9)
        self.ax_score.clear()
        self.ax_score.plot(steps, log["prefix_matching"], marker=".", label=f"best layer-{last} prefix matching")
        self.ax_score.plot(steps, log["prev_token"], marker=".", label="best layer-0 previous token")
        self.ax_score.axhline(TARGET_PREFIX_MATCHING, color="grey", linestyle=":", linewidth=1)
        self.ax_score.set(ylim=(0, 1), ylabel="head score")
        self.ax_loss.clear()
        self.ax_loss.plot(steps, log["first"], marker=".", label="1st copy")
        self.ax_loss.plot(steps, log["second"], marker=".", label="2nd copy")
        self.ax_loss.set(xlabel="training step", ylabel="loss on repeated\nrandom tokens (nats)")
        for key, label in (("formed_step", "heads formed"),):
            if log.get(key) is not None:
                for ax in (self.ax_score, self.ax_loss):
                    ax.axvline(log[key], color="tab:red", linestyle="--", linewidth=1)
                self.ax_score.annotate(f"{label} (step {log[key]:,})", (log[key], 0.9), color="tab:red", fontsize=8,
                                       xytext=(-4, 0), textcoords="offset points", ha="right")
        for ax in (self.ax_score, self.ax_loss):
            place_legend(ax, fontsize=7)  # inside where it covers no point, else beside the axes


# ---- the run -------------------------------------------------------------------------------------
@dataclass
class LiveRun:
    """What :func:`live_train` returns: the trained model, one row per evaluation in ``log`` and the
    moment both targets were first met (``formed_step``, None if never)."""

    model: Transformer
    log: dict
    formed_step: int | None
    wall_s: float
    prep_s: float
    tokens_per_s: float
    history: dict = field(repr=False)
    figure: Figure | None = field(repr=False)

    @property
    def reached(self) -> bool:
        return self.formed_step is not None

    def summary(self) -> str:
        last = {k: v[-1] for k, v in self.log.items() if isinstance(v, list)}
        when = f"formed at step {self.formed_step:,}" if self.reached else "not formed"
        return (f"heads {when}; {last['step']:,} steps in {self.wall_s:.0f} s "
                f"(+{self.prep_s:.0f} s data), {self.tokens_per_s:,.0f} tokens/s\n"
                f"at the last of {HISTORY_WINDOWS}:\n"
                f"prefix matching {last['prefix_matching']:.2f}, previous token "
                f"{last['prev_token']:.2f}, copies {last['first']:.2f} -> {last['second']:.2f} nats")


def live_configs(**overrides) -> tuple[ModelConfig, TrainConfig]:
    """The live preset with ``overrides`` (any ModelConfig or TrainConfig field, e.g. ``n_layers=1``)."""
    model_kw, train_kw = PRESETS[LIVE_PRESET]
    model_names = {f.name for f in fields(ModelConfig)}
    train_names = {f.name for f in fields(TrainConfig)}
    unknown = set(overrides) - model_names - train_names
    if unknown:
        raise TypeError(f"unknown setting {sorted(unknown)}; model: {sorted(model_names)}; training: {sorted(train_names)}")
    model_kw = {**model_kw, **{k: v for k, v in overrides.items() if k in model_names}}
    train_kw = {**train_kw, **{k: v for k, v in overrides.items() if k in train_names}}
    return ModelConfig(**model_kw), TrainConfig(**train_kw)


def live_train(
    max_minutes: float | None = 30.0,
    plot: bool = True,
    stop_at_targets: bool = True,
    threads: int | None = 1,
    streams: tuple[np.ndarray, np.ndarray] | None = None,
    **overrides,
) -> LiveRun:
    """Train the live preset (changed by ``overrides``) from random weights and watch it.

    Checks everything before the first step (see :func:`check_live_config`); with ``max_minutes``,
    also that the whole step budget fits in that many minutes at the speed measured here. Stops at
    the first evaluation where both targets are met (unless ``stop_at_targets=False``). ``threads``
    sets torch's CPU threads for the run only (None: leave them). One by default: a model this small
    gains little from a second thread, and on a busy 2-core machine two threads waiting on each other
    ran 20x slower (323 vs 6,475 tokens/s). ``streams`` (train, validation tokens) skips the data
    preparation."""
    model_cfg, cfg = live_configs(**overrides)
    check_live_config(model_cfg, cfg)
    threads = None if threads is None else validate.count(threads, "threads")
    max_minutes = None if max_minutes is None else validate.number(max_minutes, "max_minutes", 0, above=True)
    old_threads, old_grad = torch.get_num_threads(), torch.is_grad_enabled()
    if threads:
        torch.set_num_threads(threads)
    torch.set_grad_enabled(True)  # a chapter may have switched gradients off for its analysis
    try:
        t0 = time.perf_counter()
        train_tokens, val_tokens = streams if streams is not None else live_streams(model_cfg.d_vocab)
        if int(max(train_tokens.max(), val_tokens.max())) >= model_cfg.d_vocab:
            raise ValueError(f"the token streams hold ids up to {int(train_tokens.max())}, outside d_vocab={model_cfg.d_vocab}; "
                             "build them with live_streams(d_vocab)")
        if min(len(train_tokens), len(val_tokens)) < model_cfg.n_ctx:
            raise ValueError(f"n_ctx={model_cfg.n_ctx} is longer than the token streams ({len(val_tokens)} validation tokens)")
        if max_minutes is not None:
            est, tps = estimate_seconds(model_cfg, cfg, train_tokens, val_tokens)
            if est > 60 * max_minutes:
                fit = int(cfg.steps * 60 * max_minutes / est)
                raise ValueError(
                    f"{cfg.steps:,} steps of {cfg.batch_size} x {model_cfg.n_ctx} tokens would take about {est / 60:.1f} min "
                    f"here ({tps:,.0f} tokens/s), over max_minutes={max_minutes}; use steps <= {fit:,} or raise max_minutes"
                )
        prep_s = time.perf_counter() - t0
        return _run(model_cfg, cfg, train_tokens, val_tokens, plot, stop_at_targets, prep_s)
    finally:
        torch.set_num_threads(old_threads)
        torch.set_grad_enabled(old_grad)


def _run(model_cfg, cfg, train_tokens, val_tokens, plot, stop_at_targets, prep_s) -> LiveRun:
    log: dict = {"step": [], "wall_s": [], "prev_token": [], "prefix_matching": [], "first": [], "second": [], "formed_step": None}
    fig = LiveFigure(cfg.steps, model_cfg.n_layers) if plot else None
    if fig is not None:
        fig.show()

    def on_eval(step: int, model: Transformer, row: dict) -> bool:
        for key, val in (("step", step), ("wall_s", row["wall_s"]), ("prev_token", max(row["prev_token"][0])),
                         ("prefix_matching", max(row["prefix_matching"][-1])),
                         ("first", row["repeated_loss_first"]), ("second", row["repeated_loss_second"])):
            log[key].append(val)
        met = log["prefix_matching"][-1] >= TARGET_PREFIX_MATCHING and log["second"][-1] <= TARGET_COPY_RATIO * log["first"][-1]
        if met and log["formed_step"] is None:
            log["formed_step"] = step
        if fig is not None:
            fig.update(log)
        return met and stop_at_targets

    model, history, _ = train(model_cfg, cfg, train_tokens, val_tokens, device="cpu", progress=False, callback=on_eval)
    wall = log["wall_s"][-1]
    if fig is not None:
        note = f": heads formed at step {log['formed_step']:,}" if log["formed_step"] is not None else ": no induction heads yet"
        fig.update(log, done=True, note=note)
    tps = log["step"][-1] * cfg.batch_size * model_cfg.n_ctx / max(wall, 1e-9)
    return LiveRun(model, log, log["formed_step"], wall, prep_s, tps, history, fig.fig if fig else None)
