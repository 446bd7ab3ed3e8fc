"""A family of models trained side by side on one recipe, to ask where and when induction heads
form: ``make family`` (``python -m attncircuits.train.family [--seed N]``).

The members (:data:`MEMBERS`) are Olsson et al. (2022)'s grid, 1 to 6 layers attention-only and
with MLPs and LayerNorm, plus the 2-layer attention-only model with each other position scheme of
the family (learned positions in the residual stream, rotary, none). Every member trains on the
same tokens, with the same seed and schedule (:data:`RECIPE`): chapter 7's live recipe (256 ids,
64 positions, three quarters of each batch random tokens repeated) at a rate of 2e-3 instead of
5e-3, for 2,400 steps (at 5e-3 the deepest members and those with MLPs formed no induction head
in 1,500 steps; at 2e-3 the slowest formed at step 1,300).

Every evaluation the loop records the validation loss and every head's previous-token and
prefix-matching scores; this module adds the loss at :data:`N_WINDOWS` fixed validation windows,
:data:`POSITIONS_PER_WINDOW` positions each, for the per-token-loss PCA, and every
:data:`ICL_EVERY` evaluations each of :data:`N_ICL_WINDOWS` fixed windows' ICL score, so that its
change across the phase change is read window by window (:func:`attncircuits.analysis.phase.icl_change`).
A member's results (a JSON file, an ``.npz``) go to the seed's
folder (:func:`default_out`: seed 0's in the package, another's in ``replicates/family-seed-N/``),
listed with their SHA-256s in its ``manifest.json``; an interrupted run keeps each member's last
evaluation in ``<member>.partial/``, from which the same command resumes. Every file is verified
when it is read (:mod:`attncircuits.train.family_files`). With ``RAY_ADDRESS`` set or ``--ray`` the
members run as tasks on a Ray cluster instead (:mod:`attncircuits.train.cluster`). Members train
on a CUDA GPU where torch finds one (``--device`` chooses; on a GPU the processes share it), else
on the CPU: a GPU's floats differ from a CPU's, so its results are another run, as another seed's
are, and each member's results name its device. With ``--record`` (``make family SEED=n``) chapter
11 runs on the seed and its counts, cells and claims held go to its folder's ``results.json``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
from pathlib import Path

import numpy as np
import torch

from attncircuits.analysis import losses, phase
from attncircuits.analysis.phase import summarize
from attncircuits.analysis.scores import head_scores
from attncircuits.checkpoints import modelset
from attncircuits.core import devices, durable
from attncircuits.train import cluster, family_files, replicate
from attncircuits.train.live import check_live_config, live_configs, live_streams, live_text
from attncircuits.train.loop import TrainingInterrupted, train

#: the committed seed 0's results, in the package's shipped files (so chapter 11 reads it on Colab too)
RESULTS = Path(__file__).resolve().parents[1] / "checkpoints" / "shipped" / "family"
#: where ``make family SEED=n`` (n > 0) writes seed n (``family-seed-n/``): outside the package, so what a
#: wheel or git ships stays seed 0; ATTNCIRCUITS_FAMILY=replicates/family-seed-n points chapter 11 at it
USER_RESULTS = replicate.REPO / "replicates"
#: a results folder for chapter 11 to read instead of the committed seed 0 (``make family SEED=n``'s)
RESULTS_ENV = modelset.FAMILY_ENV
#: the chapter that reads the family (its counts are what ``--record`` keeps)
CHAPTER = "11_model_family"
#: chapter 7's live recipe at a lower rate (see the module), thrice the steps its 2-layer model needs
RECIPE = dict(lr=2e-3, steps=2400, eval_every=25)
#: fixed windows read every evaluation (the ICL score's positions and 2 more, seeded) for the PCA
N_WINDOWS = 256
POSITIONS_PER_WINDOW = 4
#: fixed windows for the ICL score, read every ICL_EVERY evaluations and at the end, each kept
N_ICL_WINDOWS = 1024
ICL_EVERY = 2

MEMBERS: dict[str, dict] = {
    **{f"attn-{n}l": {"n_layers": n} for n in range(1, 7)},
    **{f"ln-mlp-{n}l": {"n_layers": n, "d_mlp": 512, "layernorm": True} for n in range(1, 7)},
    "attn-2l-learned": {"n_layers": 2, "positions": "learned"},
    "attn-2l-rotary": {"n_layers": 2, "positions": "rotary"},
    "attn-2l-none": {"n_layers": 2, "positions": "none"},
}


def default_out(seed: int) -> Path:
    """Seed ``seed``'s results folder: the committed seed 0's, or ``replicates/family-seed-N``."""
    return RESULTS / "seed-0" if seed == 0 else USER_RESULTS / f"family-seed-{seed}"


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
    """The losses at the fixed (window, position) pairs (flattened, float16; only those positions
    unembedded), and the ICL score (late minus early) with its standard error over the windows."""
    picked = losses.loss_rows_at(model, tokens, torch.from_numpy(positions))
    rows = picked[:, 1] - picked[:, 0]
    return picked.flatten().to(torch.float16).numpy(), rows.mean().item(), (rows.std() / len(rows) ** 0.5).item()


def train_member(name: str, seed: int, out: Path, streams=None, device: str = "cpu") -> dict:
    """Train one member on ``device`` (resuming its saved state, from whichever device saved it)."""
    torch.set_num_threads(1)
    mcfg, cfg = member_configs(name, seed)
    tr, va = streams if streams is not None else live_streams(mcfg.d_vocab)
    ident = identity(name, seed)
    state = family_files.load_state(out, name, ident)
    if state is not None:
        print(f"  {name}: resuming from its state saved at step {state['step']:,}", flush=True)
    fixed = {}  # the same windows and positions for every member, read at the first evaluation
    kept = state["kept"] if state else {k: [] for k in sorted(family_files.KEPT)}
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
            fixed["tokens"], fixed["icl_tokens"] = live_text(model, N_WINDOWS), live_text(model, N_ICL_WINDOWS)
            fixed["positions"] = fixed_positions(mcfg.n_ctx)
        nll, icl, se = read_fixed(model, fixed["tokens"], fixed["positions"])
        for key, val in (("per_token", nll), ("icl", icl), ("icl_se", se)):
            kept[key].append(val)
        if step % (ICL_EVERY * cfg.eval_every) == 0 or step == cfg.steps:
            kept["icl_steps"].append(step)
            kept["icl_rows"].append(losses.icl_rows(model, fixed["icl_tokens"]).to(torch.float16).numpy())
        if step and step % every == 0 or step == cfg.steps:  # one progress line per tenth of the budget
            print(f"  {name:<16} step {step:>5,} of {cfg.steps:,} ({time.perf_counter() - t0:.0f} s)", flush=True)

    def save_state(st):  # a kill at any moment leaves the last whole state
        family_files.save_state(out, name, ident, {**st, "kept": kept})

    t0 = time.perf_counter()
    model, history, _ = train(mcfg, cfg, tr, va, device=device, progress=False, resume=state,
                              save_state=save_state, callback=on_eval)
    scores = head_scores(model, live_text(model, 32), seq_len=15, n_repeats=4)
    final = np.asarray(kept["icl_rows"][-1], dtype=np.float64)  # the last step's, on the fixed windows
    result = {
        "member": name, "config": mcfg.to_dict(), "seed": seed, "n_params": model.n_params(),
        "tokens_per_step": cfg.batch_size * mcfg.n_ctx, "wall_s": time.perf_counter() - t0,
        "device": torch.device(device).type,
        "history": {**{k: history[k] for k in ("step", "val_loss", "prev_token", "prefix_matching")},
                    "icl": kept["icl"], "icl_se": kept["icl_se"], "icl_steps": kept["icl_steps"]},
        "final_icl": {"mean": float(final.mean()), "se": float(final.std(ddof=1) / len(final) ** 0.5),
                      "windows": len(final)},
        "fixed_windows": N_WINDOWS, "fixed_positions": fixed_positions(mcfg.n_ctx).tolist(),
        "final_scores": {k: v.tolist() for k, v in scores.scores.items()},
    }
    # the losses, the results, then both listed with their hashes in the folder's manifest, which
    # marks the member done: a kill before that leaves it not done, and a rerun trains it again from
    # its last saved state
    durable.write_file(out / f"{name}.npz", lambda f: np.savez_compressed(
        f, per_token=np.stack(kept["per_token"]), icl_rows=np.stack(kept["icl_rows"])), binary=True)
    durable.write_text(out / f"{name}.json", json.dumps(result) + "\n")
    family_files.record(out, name)
    family_files.remove_state(out, name)
    return result


def identity(name: str, seed: int) -> dict:
    """What member ``name``'s saved state must match to be resumed: member, seed, its configs."""
    mcfg, cfg = member_configs(name, seed)
    return {"member": name, "seed": seed, "configs": family_files.configs_hash(mcfg.to_dict(), vars(cfg))}


def _cost(name: str) -> int:
    return MEMBERS[name]["n_layers"] * (3 if MEMBERS[name].get("d_mlp") else 1)


def _worker(args):
    name, seed, out, streams, device = args
    try:
        r = train_member(name, seed, out, streams, device)
        return name, f"{r['wall_s']:.0f} s"
    except TrainingInterrupted:
        return name, "interrupted (its state is kept)"


def _task(job_and_settings: tuple):
    """A member as a task on a cluster node: the recipe of the command that started it, checked
    against its results folder (the node must see it) and this node's code, then :func:`_worker`."""
    job, settings = job_and_settings
    globals().update(settings)
    name, seed, out = job[:3]
    id_file, host = out / "recipe.json", socket.gethostname()
    if not id_file.is_file():
        raise RuntimeError(f"node {host} does not see {out}: put the results folder on a filesystem every node "
                           "mounts and name it with --out")
    if json.loads(id_file.read_text()) != recipe_id(seed):
        raise RuntimeError(f"node {host} builds other configs from the recipe than the command did: install the "
                           "same version of the course on every node")
    return _worker(job)


def family_device(device: str | None = None) -> torch.device:
    """Where the members train: ``device`` checked (one line naming the devices this machine has),
    else a CUDA GPU where torch finds one, else the CPU (MPS only when asked: these small models
    gain little there)."""
    try:
        return devices.check(device or ("cuda" if torch.cuda.is_available() else "cpu"), "--device")
    except ValueError as err:
        raise SystemExit(str(err)) from None


def run(seed: int = 0, processes: int = 2, members: list[str] | None = None, out: Path | None = None,
        streams=None, device: str | None = None, ray: str | None = None, ray_cpus: int | None = None) -> Path:
    """Train every member of the family not yet finished in ``out`` (default :func:`default_out`),
    ``processes`` at a time on ``device`` (:func:`family_device`), or each as a task on the Ray
    cluster at ``ray`` (an address, or ``local``: an instance started here with ``ray_cpus`` CPUs;
    :mod:`attncircuits.train.cluster`), and print the closing table. Before anything is written or
    trained, each of these is refused in one line: a seed or member that does not exist, a recipe
    the trainer cannot build, a cluster that cannot be reached, a device this machine lacks, a
    results folder of another recipe or seed, results or a saved state that fail their checks
    (:mod:`attncircuits.train.family_files`). ``streams`` (train, validation tokens) replaces the
    live recipe's (tests pass small ones)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**62:
        raise SystemExit(f"seed {seed!r}: give a whole number from 0 to {2**62 - 1:,}")
    asked = list(members or MEMBERS)
    unknown = [n for n in asked if n not in MEMBERS]
    if unknown:
        raise SystemExit(f"no family member {unknown[0]!r}; the members are {', '.join(MEMBERS)}")
    for n in asked:
        try:
            check_live_config(*member_configs(n, seed))
        except (ValueError, TypeError) as err:
            raise SystemExit(f"the family's recipe cannot train {n}: {err}") from None
    if out is None and seed and (RESULTS / f"seed-{seed}").is_dir():
        raise SystemExit(f"{RESULTS / f'seed-{seed}'} holds seed {seed} from an earlier version, inside the package; "
                         f"move it out first: mv {RESULTS / f'seed-{seed}'} {default_out(seed)}")
    out = out or default_out(seed)
    dev = None if ray else family_device(device)
    todo = _check_folder(out, seed, asked)
    pool = cluster.connect(ray, ray_cpus) if ray else None
    try:
        dev = pool.device(device) if pool else dev
        out.mkdir(parents=True, exist_ok=True)
        durable.write_text(out / "recipe.json", json.dumps(recipe_id(seed), indent=1) + "\n")
        todo.sort(key=lambda n: -_cost(n))  # the longest first, so the workers end together
        where = (f"{dev} ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" and not pool else str(dev))
        on = f"the Ray cluster at {ray}, a task each on {where}" if pool else where
        print(f"family seed {seed}: {len(asked) - len(todo)} of {len(asked)} members done, training {len(todo)} "
              f"on {on}", flush=True)
        jobs = [(n, seed, out, streams, str(dev)) for n in todo]
        if pool:
            settings = {k: globals()[k] for k in ("RECIPE", "MEMBERS", "N_WINDOWS", "N_ICL_WINDOWS", "ICL_EVERY")}
            done = pool.run(_task, [(job, settings) for job in jobs], todo, gpu=dev.type == "cuda")
        elif processes == 1:  # here, one after the other
            done = map(_worker, jobs)
        else:  # side by side, one thread each: these small models use a core about as well as two
            # (on a GPU each process launches its own kernels, so two keep it busier than one)
            workers = multiprocessing.get_context("spawn").Pool(processes)
            done = workers.imap_unordered(_worker, jobs)
        for name, what in done:
            print(f"  {name}: {what}", flush=True)
        if not pool and processes != 1:
            workers.close()
    finally:
        if pool:
            pool.close()
    print(table(out))
    return out


def _check_folder(out: Path, seed: int, asked: list[str]) -> list[str]:
    """The members of ``asked`` to train into ``out``, every file there checked first (one line,
    SystemExit, for the first that fails); nothing is written but a finished member's leftover
    saved state removed."""
    rid, id_file = recipe_id(seed), out / "recipe.json"
    if id_file.is_file():
        try:
            theirs = json.loads(id_file.read_text())
            assert isinstance(theirs, dict)
        except (ValueError, AssertionError):
            raise SystemExit(f"{id_file} does not read; move {out} away to train this recipe") from None
        if theirs.get("seed") != seed:
            raise SystemExit(f"{out} holds seed {theirs.get('seed')!r}'s family, not seed {seed}'s; move it away "
                             "or give its own seed")
        if theirs != rid:
            raise SystemExit(f"{id_file} was written by another recipe; move {out} away to train this one")
    todo = []
    try:
        table = family_files.entries(out)
        for n in asked:
            if family_files.finished(out, n, seed, rid["members"][n], f"make family SEED={seed}", table) is None:
                family_files.load_state(out, n, identity(n, seed))  # one that fails stops the run here
                todo.append(n)
            elif family_files.state_dir(out, n).exists():  # finished; stopped before tidying its state
                family_files.remove_state(out, n)
    except family_files.FamilyFileError as err:
        raise SystemExit(str(err)) from None
    return todo


def load(out: Path) -> dict[str, dict]:
    """Every finished member's results in ``out``, checked (:func:`family_files.finished`), with its
    per-token losses (``per_token``)."""
    res, rid = {}, json.loads((out / "recipe.json").read_text())
    table = family_files.entries(out)
    for name in MEMBERS:
        r = family_files.finished(out, name, rid["seed"], rid["members"].get(name), f"make family SEED={rid['seed']}",
                                  table)
        if r is not None:
            with np.load(out / f"{name}.npz") as z:
                r["per_token"] = z["per_token"].astype(np.float32)
                r["icl_rows"] = z["icl_rows"].astype(np.float32) if "icl_rows" in z else None
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
    listed = family_files.entries(out)
    missing = [n for n in MEMBERS
               if not all(f in listed and (out / f).is_file() for f in (f"{n}.json", f"{n}.npz"))]
    if missing:
        raise FileNotFoundError(f"{out} is half-written: {len(missing)} members not finished ({', '.join(missing[:4])}"
                                f"{', ...' if len(missing) > 4 else ''}); run `make family SEED={seed}` again: it "
                                "resumes where it stopped")
    try:
        return load(out)  # every member's files against the manifest, and its member, seed and config
    except family_files.FamilyFileError:
        raise
    except (ValueError, OSError, KeyError) as err:
        raise ValueError(f"a results file in {out} does not read ({err}); delete that member's .json and .npz "
                         f"and run `make family SEED={seed}` to train it again") from None


def record(seed: int, out: Path | None = None, records: Path | None = None) -> Path:
    """Run chapter 11 on seed ``seed``'s finished results (default :data:`RESULTS` ``/seed-N``) and
    write its cells and claims held to ``records/family-seed-N/results.json`` (default the
    repository's ``replicates/``); returns that file."""
    out = out or default_out(seed)
    load_results(out)  # whole, or one line naming the command that makes it so
    runs = replicate.run_chapters(out, [replicate.REPO / "notebooks" / f"{CHAPTER}.ipynb"], env_name=RESULTS_ENV)
    folder = (records or replicate.REPO / "replicates") / f"family-seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    body = {"seed": seed, "command": f"make family SEED={seed}", "trained_at": replicate.training_commit(out, True), "chapters": runs}
    durable.write_text(path, json.dumps(body, indent=1) + "\n")
    return path


def table(out: Path) -> str:
    """The closing table: each member's phase change, ICL score before and after it, best heads."""
    return phase.table([summarize(n, r) for n, r in load(out).items()])


if __name__ == "__main__":  # `python -m attncircuits.train.family` runs the command line's module
    import runpy

    runpy.run_module("attncircuits.train.family_cli", run_name="__main__", alter_sys=True)
