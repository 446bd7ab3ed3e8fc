"""A folder's SHA-256 manifest, and weight files written with the usual file mode.

``manifest.json`` maps every file of a folder (checkpoints, the shipped corpus files, a training
run's resume state) to its SHA-256; a folder is used only once every listed file matches and no
weight file is left out.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import save_file


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_weights(tensors: dict, path: Path) -> None:
    """safetensors file with the usual file mode (safetensors itself writes 0600). A failed write
    (disk full, file too large, no permission) is an OSError naming the file, as ``open`` gives."""
    try:
        (np_save_file if tensors and isinstance(next(iter(tensors.values())), np.ndarray) else save_file)(tensors, path)
    except SafetensorError as err:
        code = re.search(r"(?:code: |os error )(\d+)", str(err))
        code = int(code.group(1)) if code else errno.EIO
        raise OSError(code, os.strerror(code), str(path)) from None
    path.chmod(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_manifest(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {p.relative_to(directory).as_posix(): sha256(p) for p in files}
    (directory / "manifest.json").write_text(json.dumps({"sha256": manifest}, indent=1) + "\n")


def read_manifest(directory: Path) -> dict[str, str]:
    """The ``{relative path: SHA-256}`` entries of ``directory/manifest.json``, refused when it is
    missing, unreadable, empty, or leaves a weight file (``*.safetensors``) of the folder out."""
    mpath = directory / "manifest.json"
    fix = f"restore the folder from git (`git checkout -- {directory}`) or retrain it"
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} is missing, so the checkpoint cannot be verified; {fix}")
    try:
        entries = json.loads(mpath.read_text(encoding="utf-8"))["sha256"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{mpath} is corrupt (not a JSON object with a 'sha256' table: {err!r}); {fix}") from None
    if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
        raise ValueError(f"{mpath} is corrupt (its 'sha256' table must map file names to hashes); {fix}")
    if not entries:
        raise ValueError(f"{mpath} lists no files, so nothing in {directory} can be verified; {fix}")
    unlisted = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*.safetensors"))
    unlisted = [rel for rel in unlisted if rel not in entries]
    if unlisted:
        raise ValueError(f"{directory / unlisted[0]} is not listed in {mpath}, so it cannot be verified; "
                         f"remove it, or {fix}")
    return entries


def verify_file(directory: Path, rel: str, entries: dict[str, str] | None = None) -> Path:
    """Check one file of ``directory`` against its manifest entry; returns its path."""
    entries = read_manifest(directory) if entries is None else entries
    p = directory / rel
    if rel not in entries:
        raise ValueError(f"{p} is not listed in {directory / 'manifest.json'}, so it cannot be verified; "
                         "remove it, or restore the folder from git or retrain it")
    if not p.is_file():
        raise FileNotFoundError(f"{p} is listed in the manifest but missing; restore it from git or retrain")
    if sha256(p) != entries[rel]:
        raise ValueError(
            f"{p} does not match its SHA-256 in {directory / 'manifest.json'} (corrupt or edited file); "
            f"restore it with `git checkout -- {p}` or retrain with `make train`"
        )
    return p


def verify_manifest(directory: Path) -> None:
    """Raise if the manifest is unusable, leaves out a weight file, or a listed file is missing or
    differs from its hash."""
    entries = read_manifest(directory)
    for rel in entries:
        verify_file(directory, rel, entries)


def record_tokenizer_hash(directory: str | Path) -> None:
    """Add the tokenizer's SHA-256 to the config of a checkpoint saved before loading checked it,
    and rewrite its manifest; the weights are not touched. The folder must verify first."""
    directory = Path(directory)
    verify_manifest(directory)
    cfg_path = directory / "config.json"
    config = json.loads(cfg_path.read_text())
    config["tokenizer_sha256"] = sha256(directory / "tokenizer.json")
    cfg_path.write_text(json.dumps(config, indent=1) + "\n")
    write_manifest(directory)
