"""What a killed :func:`~attncircuits.checkpoints.pretrained.save_checkpoint` leaves, settled before
new work: ``<dir>.partial`` holds ``final/`` (the new model, complete or not) and, between the
swap's two renames, ``old/`` (the model it replaces). A finished model is never lost.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attncircuits.checkpoints.pretrained import is_checkpoint_dir, partial_dir
from attncircuits.core import durable
from attncircuits.core.manifest import verify_manifest

__all__ = ["resolve_partial"]


def _whole(directory: Path, needs: tuple[str, ...] = ()) -> bool:
    """Whether ``directory`` is a complete checkpoint this package wrote, its files as its manifest
    lists them (and each of ``needs`` among them)."""
    try:
        verify_manifest(directory)
    except (OSError, ValueError):
        return False
    return is_checkpoint_dir(directory) and all((directory / n).is_file() for n in needs)


def resolve_partial(directory: Path, needs: tuple[str, ...] = ()) -> str | None:
    """Settle the ``<dir>.partial`` a killed :func:`save_checkpoint` left, before any new work, and
    say in one line what was done (None: there was none). Killed between its two renames, the
    finished new model (``final/``, complete with each of ``needs``) is put in place, else the old
    one (``old/``) goes back; with ``directory`` in place, what is left is a save that never
    finished (or the copy of the model just replaced) and goes. Files this package did not write
    there are never removed: a FileExistsError names the folder to move away."""
    directory = Path(directory)
    tmp = partial_dir(directory)
    if not (tmp.exists() or tmp.is_symlink()):
        return None
    others = sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() and not tmp.is_symlink() else None
    if others is None or set(others) - {"final", "old"}:
        raise FileExistsError(f"{tmp} holds files this program did not write; move it away and run again")
    final, old = tmp / "final", tmp / "old"
    done = "removed an unfinished save"
    if not (directory.exists() or directory.is_symlink()):
        for kept, said in ((final, "the finished model of a save that was stopped"),
                           (old, "the model a stopped save was replacing")):
            if kept.is_dir() and _whole(kept, needs):
                kept.rename(directory)
                durable.fsync_dir(directory.parent)
                done = f"put {said} back in {directory}"
                break
    with durable.ignore_signals():
        shutil.rmtree(tmp)
        durable.fsync_dir(tmp.parent)
    return f"{tmp}: {done}"
