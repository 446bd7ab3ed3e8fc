"""Replicates: is a circuit a property of the recipe, or of one training run?

``make replicate SEED=n`` (``python -m attncircuits.train.replicate --seed n``) trains the three shipped
presets with seed ``n`` into ``replicates/seed-n/`` (each resumable: rerun the same command after
Ctrl-C, a crash or a reboot and finished models are kept, an interrupted one continues with the
training CLI's ``--resume``), runs every chapter against them under nbval with
``ATTNCIRCUITS_MODELS`` set (a failing cell is counted, the run goes on), and writes
``replicates/seed-n/results.json``: the chapters' cell and claim counts (the recipe's claims and,
apart, those about the corpus) and
:func:`headline_numbers`, the numbers the book's findings rest on, measured the same way on every
set. Progress goes to stdout and stderr line by line, so ``nohup make replicate SEED=2 &`` leaves a
readable ``nohup.out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from attncircuits.analysis.circuits import composition_scores, copying_summary
from attncircuits.analysis import definitions as D
from attncircuits.analysis import quantities as Q
from attncircuits.analysis.scores import head_scores
from attncircuits.checkpoints import modelset
from attncircuits.checkpoints.pretrained import is_checkpoint_dir, load_checkpoint, validation_windows
from attncircuits.core import gitstate
from attncircuits.core.heads import head_name
from attncircuits.train.sets import ONE_EACH, default_lanes, train_set

#: a layer-1 head is an induction head when its prefix-matching score is above this (the course's
#: definition, attncircuits.analysis.definitions.INDUCTION_HEAD)
INDUCTION_THRESHOLD = D.INDUCTION_HEAD.value
#: a one-layer head copies when its OV eigenvalue share Σλ/Σ|λ| reaches this and is above every shuffle
#: (CopyingSummary.copying, chapter 4's count)
COPYING_THRESHOLD = D.COPYING_EIGEN.value
REPO = Path(__file__).resolve().parents[3]
#: the random tokens the across-runs rows are measured on (Q.repeated_tokens of a 128-token model; the
#: detectors' probe for prefix matching)
REPEATED_NAME = "16 rows of 63 random tokens x 2 (seed 0)"
PROBE_NAME = "16 rows of 25 random tokens x 4 (seed 0)"


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd)


@torch.no_grad()
def model_numbers(model, windows: torch.Tensor) -> dict:
    """The headline numbers of one model on ``windows`` (every validation window of its context)."""
    H = model.cfg.n_heads
    # the quantities' own windows (attncircuits.analysis.quantities), as every chapter measures them
    val = Q.measure("validation loss", model, "", Q.spread(windows, Q.LOSS_WINDOWS))
    icl = Q.measure("ICL score", model, "", Q.spread(windows, Q.ICL_WINDOWS))
    out = {"val_loss": _r(val.value), "val_loss_se": _r(val.se), "icl_score": _r(icl.value), "icl_se": _r(icl.se)}
    if model.cfg.n_layers == 0:
        return out
    hs = head_scores(model, windows[:: max(1, len(windows) // 32)][:32])
    prev = hs.best("previous_token", layer=0)
    out["prev_token_head"], out["prev_token_score"] = head_name(*prev), _r(hs.previous_token[prev])
    last = model.cfg.n_layers - 1
    pm = hs.prefix_matching
    out["prefix_matching_max_per_layer"] = [_r(pm[layer].max()) for layer in range(model.cfg.n_layers)]
    out["induction_heads"] = {head_name(last, h): _r(pm[last, h]) for h in range(H)
                              if pm[last, h] > INDUCTION_THRESHOLD} if last > 0 else {}
    rep = Q.repeated_tokens(model)
    out["repeated_loss_first"], out["repeated_loss_second"] = (
        _r(Q.measure(q, model, "", rep).value) for q in ("first-copy loss", "second-copy loss"))
    if model.cfg.n_layers == 1:
        cs = copying_summary(model, 0)
        out["copying_heads"] = cs.n_copying  # chapter 4's count: one definition of a copying head
        out["copying_eigen_share"] = {head_name(0, h): _r(cs.eigen_score[h]) for h in range(H)}
    if model.cfg.n_layers >= 2:
        comp = composition_scores(model)
        (w, r, score) = comp.top("k", 1)[0]
        k_writer = int(comp.excess("k").clamp_min(0).sum(1).argmax())
        out["top_k_composition"] = {"writer": head_name(*w), "reader": head_name(*r), "score": _r(score),
                                    "z": _r((score - comp.baseline.mean("k")) / comp.baseline.std("k"), 2)}
        out["k_writer"] = head_name(0, k_writer)
        out["k_writer_is_prev_token_head"] = k_writer == prev[1]
    return out


def headline_numbers(models_dir: str | Path, names=modelset.SET_MODEL_NAMES) -> dict:
    """:func:`model_numbers` of each model of the set in ``models_dir`` that is trained (a set may be
    incomplete), all on the validation windows of the set's corpus (the shipped corpus for a set
    trained on it: then every seed is measured on the same windows, as the training histories are)."""
    models_dir = Path(models_dir)
    present = [n for n in names if is_checkpoint_dir(models_dir / n)]
    if not present:
        raise FileNotFoundError(f"{models_dir} holds none of {', '.join(names)}; train them with "
                                "`make replicate SEED=n` or `python -m attncircuits.train --out ...`")
    out = {"induction_threshold": INDUCTION_THRESHOLD, "copying_threshold": COPYING_THRESHOLD, "models": {}}
    for name in present:
        ck = load_checkpoint(models_dir / name)
        corpus, _ = modelset.corpus_dir_of(models_dir, modelset.tokenizer_sha(models_dir / name))
        windows = validation_windows(n_ctx=ck.model.cfg.n_ctx, directory=corpus)
        train = ck.config.get("train", {})
        out["models"][name] = {"seed": train.get("seed"), "steps": train.get("steps"),
                               **model_numbers(ck.model, windows)}
    return out


# ---- the runs side by side (the reproduces page) -------------------------------------------------
def committed_results(root: str | Path | None = None) -> dict[str, dict]:
    """``{"seed n": models}`` from every ``replicates/seed-n/results.json`` (committed; the book reads
    them and does not retrain), by seed."""
    root = Path(root) if root is not None else REPO / "replicates"
    found = []
    for path in root.glob("seed-*/results.json"):
        data = json.loads(path.read_text())
        found.append((int(data["seed"]), data["models"]))
    return {f"seed {seed}": models for seed, models in sorted(found)}


def runs_to_compare(root: str | Path | None = None) -> dict[str, dict]:
    """The models in use (measured now: the shipped ones, or the set ``ATTNCIRCUITS_MODELS`` names)
    beside every committed replicate (:func:`committed_results`), a replicate in use shown once."""
    here = modelset.current_dir()
    label = "shipped" if here is None else f"in use: {here.name}"
    runs = {label: headline_numbers(here or modelset.SHIPPED_DIR)["models"]}
    seed = None
    if here is not None and (here / modelset.SET_FILE).is_file():
        seed = json.loads((here / modelset.SET_FILE).read_text()).get("seed")
    runs.update({k: v for k, v in committed_results(root).items() if k != f"seed {seed}"})
    return runs


def _fmt_heads(heads) -> str:
    return ", ".join(sorted(heads)) or "none"


#: (finding, model, how to read it off the model's numbers, "number" or "label")
ACROSS_RUNS = [
    (f"validation loss on {Q.sample_name(Q.LOSS_WINDOWS)}, 0 layers", "attn-only-0l", lambda m: m["val_loss"],
     "number"),
    (f"validation loss on {Q.sample_name(Q.LOSS_WINDOWS)}, 1 layer", "attn-only-1l", lambda m: m["val_loss"],
     "number"),
    (f"validation loss on {Q.sample_name(Q.LOSS_WINDOWS)}, 2 layers", "attn-only-2l", lambda m: m["val_loss"],
     "number"),
    ("1L: copying heads (of 4)", "attn-only-1l", lambda m: m["copying_heads"], "label"),
    ("2L: previous-token head", "attn-only-2l", lambda m: m["prev_token_head"], "label"),
    ("2L: its previous-token score", "attn-only-2l", lambda m: m["prev_token_score"], "number"),
    (f"2L: induction heads (prefix matching > {INDUCTION_THRESHOLD:g} on {PROBE_NAME})", "attn-only-2l", lambda m: _fmt_heads(m["induction_heads"]),
     "label"),
    ("2L: how many", "attn-only-2l", lambda m: len(m["induction_heads"]), "label"),
    (f"2L: best prefix-matching score on {PROBE_NAME}", "attn-only-2l",
     lambda m: m["prefix_matching_max_per_layer"][-1], "number"),
    (f"2L: second-copy loss on {REPEATED_NAME}", "attn-only-2l", lambda m: m["repeated_loss_second"], "number"),
    (f"2L: ICL score on {Q.sample_name(Q.ICL_WINDOWS)}, token 125 - token 12 (nats)", "attn-only-2l",
     lambda m: m["icl_score"], "number"),
    ("2L: strongest K-composition", "attn-only-2l",
     lambda m: f"{m['top_k_composition']['writer']} → {m['top_k_composition']['reader']}", "label"),
    ("2L: its score above random (std)", "attn-only-2l", lambda m: m["top_k_composition"]["z"], "number"),
    ("2L: the K-writer is the previous-token head", "attn-only-2l",
     lambda m: "yes" if m["k_writer_is_prev_token_head"] else "no", "label"),
]


def _decimals(values, significant: int = 3) -> int:
    """Decimals that show the largest of ``values`` to ``significant`` digits (0.828, 3.06, 34)."""
    top = max((abs(v) for v in values), default=0.0)
    return max(0, significant - 1 - math.floor(math.log10(top))) if top > 0 else significant - 1


def across_runs(runs: dict[str, dict]) -> list[tuple]:
    """One row per finding of :data:`ACROSS_RUNS`: ``(finding, value in each run..., spread)``; the
    spread is max - min of a number, at the precision of the row's values, or whether the runs agree
    on a label. A
    model a run has not trained yet shows as "-" and is left out of the spread."""
    rows = []
    for finding, model, read, kind in ACROSS_RUNS:
        values = [read(models[model]) if model in models else None for models in runs.values()]
        have = [v for v in values if v is not None]
        if kind == "number":
            nd = _decimals(have)  # one precision for the row, its spread included
            cells = [f"{v:.{nd}f}" if v is not None else "-" for v in values]
            spread = f"{max(have) - min(have):.{nd}f}" if len(have) > 1 else "-"
        else:
            cells = [str(v) if v is not None else "-" for v in values]
            n = len(set(have))
            spread = "-" if len(have) < 2 else f"same in all {len(have)}" if n == 1 else f"{n} different"
        rows.append((finding, *cells, spread))
    return rows


# ---- the chapters under nbval --------------------------------------------------------------------
def chapter_paths() -> list[Path]:
    return sorted((REPO / "notebooks").glob("[0-9]*.ipynb")) + [REPO / "book" / "reproduces.ipynb"]


def run_chapters(models_dir: Path, paths: list[Path] | None = None, timeout: int = 1800,
                 env_name: str = modelset.ENV) -> dict:
    """Run each chapter under nbval with ``ATTNCIRCUITS_MODELS=models_dir`` (or the variable
    ``env_name``: ``ATTNCIRCUITS_FAMILY`` for a family's results); per chapter the cells that passed
    and failed (by nbval's cell names) and the claims (``attncircuits.course.claims``) held and not."""
    env = {**os.environ, env_name: str(models_dir.resolve())}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = {}
    logs = models_dir / "chapter-runs"
    logs.mkdir(exist_ok=True)
    for nb in paths or chapter_paths():
        junit, claims = logs / f"{nb.stem}.xml", logs / f"{nb.stem}.claims.jsonl"
        claims.unlink(missing_ok=True)
        t = time.time()
        print(f"replicate: running {nb.relative_to(REPO)} on {models_dir} ...", flush=True)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.notebook_pages", "--nbval-lax",
               f"--junitxml={junit}", str(nb.relative_to(REPO))]
        try:
            subprocess.run(cmd, cwd=REPO, env={**env, "ATTNCIRCUITS_CLAIMS_LOG": str(claims)},
                           stdout=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"replicate: {nb.name} ran past {timeout} s and was stopped", flush=True)
        out[nb.stem] = {**_junit_counts(junit), **_claim_counts(claims), "seconds": round(time.time() - t)}
        c = out[nb.stem]
        print(f"replicate: {nb.name}: {c['cells_passed']} of {c['cells']} cells passed; "
              f"{c['claims_held']} of {c['claims']} claims held; about the corpus: "
              f"{c['corpus_claims_held']} of {c['corpus_claims']}", flush=True)
    return out


def _junit_counts(path: Path) -> dict:
    if not path.is_file():
        return {"cells": 0, "cells_passed": 0, "failed_cells": ["(no result: the run did not finish)"]}
    cases = ET.parse(path).getroot().iter("testcase")
    failed, n = [], 0
    for case in cases:
        n += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name"))
    return {"cells": n, "cells_passed": n - len(failed), "failed_cells": failed}


def _claim_counts(path: Path) -> dict:
    """The recipe's claims (``claims``, ``claims_held``, ``claims_not_held``) and, apart, those about
    the corpus and tokenizer (``corpus_claims``...: ``claim(..., about="corpus")``)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    out = {}
    for about, prefix in (("recipe", "claims"), ("corpus", "corpus_claims")):
        mine = [r for r in rows if r.get("about", "recipe") == about]
        out.update({prefix: len(mine), f"{prefix}_held": sum(r["held"] for r in mine),
                    f"{prefix}_not_held": [f"{r['text']} (measured: {r['measured']})" for r in mine if not r["held"]]})
    # every claim checked, held or not: the reproduces page counts a claim as tested by this run only
    # where it checked the claim's present wording (attncircuits.course.claim_dates)
    out["claims_checked"] = [{"text": r["text"], "held": r["held"], "about": r.get("about", "recipe")} for r in rows]
    return out


#: the file in a run's folder that keeps the commit its training started at
TRAINED_AT = "trained-at.json"


def training_commit(out: Path, started: bool) -> dict | None:
    """The commit the runs in ``out`` were trained at (:func:`gitstate.commit_state`): as ``out``'s
    :data:`TRAINED_AT` says, where a run wrote it; else HEAD's now for runs not ``started`` yet (written
    there, so that a resumed run keeps the commit it started at), and None (unknown) for runs started
    before the file existed or outside a git checkout."""
    path = out / TRAINED_AT
    if path.is_file():
        return json.loads(path.read_text()).get("trained_at")
    state = None if started else gitstate.commit_state(REPO)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"trained_at": state}) + "\n")
    return state


# ---- make replicate ------------------------------------------------------------------------------
def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m attncircuits.train.replicate", description=__doc__.split("\n\n")[1])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", type=Path, help="the set's folder (default: replicates/seed-<seed>)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads for training (default 1)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="train the models one after the other in this process (default: side by side on 2+ cores)")
    p.add_argument("--no-chapters", action="store_true", help="train and measure only; do not run the chapters")
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed must be a whole number >= 0 (got {args.seed})")
    out = Path(os.path.abspath(args.out or REPO / "replicates" / f"seed-{args.seed}"))
    out.mkdir(parents=True, exist_ok=True)
    command = f"make replicate SEED={args.seed}" + (f" OUT={args.out}" if args.out else "")
    trained_at = training_commit(out, started=any((out / n).exists() for n in modelset.SET_MODEL_NAMES))
    (out / modelset.SET_FILE).write_text(json.dumps({"kind": "replicate", "seed": args.seed, "command": command}) + "\n")
    train_set(out, {n: ["--preset", n, "--seed", str(args.seed)] for n in modelset.SET_MODEL_NAMES}, args.threads,
              lanes=None if args.one_at_a_time else default_lanes(ONE_EACH))
    results = {"seed": args.seed, "command": command, "trained_at": trained_at, **headline_numbers(out)}
    if not args.no_chapters:
        results["chapters"] = run_chapters(out)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"replicate: wrote {out / 'results.json'}; read the chapters on this set with\n"
          f"export {modelset.ENV}={out}")


if __name__ == "__main__":
    main()
