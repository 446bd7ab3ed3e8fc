"""The family's files, verified whenever they are read: each member's results and its saved state.

A results folder (``seed-N/``) holds ``recipe.json`` (the seed and every member's config), and for
each finished member ``<member>.json`` and ``<member>.npz``, whose SHA-256s are listed in the
folder's ``manifest.json`` (the format of :mod:`attncircuits.core.manifest`) once both are written:
a member counts as finished only when it is listed there, its two files match their hashes, and its
results name that member, the folder's seed and the member's config in the recipe.

An interrupted member's saved state is ``<member>.partial/resume/``: the training state
(``state.pt``), what it belongs to (``state.json``: step, member, seed, and the hash of the
member's configs) and its own manifest, written and swapped in as a training run's resume state is
(:func:`attncircuits.train.run_folder.save_state`). A state with one bit changed, another member's,
another seed's or another recipe's is refused in one line naming what to delete; it never resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from attncircuits.core import durable
from attncircuits.core.manifest import read_manifest, sha256, verify_manifest
from attncircuits.train import run_folder

try:
    import fcntl
except ImportError:  # Windows: the manifest is then written by one process at a time by the user's care
    fcntl = None

MANIFEST = "manifest.json"


class FamilyFileError(ValueError):
    """A results file or a saved state that cannot be used as it is; one line naming the fix."""


def configs_hash(model_cfg: dict, train_cfg: dict) -> str:
    """What a member's saved state must have been trained with: its model and training configs."""
    text = json.dumps({"model": model_cfg, "train": train_cfg}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# --- finished members: results listed in the folder's manifest ---------------------------------

def entries(out: Path) -> dict[str, str]:
    """The folder's ``{file: SHA-256}`` list ({} when there is none yet); a manifest that does not
    read raises one line."""
    if not (out / MANIFEST).is_file():
        return {}
    try:
        return read_manifest(out)
    except (OSError, ValueError) as err:
        raise FamilyFileError(f"{out / MANIFEST} does not read ({str(err).split(';')[0]}); move {out} away "
                              "and train the family again") from None


def record(out: Path, name: str) -> None:
    """List member ``name``'s two results files in the folder's manifest (under a lock: members
    finish side by side)."""
    fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        table = entries(out)
        for rel in (f"{name}.json", f"{name}.npz"):
            table[rel] = sha256(out / rel)
        durable.write_text(out / MANIFEST, json.dumps({"sha256": dict(sorted(table.items()))}, indent=1) + "\n")
    finally:
        os.close(fd)


def finished(out: Path, name: str, seed: int, config: dict, fix: str, table: dict | None = None) -> dict | None:
    """Member ``name``'s results in ``out`` checked whole (listed, hashes, member, seed, config), or
    None when the member is not finished (no results, results never listed: a run stopped while
    writing them, or a file deleted to train the member again). Results that fail a check raise one line; ``fix`` is the command that trains the
    member again once its files are deleted."""
    table = entries(out) if table is None else table
    files = [out / f"{name}.json", out / f"{name}.npz"]
    listed = [p.name in table for p in files]
    if not any(listed) or not all(p.is_file() for p in files):
        return None  # never listed (stopped while writing), or deleted to be trained again
    again = f"delete {files[0]} and {files[1].name} and run `{fix}` to train {name} again"
    for p, is_listed in zip(files, listed):
        if not is_listed:
            raise FamilyFileError(f"{p} is not listed in {out / MANIFEST}, so it cannot be verified; {again}")
        if sha256(p) != table[p.name]:
            raise FamilyFileError(f"{p} does not match its SHA-256 in {out / MANIFEST} (a damaged or edited file); "
                                  f"{again}")
    try:
        res = json.loads(files[0].read_text())
        assert isinstance(res, dict)
    except (OSError, ValueError, AssertionError):
        raise FamilyFileError(f"{files[0]} does not read; {again}") from None
    if res.get("member") != name:
        raise FamilyFileError(f"{files[0]} holds {res.get('member')}'s results, not {name}'s; {again}")
    if res.get("seed") != seed:
        raise FamilyFileError(f"{files[0]} holds seed {res.get('seed')!r}'s results, but {out} is seed {seed}'s "
                              "(a folder renamed?); move the folder to the name of its seed, or " + again)
    if res.get("config") != config:
        raise FamilyFileError(f"{files[0]} was trained with another config of {name} than this recipe's; {again}")
    return res


# --- interrupted members: the saved state ---------------------------------------------------------

def state_dir(out: Path, name: str) -> Path:
    return out / f"{name}.partial"


def save_state(out: Path, name: str, ident: dict, state: dict) -> None:
    """Write member ``name``'s training state (``ident``: member, seed, configs hash) so that a kill
    at any moment leaves the last whole one."""
    folder = state_dir(out, name)
    folder.mkdir(exist_ok=True)

    def write(d: Path) -> None:
        torch.save(state, d / "state.pt")
        (d / "state.json").write_text(json.dumps({"step": state["step"], **ident}) + "\n")

    run_folder.save_state(folder, write)


#: what a member's saved state keeps of its evaluations (family.train_member)
KEPT = frozenset({"per_token", "icl", "icl_se", "icl_steps", "icl_rows"})


def load_state(out: Path, name: str, ident: dict) -> dict | None:
    """Member ``name``'s saved state (None: there is none), checked against its manifest and
    against ``ident``; anything else raises one line naming the folder to delete."""
    folder = state_dir(out, name)
    if not folder.is_dir():
        return None
    run_folder.recover_state(folder)
    resume = folder / run_folder.RESUME_SUBDIR
    if not resume.is_dir():
        return None  # stopped before its first state was whole: nothing to resume
    fix = f"delete {folder} to train {name} from the start"
    try:
        verify_manifest(resume)
        saved = json.loads((resume / "state.json").read_text())
    except (OSError, ValueError) as err:
        why = "does not match its checksums" if "SHA-256" in str(err) else "is incomplete or does not read"
        raise FamilyFileError(f"the saved state in {folder} {why}; {fix}") from None
    if saved.get("member") != ident["member"]:
        raise FamilyFileError(f"{folder} holds {saved.get('member')}'s saved state, not {name}'s; {fix}")
    if saved.get("seed") != ident["seed"]:
        raise FamilyFileError(f"{folder} holds seed {saved.get('seed')!r}'s saved state, not seed {ident['seed']}'s; {fix}")
    if saved.get("configs") != ident["configs"]:
        raise FamilyFileError(f"{folder} was saved by another recipe of {name} than this package's; {fix}")
    try:
        state = torch.load(resume / "state.pt", weights_only=False, map_location="cpu")  # a GPU's state resumes anywhere
        assert isinstance(state, dict) and state.get("step") == saved["step"] and "kept" in state
    except Exception:  # noqa: BLE001 - pickle, zip and torch each raise their own
        raise FamilyFileError(f"the saved state in {folder} does not read; {fix}") from None
    if not KEPT.issubset(state["kept"]):  # saved by a version that kept fewer readings a step
        raise FamilyFileError(f"the saved state in {folder} lacks the readings kept now "
                              f"({', '.join(sorted(KEPT - set(state['kept'])))}); {fix}")
    return state


def remove_state(out: Path, name: str) -> None:
    durable.remove(state_dir(out, name))
    durable.fsync_dir(out)
