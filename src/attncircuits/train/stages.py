"""``make stages``: chapter 14's runs. A 2-layer attention-only model trained from step 0 with dense
snapshots, for several seeds, and a 1-layer model on the same recipe as the control; at every
snapshot the LLC (devinterp, :mod:`attncircuits.analysis.llc`), the Hessian's trace, the loss, the
detectors and the outputs for essential dynamics; one small JSON file per run in
``checkpoints/shipped/stages/``.

The recipe is chapter 7's live preset (``attn-only-2l-live``: 256 token ids, 64-token contexts,
a constant rate after warm-up, three quarters of each batch random tokens repeated), run for its
first 1,000 steps instead of stopping at its targets. Why not the shipped 8,000-step recipe:
it takes about 15 minutes a run on an idle core, and its LLC estimates about 30 s each at 2,048 ids
and 128 positions; 30 checkpoints of three seeds and a control would be hours. The live recipe forms
its induction heads by step ~450, trains in minutes and samples in seconds a checkpoint, so one
seed, training and sampling, fits in a few minutes. What it costs: its text is a quarter of each
batch, so the stages that need text (n-grams beyond bigrams) have less to learn from; chapter 14
says so in its table against Hoogland et al.'s stages.

    python -m attncircuits.train.stages --seeds 0 1 2 --layers 2
    python -m attncircuits.train.stages --seeds 0 --layers 1

A run whose file exists is skipped (``--overwrite`` redoes it), so the command resumes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from attncircuits.analysis import llc as L
from attncircuits.analysis import losses
from attncircuits.analysis import scores as S
from attncircuits.analysis import stages as ST
from attncircuits.checkpoints.pretrained import load_pretrained, validation_windows
from attncircuits.core import durable
from attncircuits.models.parts import loss_fn
from attncircuits.train.live import live_configs, live_streams, live_text
from attncircuits.train.loop import make_batch, train

OUT = Path(__file__).resolve().parents[1] / "checkpoints" / "shipped" / "stages"
#: a folder of other results for chapter 14 to read (``make stages`` run with ``--out``)
ENV = "ATTNCIRCUITS_STAGES"
STEPS = 1000  # the heads form by step ~450; the rest is what follows them
#: dense where the bigram stage and the heads' rise are (the first ~500 steps), every 50 after
SNAPSHOTS = [0, 10, 20, 30, 40, 50, 60, 75, 90, 100, 125, 150, 175, 200, 250, 300, 350, 400, 450, 500, 550, 600,
             650, 700, 750, 800, 850, 900, 950, 1000]  # 30 checkpoints
#: the sampler at every checkpoint: chapter 14's calibration (on the shipped model, 2 chains x 100
#: draws), with 40 draws a chain here: its traces level off within ~20 draws (each checkpoint's
#: verdict is recorded), and 30 checkpoints x 4 runs, with the heads, must fit in under an hour of
#: a core shared with other work
SETTINGS = L.SamplerSettings(lr=1e-4, localization=1000.0, n_beta=1000.0, chains=2, draws=40, batch_size=16)
DATA_SEED = 12345  # the fixed rows every checkpoint of every run is measured on
ED_ROWS = 4  # rows of the training mix whose log-probabilities are the essential-dynamics features


def fixed_rows(train_tokens, n_layers: int, n_rows: int, seed: int) -> torch.Tensor:
    """``n_rows`` rows of the recipe's training mix, the same for every run and checkpoint."""
    model_cfg, cfg = live_configs(n_layers=n_layers)
    g = torch.Generator().manual_seed(seed)
    return torch.cat([make_batch(train_tokens, cfg, model_cfg.n_ctx, g) for _ in range(n_rows // cfg.batch_size)])


def measure(model, rows, text, settings: L.SamplerSettings, probes: int) -> dict:
    """The LLC, the Hessian's trace and the detectors at one checkpoint."""
    last = model.cfg.n_layers - 1
    est = L.estimate_llc(model, rows, settings, progress=False)
    tr, tr_se = L.hessian_trace(model, rows, probes=probes)
    with torch.no_grad():
        sc = S.head_scores(model, text, seq_len=15)
        first, second = losses.repeated_loss_curve(model, batch_size=16).copy_means()
    return {"llc": est.summary(), "hessian_trace": tr, "hessian_trace_se": tr_se,
            "prev_token": float(sc.previous_token[0].max()), "prefix_matching": float(sc.prefix_matching[last].max()),
            "prev_token_heads": sc.previous_token.tolist(), "prefix_matching_heads": sc.prefix_matching.tolist(),
            "copy_first": first, "copy_second": second}


def run(seed: int, n_layers: int, streams, out: Path, head_llc: bool = True, probes: int = 2,
        settings: L.SamplerSettings = SETTINGS, steps: int = STEPS, snapshots=None) -> dict:
    """Train one run, measure every snapshot, write ``out`` and return what it wrote."""
    snapshots = sorted(s for s in (snapshots or SNAPSHOTS) if s <= steps)
    train_tokens, val_tokens = streams
    model_cfg, cfg = live_configs(n_layers=n_layers, seed=seed, steps=steps, snapshot_steps=snapshots)
    t0 = time.perf_counter()
    model, history, snaps = train(model_cfg, cfg, train_tokens, val_tokens, device="cpu", progress=False)
    train_s = time.perf_counter() - t0
    rows = fixed_rows(train_tokens, n_layers, 256, DATA_SEED)
    eval_rows = fixed_rows(train_tokens, n_layers, 128, DATA_SEED + 1)
    text = live_text(model, 32)
    bigram = ST.bigram_logprobs(train_tokens, model_cfg.d_vocab)
    ref_bigram = ST.loss_of(bigram[eval_rows[:, :-1]], eval_rows)
    copies = [0.5, 0.7, 0.8, 0.9, 0.95]
    ic = {q: ST.loss_of(ST.in_context_logprobs(eval_rows, bigram, q), eval_rows) for q in copies}
    best_q = min(ic, key=ic.get)
    points, outputs, per_token = [], [], []
    for step in snapshots:
        model.load_state_dict(snaps[step])
        t = time.perf_counter()
        row = measure(model, rows, text, settings, probes)
        with torch.no_grad():
            logp = model(eval_rows).log_softmax(-1)
            row["loss"] = float(loss_fn(model(eval_rows), eval_rows))
            row["bigram_kl"] = float((bigram[eval_rows[:, :-1]].exp() * (bigram[eval_rows[:, :-1]] - logp[:, :-1])).sum(-1).mean())
            outputs.append(logp[:ED_ROWS, :-1].reshape(-1).numpy())
            per_token.append(loss_fn(model(eval_rows), eval_rows, per_token=True).reshape(-1).numpy())
        row["step"], row["tokens"], row["seconds"] = step, step * cfg.batch_size * model_cfg.n_ctx, time.perf_counter() - t
        points.append(row)
        print(f"seed {seed} {n_layers}L step {step:>5}: llc {row['llc']['llc']:7.1f} (rise {row['llc']['rise']:+.2f}, "
              f"{'flat' if row['llc']['plateaued'] else 'NOT flat'}) trace {row['hessian_trace']:8.1f} loss {row['loss']:.3f} "
              f"prev {row['prev_token']:.2f} pm {row['prefix_matching']:.2f} ({row['seconds']:.0f} s)", flush=True)
    ed = ST.essential_dynamics(np.stack(outputs))
    lp = ST.essential_dynamics(np.stack(per_token))
    heads = {}
    if head_llc:  # the weight-refined LLC of each head at the last checkpoint
        for l in range(model_cfg.n_layers):
            for h in range(model_cfg.n_heads):
                heads[f"{l}.{h}"] = L.estimate_llc(model, rows, settings, heads=[(l, h)], progress=False).summary()
    result = {
        "seed": seed, "n_layers": n_layers, "recipe": "attn-only-2l-live (chapter 7), stop_at_targets off",
        "model": asdict(model_cfg), "train": {k: v for k, v in asdict(cfg).items() if k != "snapshot_steps"},
        "settings": asdict(settings), "hessian_probes": probes, "train_s": train_s,
        "wall_s": time.perf_counter() - t0, "references": {"bigram_loss": ref_bigram, "in_context_loss": ic[best_q],
                                                           "in_context_copy": best_q},
        "points": points,
        "essential_dynamics": {"coords": ed.coords.tolist(), "explained": ed.explained.tolist()},
        "loss_pca": {"coords": lp.coords.tolist(), "explained": lp.explained.tolist()},
        "head_llc": heads,
        "history": {k: history[k] for k in ("step", "val_loss", "train_loss") if k in history},
        "torch": torch.__version__,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    durable.write_text(out, json.dumps(result, indent=1))
    return result


#: the settings tried on the shipped 2-layer model, devinterp's suggested ranges first (chapter 14)
CALIBRATION = [
    dict(lr=1e-3, localization=100.0, n_beta=6.0),
    dict(lr=1e-4, localization=300.0, n_beta=30.0),
    dict(lr=1e-4, localization=1000.0, n_beta=100.0),
    dict(lr=3e-5, localization=1000.0, n_beta=1000.0),
    dict(lr=1e-4, localization=1000.0, n_beta=1000.0),
    dict(lr=1e-3, localization=1000.0, n_beta=1000.0),
    dict(lr=1e-2, localization=100.0, n_beta=1000.0),
    dict(lr=1e-4, localization=1000.0, n_beta=1000.0, chains=4),
]


def calibrate(out: Path) -> dict:
    """Every setting of :data:`CALIBRATION` on the shipped 2-layer model (256 validation windows, the
    same for each), written to ``out``: its trace, estimate, rise, plateau and time, or how it failed."""
    model = load_pretrained("attn-only-2l").model
    rows = validation_windows(256, model.cfg.n_ctx)
    tried = []
    for kw in CALIBRATION:
        settings = L.SamplerSettings(**kw)
        t = time.perf_counter()
        try:
            row = L.estimate_llc(model, rows, settings, progress=False).summary()
        except ValueError as err:  # every chain diverged
            row = {"settings": asdict(settings), "error": str(err), "seconds": time.perf_counter() - t}
        print(f"calibration {kw}: {row.get('llc', row.get('error'))} rise {row.get('rise')} "
              f"flat {row.get('plateaued')} ({row['seconds']:.0f} s)", flush=True)
        tried.append(row)
        result = {"model": "attn-only-2l", "rows": "256 validation windows of 128 tokens", "tried": tried,
                  "complete": False, "torch": torch.__version__}
        out.parent.mkdir(parents=True, exist_ok=True)
        durable.write_text(out, json.dumps(result, indent=1))  # each row as it comes
    result["hessian_trace"], result["hessian_trace_se"] = L.hessian_trace(model, rows, probes=16)
    result["complete"] = True
    durable.write_text(out, json.dumps(result, indent=1))
    return result


def run_name(n_layers: int, seed: int) -> str:
    return f"{n_layers}l-seed-{seed}.json"


def results_dir(directory: Path | None = None) -> Path:
    """``directory``, else the folder ``ATTNCIRCUITS_STAGES`` names, else the committed results."""
    return Path(directory or os.environ.get(ENV) or OUT)


def load(n_layers: int, seed: int, directory: Path | None = None) -> dict:
    """One run's results as ``make stages`` wrote them."""
    path = results_dir(directory) / run_name(n_layers, seed)
    if not path.is_file():
        raise FileNotFoundError(f"no results at {path}; run `make stages` (or python -m attncircuits.train.stages "
                                f"--layers {n_layers} --seeds {seed})")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a results file ({err}); delete it and run `make stages` again") from None


def recorded_seeds(n_layers: int, directory: Path | None = None) -> list[int]:
    """The seeds with results for ``n_layers``, in order."""
    d = results_dir(directory)
    return sorted(int(p.stem.rsplit("-", 1)[1]) for p in d.glob(f"{n_layers}l-seed-*.json"))


def load_calibration(directory: Path | None = None) -> dict:
    """The sampler's calibration on the shipped 2-layer model (``--calibrate``)."""
    path = results_dir(directory) / "calibration.json"
    if not path.is_file():
        raise FileNotFoundError(f"no calibration at {path}; run python -m attncircuits.train.stages --calibrate")
    return json.loads(path.read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attncircuits.train.stages", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--layers", type=int, default=2, choices=[1, 2])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calibrate", action="store_true", help="the sampler's calibration on the shipped 2-layer model")
    a = p.parse_args(argv)
    try:
        L.require_devinterp()
    except ModuleNotFoundError as err:
        print(f"make stages: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    # devinterp runs gc.collect() twice a chain; with torch's, datasets' and xarray's objects
    # frozen out of the collector each call takes milliseconds instead of about a second
    gc.collect()
    gc.freeze()
    if a.calibrate:
        out = a.out / "calibration.json"
        if out.exists() and json.loads(out.read_text()).get("complete") and not a.overwrite:
            print(f"{out} exists; skipped (--overwrite redoes it)")
        else:
            calibrate(out)
        return 0
    streams = None
    for seed in a.seeds:
        out = a.out / run_name(a.layers, seed)
        if out.exists() and not a.overwrite:
            print(f"{out} exists; skipped (--overwrite redoes it)")
            continue
        if streams is None:
            streams = live_streams(live_configs()[0].d_vocab)
            gc.freeze()
        t = time.perf_counter()
        run(seed, a.layers, streams, out)
        print(f"wrote {out} in {time.perf_counter() - t:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
