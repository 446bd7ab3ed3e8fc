"""A family of models trained side by side on one recipe, to ask where and when induction heads
form: ``make family`` (``python -m attncircuits.train.family [--seed N]``).

The members (:data:`MEMBERS`) are Olsson et al. (2022)'s grid, 1 to 6 layers attention-only and
with MLPs and LayerNorm, plus the 2-layer attention-only model with each other position scheme of
the family (learned positions in the residual stream, rotary, none). Every member trains on the
same tokens, with the same seed and schedule (:data:`RECIPE`): chapter 7's live recipe (256 ids,
64 positions, three quarters of each batch random tokens repeated) at a rate of 2e-3 instead of
5e-3, for 2,400 steps. At 5e-3 the 2-layer model forms induction heads by step 400, but the 5- and
6-layer attention-only members and every member with MLPs formed none in 1,500 steps; at 2e-3 the
2-layer model's best head reaches the "formed" score (0.5) at step 625 (seed 0; 700 with seed 1),
the 6-layer one's at 1,300 and the 2-layer MLP one's at 975. 2,400 steps is over three times the
2-layer model's 625-700, so a member that forms none in it has had the time the 2-layer model
needed, thrice (chapter 11 checks it as a claim on every seed).

Every 25 steps the training loop records the validation loss and every head's previous-token and
prefix-matching scores; this module adds the loss at one fixed set of (window, position) pairs:
:data:`N_WINDOWS` windows of validation text, at :data:`POSITIONS_PER_WINDOW` positions each (the
in-context-learning score's two and two drawn at random), for the per-token-loss PCA and the ICL
score of every evaluation (with its standard error; on 256 windows about 0.2 nats, but the same
windows at every step, so a change between steps is measured on the same text). At the end every
detector of the registry scores every head and the ICL score is measured on
:data:`N_FINAL_WINDOWS` windows. Each member's results are one JSON file and one ``.npz`` in
:data:`RESULTS` ``/seed-N/``, written when the member finishes; an interrupted run keeps each
member's last evaluation in ``<member>.partial.pt`` and the same command resumes from there
(nothing trained is lost). Members train on a CUDA GPU where torch finds one (``--device``
chooses; on a GPU the processes share it), else on the CPU: a GPU's floats differ from a CPU's, so
its results are another run, as another seed's are, and each member's results name its device.
With ``--record`` (``make family SEED=n``, n > 0) chapter 11 then runs
on the seed and its counts, cells and claims held, are written to
``replicates/family-seed-N/results.json``, which the reproduces page lists beside the replicates'.
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
from attncircuits.analysis.phase import TABLE_HEADER, summarize
from attncircuits.analysis.scores import head_scores
from attncircuits.checkpoints import modelset
from attncircuits.core import devices, durable
from attncircuits.train import replicate
from attncircuits.train.live import live_configs, live_streams, live_text
from attncircuits.train.loop import TrainingInterrupted, train

#: where ``make family`` writes each seed's folder: beside the committed seed 0, in the package's
#: shipped files (so chapter 11 reads it on Colab too)
RESULTS = Path(__file__).resolve().parents[1] / "checkpoints" / "shipped" / "family"
#: a results folder for chapter 11 to read instead of the committed seed 0 (``make family SEED=n``'s)
RESULTS_ENV = modelset.FAMILY_ENV
#: the chapter that reads the family (its counts are what ``--record`` keeps)
CHAPTER = "11_model_family"
#: chapter 7's live recipe at a lower rate (see the module), for a budget over three times the
#: steps its 2-layer model needs
RECIPE = dict(lr=2e-3, steps=2400, eval_every=25)
#: the fixed windows of validation text read at every evaluation: the ICL score's two positions and
#: POSITIONS_PER_WINDOW - 2 more (seeded) of each, whose losses are kept for the PCA
N_WINDOWS = 256
POSITIONS_PER_WINDOW = 4
#: windows of validation text for the in-context-learning score at the end (its standard error
#: about 0.1 nats)
N_FINAL_WINDOWS = 1024

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
    rid = {"seed": seed, "recipe": vars(member_configs(next(iter(MEMBERS)), seed)[1]),
           "members": {n: member_configs(n, seed)[0].to_dict() for n in MEMBERS}}
    return json.loads(json.dumps(rid))  # as it reads back from recipe.json


def fixed_positions(n_ctx: int, n_windows: int | None = None, k: int | None = None, seed: int = 0) -> np.ndarray:
    """``[n_windows, k]`` target positions read in each fixed window: the ICL score's early and late
    positions (columns 0 and 1), then ``k - 2`` others drawn with ``seed``, distinct in each row."""
    n_windows = N_WINDOWS if n_windows is None else n_windows
    k = POSITIONS_PER_WINDOW if k is None else k
    late, early = losses.icl_positions(n_ctx)
    rest = np.array([p for p in range(1, n_ctx) if p not in (early, late)])
    if not 2 <= k <= len(rest) + 2:
        raise ValueError(f"k={k} positions per window: use 2 <= k <= {len(rest) + 2} for n_ctx={n_ctx}")
    rng = np.random.default_rng(seed)
    others = np.stack([rng.choice(rest, k - 2, replace=False) for _ in range(n_windows)]) if k > 2 else np.zeros((n_windows, 0), int)
    return np.concatenate([np.full((n_windows, 1), early), np.full((n_windows, 1), late), others], 1)


def read_fixed(model, tokens: torch.Tensor, positions: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The losses at the fixed (window, position) pairs (flattened, as float16), and the ICL score
    (late minus early) with its standard error over the windows."""
    nll = losses.per_token_loss(model, tokens)  # column t predicts the token at position t + 1
    picked = torch.gather(nll, 1, torch.from_numpy(positions - 1).long())
    rows = picked[:, 1] - picked[:, 0]
    return picked.flatten().to(torch.float16).numpy(), rows.mean().item(), (rows.std() / len(rows) ** 0.5).item()


def train_member(name: str, seed: int, out: Path, streams=None, device: str = "cpu") -> dict:
    """Train one member on ``device`` (resuming its partial state if there is one, from whichever
    device saved it) and write its results."""
    torch.set_num_threads(1)
    mcfg, cfg = member_configs(name, seed)
    tr, va = streams if streams is not None else live_streams(mcfg.d_vocab)
    partial = out / f"{name}.partial.pt"
    state = _partial_state(partial, name)
    fixed = {}  # the same windows and positions for every member, read at the first evaluation
    kept = state["kept"] if state else {"per_token": [], "icl": [], "icl_se": []}
    every = max(cfg.eval_every, cfg.steps // 10 // cfg.eval_every * cfg.eval_every)

    def on_eval(step, model, row):
        parent = multiprocessing.parent_process()
        if parent is not None and not parent.is_alive():
            # the `make family` that started this worker was killed (not by Ctrl-C, which stops the
            # workers too): stop here, where this step's state is saved, so that a rerun resumes it
            # alone instead of racing an orphan for the same files
            print(f"  {name}: its make family is gone; stopping at step {step:,} (a rerun resumes "
                  "from its last saved state)", flush=True)
            os._exit(0)
        if not fixed:
            fixed["tokens"] = live_text(model, N_WINDOWS)
            fixed["positions"] = fixed_positions(mcfg.n_ctx)
        nll, icl, se = read_fixed(model, fixed["tokens"], fixed["positions"])
        for key, val in (("per_token", nll), ("icl", icl), ("icl_se", se)):
            kept[key].append(val)
        if step and step % every == 0 or step == cfg.steps:  # one progress line per tenth of the budget
            print(f"  {name:<16} step {step:>5,} of {cfg.steps:,} ({time.perf_counter() - t0:.0f} s)", flush=True)

    def save_state(st):
        tmp = partial.with_suffix(".tmp")
        torch.save({**st, "kept": kept}, tmp)
        os.replace(tmp, partial)  # a kill at any moment leaves the last whole state

    t0 = time.perf_counter()
    model, history, _ = train(mcfg, cfg, tr, va, device=device, progress=False, resume=state,
                              save_state=save_state, callback=on_eval)
    scores = head_scores(model, live_text(model, 32), seq_len=15, n_repeats=4)
    final = losses.icl_scores_per_row(losses.per_token_loss(model, live_text(model, N_FINAL_WINDOWS)), mcfg.n_ctx)
    result = {
        "member": name, "config": mcfg.to_dict(), "seed": seed, "n_params": model.n_params(),
        "tokens_per_step": cfg.batch_size * mcfg.n_ctx, "wall_s": time.perf_counter() - t0,
        "device": torch.device(device).type,
        "history": {**{k: history[k] for k in ("step", "val_loss", "prev_token", "prefix_matching")},
                    "icl": kept["icl"], "icl_se": kept["icl_se"]},
        "final_icl": {"mean": final.mean().item(), "se": (final.std() / len(final) ** 0.5).item(),
                      "windows": len(final)},
        "fixed_windows": N_WINDOWS, "fixed_positions": fixed_positions(mcfg.n_ctx).tolist(),
        "final_scores": {k: v.tolist() for k, v in scores.scores.items()},
    }
    # the losses first, then the results that mark the member done: a kill between the two leaves
    # it not done, and a rerun trains it again from its last saved state
    durable.write_file(out / f"{name}.npz", lambda f: np.savez_compressed(f, per_token=np.stack(kept["per_token"])),
                       binary=True)
    durable.write_text(out / f"{name}.json", json.dumps(result) + "\n")
    partial.unlink(missing_ok=True)
    return result


def _partial_state(partial: Path, name: str) -> dict | None:
    """The state an interrupted member left (None: there is none); one that does not read (a disk
    that filled, a file from elsewhere) raises one line naming the file to delete."""
    if not partial.is_file():
        return None
    try:
        state = torch.load(partial, weights_only=False, map_location="cpu")  # a GPU's state resumes anywhere
        if not {"kept", "step"} <= set(state):
            raise KeyError("not a member's saved state")
    except Exception as err:  # noqa: BLE001 - pickle, zip and torch each raise their own
        raise RuntimeError(f"{partial} does not read ({type(err).__name__}); delete it to train {name} "
                           "from the start") from None
    return state


def _cost(name: str) -> int:
    m = MEMBERS[name]
    return m["n_layers"] * (3 if m.get("d_mlp") else 1)


def _worker(args):
    name, seed, out, streams, device = args
    try:
        r = train_member(name, seed, out, streams, device)
        return name, f"{r['wall_s']:.0f} s"
    except TrainingInterrupted:
        return name, "interrupted (its state is kept)"


def family_device(device: str | None = None) -> torch.device:
    """Where the members train: ``device`` checked (one line naming the devices this machine has),
    else a CUDA GPU where torch finds one, else the CPU (MPS only when asked: these small models
    gain little there)."""
    try:
        return devices.check(device or ("cuda" if torch.cuda.is_available() else "cpu"), "--device")
    except ValueError as err:
        raise SystemExit(str(err)) from None


def run(seed: int = 0, processes: int = 2, members: list[str] | None = None, out: Path | None = None,
        streams=None, device: str | None = None) -> Path:
    """Train every member of the family not yet in ``out`` (default :data:`RESULTS`/``seed-N``),
    ``processes`` at a time on ``device`` (:func:`family_device`), and print the closing table; a
    results folder of another recipe, or a device this machine lacks, is refused before anything is
    trained. ``streams`` (train, validation tokens) replaces the live recipe's (tests pass small ones)."""
    dev = family_device(device)
    out = out or RESULTS / f"seed-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    rid = recipe_id(seed)
    id_file = out / "recipe.json"
    if id_file.is_file():
        try:
            theirs = json.loads(id_file.read_text())
        except ValueError:
            raise SystemExit(f"{id_file} does not read; move {out} away to train this recipe") from None
        if theirs != rid:
            raise SystemExit(f"{id_file} was written by another recipe; move {out} away to train this one")
    asked = list(members or MEMBERS)
    todo = [n for n in asked if not (out / f"{n}.json").is_file()]
    for n in todo:  # a saved state that does not read stops the run here, before any training
        try:
            _partial_state(out / f"{n}.partial.pt", n)
        except RuntimeError as err:
            raise SystemExit(str(err)) from None
    durable.write_text(id_file, json.dumps(rid, indent=1) + "\n")
    todo.sort(key=lambda n: -_cost(n))  # the longest first, so the two processes end together
    where = (f"{dev} ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else str(dev))
    print(f"family seed {seed}: {len(asked) - len(todo)} of {len(asked)} members done, training {len(todo)} "
          f"on {where}", flush=True)
    jobs = [(n, seed, out, streams, str(dev)) for n in todo]
    if processes == 1:  # here, one after the other
        done = map(_worker, jobs)
    else:  # side by side, one thread each: these small models use a core about as well as two
        # (on a GPU each process launches its own kernels, so two keep it busier than one)
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


def results_dir() -> Path:
    """The family results chapter 11 reads: the folder :data:`RESULTS_ENV` names, else seed 0."""
    return modelset.family_dir() or RESULTS / "seed-0"


def recipe_of(directory: Path | str | None = None) -> dict:
    """The recipe a results folder was trained with (its ``recipe.json``: seed, training settings,
    every member's model config); call :func:`load_results` first, which checks it."""
    out = Path(directory) if directory is not None else results_dir()
    return json.loads((out / "recipe.json").read_text())


def load_results(directory: Path | str | None = None) -> dict[str, dict]:
    """Every member's results in ``directory`` (default :func:`results_dir`), checked whole: a
    missing folder, one of another recipe, a member not finished or a file that does not read
    each raise one line naming the command that makes it right."""
    out = Path(directory) if directory is not None else results_dir()
    id_file = out / "recipe.json"
    if not id_file.is_file():
        raise FileNotFoundError(f"no family results in {out} (no recipe.json): run `make family SEED=n` "
                                f"(about 17 minutes on 2 cores), or unset {RESULTS_ENV}")
    try:
        rid = json.loads(id_file.read_text())
        seed = int(rid["seed"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{id_file} does not read ({err}); move {out} away and run `make family`") from None
    if rid != recipe_id(seed):
        raise ValueError(f"{out} was written by another recipe than this package's; move it away and run "
                         f"`make family SEED={seed}` to train the family again")
    missing = [n for n in MEMBERS if not ((out / f"{n}.json").is_file() and (out / f"{n}.npz").is_file())]
    if missing:
        raise FileNotFoundError(f"{out} is half-written: {len(missing)} members not finished ({', '.join(missing[:4])}"
                                f"{', ...' if len(missing) > 4 else ''}); run `make family SEED={seed}` again: it "
                                "resumes where it stopped")
    try:
        return load(out)
    except (ValueError, OSError, KeyError) as err:
        raise ValueError(f"a results file in {out} does not read ({err}); delete that member's .json and .npz "
                         f"and run `make family SEED={seed}` to train it again") from None


def record(seed: int, out: Path | None = None, records: Path | None = None) -> Path:
    """Run chapter 11 on seed ``seed``'s finished results (default :data:`RESULTS` ``/seed-N``) and
    write its cells and claims held to ``records/family-seed-N/results.json`` (default the
    repository's ``replicates/``); returns that file."""
    out = out or RESULTS / f"seed-{seed}"
    load_results(out)  # whole, or one line naming the command that makes it so
    runs = replicate.run_chapters(out, [replicate.REPO / "notebooks" / f"{CHAPTER}.ipynb"], env_name=RESULTS_ENV)
    folder = (records or replicate.REPO / "replicates") / f"family-seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    body = {"seed": seed, "command": f"make family SEED={seed}", "chapters": runs}
    durable.write_text(path, json.dumps(body, indent=1) + "\n")
    return path


def table(out: Path) -> str:
    """The closing table: each member's phase change, ICL score before and after it, best heads."""
    return "\n".join([TABLE_HEADER, *(summarize(n, r).row() for n, r in load(out).items())])


def _whole(lo: int, hi: int):
    """An argparse type: a whole number in [lo, hi], else one line saying what is allowed."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from {lo:,} to {hi:,}")
        return value
    return parse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attncircuits.train.family",
                                description="Train the model family of chapter 11 (make family [SEED=n]).")
    p.add_argument("--seed", type=_whole(0, 2**62 - 1), default=0,
                   help="the family's seed (default 0, the committed results); each seed has its own folder")
    p.add_argument("--processes", type=_whole(1, 64), default=2,
                   help="members trained side by side, one thread each (default 2)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: a CUDA GPU where torch finds one, else the CPU)")
    p.add_argument("--members", nargs="*", choices=list(MEMBERS), metavar="MEMBER",
                   help=f"train only these (default all {len(MEMBERS)}): {', '.join(MEMBERS)}")
    p.add_argument("--record", action="store_true",
                   help="then run chapter 11 on this seed and write its claims held to "
                        "replicates/family-seed-N/results.json (seed 0's the chapter asserts)")
    a = p.parse_args(argv)
    out = run(a.seed, a.processes, a.members, device=a.device)
    if a.record and a.seed == 0:
        print("seed 0 is the committed family: chapter 11 asserts its claims; nothing to record")
    elif a.record:
        path = record(a.seed, out)
        ch = json.loads(path.read_text())["chapters"][CHAPTER]
        print(f"chapter 11 on seed {a.seed}: {ch['cells_passed']} of {ch['cells']} cells, {ch['claims_held']} of "
              f"{ch['claims']} claims held; recorded in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
