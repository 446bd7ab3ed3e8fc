"""A training run's staging folder ``<out>.partial``: one run at a time, a resumable state, and an
end that is a transaction.

Layout (every name below is written by this module; nothing else in the folder is ever removed)::

    in-progress.json   PARTIAL_MARKER: written first; which process runs (pid, command, start)
    run.json           the run's id: settings, corpus contents, tokenizer hash (see cli.py)
    tokenizer.json corpus/    what the run trains on, when it made them
    resume/            what --resume continues from (resume.new/ and resume.old/ while it is saved)
    final.new/ final/  the finished model while it is written / once it is complete and durable
    old/               the model it replaces, between the two renames of the swap

The running process holds an OS lock (``flock``) on the folder, released when it exits however it
exits, so a second run into the same ``--out`` is refused while the first lives. The end of a run
(:func:`finish`): the model is written to ``final.new/``, fsynced and renamed ``final/``; the old
``<out>`` is renamed ``old/``; ``final/`` is renamed ``<out>``; only then are the resume state, the
old model and the folder removed. A run stopped at any point leaves a folder that
:func:`open_partial` with ``resume`` completes (:func:`place`) or continues, and :func:`kept` says
at any moment, from what is on disk, where the finished model or the progress is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from attncircuits.checkpoints.pretrained import (
    PARTIAL_MARKER,
    RESUME_SUBDIR,
    check_replaceable,
    is_checkpoint_dir,
    partial_dir,
    swap_into,
)
from attncircuits.core import durable
from attncircuits.core.manifest import verify_manifest, write_manifest

try:
    import fcntl
except ImportError:  # Windows: no lock, one run per folder is then the user's care
    fcntl = None

RUN_ID = "run.json"
FINAL, FINAL_NEW, OLD = "final", "final.new", "old"
STATES = (RESUME_SUBDIR, RESUME_SUBDIR + ".new", RESUME_SUBDIR + ".old")
#: every name this module may create in ``<out>.partial``; only these are removed
OURS = {PARTIAL_MARKER, PARTIAL_MARKER + ".new", RUN_ID, RUN_ID + ".new", "tokenizer.json", "corpus",
        FINAL, FINAL_NEW, OLD, *STATES}

#: called with the name of each step of the end of a run (tests stop a run there)
hook: Callable[[str], None] = lambda step: None  # noqa: E731


class RunFolderError(Exception):
    """The output folder cannot be used as asked; one line naming the fix."""


class Partial:
    """An open, locked ``<out>.partial``; ``close()`` (or the process ending) releases the lock."""

    def __init__(self, out: Path, path: Path, fd: int | None):
        self.out, self.path, self._fd = out, path, fd
        self.ended = False  # the run had put its model in place before it stopped

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def pending(self) -> bool:
        """Whether a finished model waits in ``final/`` to be put in place."""
        return (self.path / FINAL).is_dir()

    @property
    def state_step(self) -> int | None:
        """The step the saved resume state continues from (None: no usable state)."""
        return saved_step(self.path)


def saved_step(tmp: Path) -> int | None:
    try:
        step = json.loads((tmp / RESUME_SUBDIR / "state.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


def _holder(tmp: Path) -> str:
    try:
        m = json.loads((tmp / PARTIAL_MARKER).read_text())
        return f"pid {m['pid']}, started {m['started']}: {m['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "process unknown"


def _lock(tmp: Path) -> int | None:
    if fcntl is None:
        return None
    fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RunFolderError(f"another training run is writing {tmp} ({_holder(tmp)}); wait for it to end, "
                             "or choose another --out") from None
    return fd


def _mark(tmp: Path, out: Path, command: list[str]) -> None:
    durable.write_text(tmp / PARTIAL_MARKER, json.dumps({
        "written_by": "attncircuits.train", "out": str(out), "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(command)}) + "\n")


def recover_state(tmp: Path) -> None:
    """After a kill inside :func:`save_state`: keep the newest complete state as ``resume/``."""
    good = next((name for name in STATES if _state_ok(tmp / name)), None)
    if good is None:
        return  # nothing complete: leave what is there for the error that names it
    if good != RESUME_SUBDIR:
        durable.remove(tmp / RESUME_SUBDIR)
        (tmp / good).rename(tmp / RESUME_SUBDIR)
        durable.fsync_dir(tmp)
    for name in STATES[1:]:
        durable.remove(tmp / name)


def _state_ok(directory: Path) -> bool:
    try:
        verify_manifest(directory)
        return isinstance(json.loads((directory / "state.json").read_text())["step"], int)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _complete(directory: Path) -> bool:
    try:
        verify_manifest(directory)
    except (OSError, ValueError):
        return False
    return is_checkpoint_dir(directory)


def open_partial(out: Path, resume: bool, command: list[str]) -> Partial:
    """Create and lock ``<out>.partial`` (with ``resume``: reopen the interrupted run's); refuse a
    folder this program did not write, one another run holds, or a kept run without ``resume``."""
    tmp = partial_dir(out)
    try:
        tmp.mkdir()
        created = True
    except FileExistsError:
        created = False
    except OSError as err:
        raise RunFolderError(f"--out {out}: cannot write {tmp} ({err.strerror}); choose a folder you can write to") from None
    if tmp.is_symlink() or not tmp.is_dir() or not (created or (tmp / PARTIAL_MARKER).is_file()):
        raise RunFolderError(f"{tmp} exists and was not written by this program; move it away or choose another --out")
    fd = _lock(tmp)
    part = Partial(out, tmp, fd)
    try:
        if not created:
            recover_state(tmp)
            if (tmp / FINAL_NEW).is_dir() and not (tmp / FINAL).exists() and _complete(tmp / FINAL_NEW):
                (tmp / FINAL_NEW).rename(tmp / FINAL)  # killed between writing the model and committing it
            step = part.state_step
            if part.pending and not resume:
                raise RunFolderError(f"{tmp} holds a finished model not yet in place: add --resume to put it in {out}")
            if (tmp / RESUME_SUBDIR).exists() and not resume:
                if step is None:
                    raise RunFolderError(f"{tmp} holds an interrupted run whose saved state is damaged: delete {tmp} "
                                         "to start over")
                raise RunFolderError(f"{tmp} holds an interrupted run (stopped before step {step}): add --resume to "
                                     f"continue it, or delete {tmp} to start over")
            if (tmp / OLD).is_dir() and not part.pending and (out.exists() or out.is_symlink()):
                part.ended = resume  # stopped after the model was put in place: only the tidying was left
                clean(tmp, keep_folder=True)
            if not part.pending and not (tmp / RESUME_SUBDIR).exists():
                clean(tmp, keep_folder=True)  # left by a run stopped before its first saved state
        if resume and not part.pending and not (tmp / RESUME_SUBDIR).exists() and not part.ended:
            raise RunFolderError(f"--resume: there is no interrupted run to continue ({tmp} holds none); leave out --resume")
        _mark(tmp, out, command)
    except BaseException:
        part.close()
        if created:
            clean(tmp)
        raise
    return part


def check_run_id(part: Partial, run_id: dict, resume: bool) -> None:
    """Store the run's id (a new run) or refuse to continue a run started with another one."""
    path = part.path / RUN_ID
    if not resume:
        durable.write_text(path, json.dumps(run_id) + "\n")
        return
    try:
        saved = json.loads(path.read_text())
        assert isinstance(saved, dict)
    except (OSError, ValueError, AssertionError):
        raise RunFolderError(f"--resume: {path} is missing or damaged, so the run cannot be matched to this command; "
                             f"delete {part.path} to start over") from None
    differs = sorted(k for k in set(run_id) | set(saved) if run_id.get(k) != saved.get(k))
    if differs:
        raise RunFolderError(f"--resume: the run in {part.path} was started with other settings or files "
                             f"({', '.join(differs)}); repeat its command with --resume, or delete {part.path} to start over")


def save_state(tmp: Path, write: Callable[[Path], None]) -> None:
    """Write a resume state with ``write(folder)`` into ``resume.new/``, make it durable, then swap it
    in for ``resume/`` by renames (a kill at any point leaves one complete state, see recover_state)."""
    new, cur, old = (tmp / name for name in (RESUME_SUBDIR + ".new", RESUME_SUBDIR, RESUME_SUBDIR + ".old"))
    durable.remove(new)
    try:
        new.mkdir()
        write(new)
        write_manifest(new)
        durable.fsync_tree(new)
    except BaseException:
        durable.remove(new)  # half a state is no use, and frees the space it took
        raise
    durable.remove(old)
    if cur.exists():
        cur.rename(old)
    new.rename(cur)
    durable.fsync_dir(tmp)
    durable.remove(old)


def finish(part: Partial, write: Callable[[Path], None], overwrite: bool) -> None:
    """The end of a run: the model written by ``write(folder)`` replaces ``<out>`` (see the module
    docstring). The caller holds signals (:func:`attncircuits.core.durable.hold_signals`)."""
    tmp = part.path
    hook("write")
    durable.remove(tmp / FINAL_NEW)
    try:
        (tmp / FINAL_NEW).mkdir()
        write(tmp / FINAL_NEW)
    except BaseException:
        durable.remove(tmp / FINAL_NEW)  # a half-written model is no use, and frees the space it took
        raise
    try:
        hook("written")
    finally:  # the model is complete and durable: commit it, even when stopped here
        (tmp / FINAL_NEW).rename(tmp / FINAL)
        durable.fsync_dir(tmp)
    hook("committed")
    place(part, overwrite)


def place(part: Partial, overwrite: bool) -> None:
    """Put the complete model in ``final/`` at ``<out>``, then remove what the run kept."""
    tmp, out = part.path, part.out
    if (tmp / OLD).exists() and (out.exists() or out.is_symlink()):
        raise RunFolderError(f"{out} exists and {tmp / OLD} holds the model it replaced: the finished model is kept in "
                             f"{tmp / FINAL}; move {out} away and run the same command with --resume")
    if not (tmp / OLD).exists():
        try:
            check_replaceable(out, overwrite)
        except FileExistsError as err:
            raise RunFolderError(f"the finished model is kept in {tmp / FINAL}, but {err}; then run the same command "
                                 "with --resume to put it in place".replace("overwrite=True (CLI: --overwrite)", "--overwrite")) from None
    swap_into(out, tmp / FINAL, tmp / OLD, between=lambda: hook("old moved"))
    with durable.ignore_signals():  # the model is in place: what follows is tidying, never cut short
        hook("placed")
        left = clean(tmp)
    if left:
        print(f"{tmp} is kept: it holds files this program did not write ({', '.join(left[:3])})", file=sys.stderr)


def clean(tmp: Path, keep_folder: bool = False) -> list[str]:
    """Remove what this program wrote in ``tmp`` (and ``tmp`` itself when nothing else is left);
    returns the names of what is left."""
    if not tmp.is_dir() or tmp.is_symlink():
        return []
    order = {name: i for i, name in enumerate((*STATES, RUN_ID, FINAL_NEW, FINAL, OLD))}  # the marker last
    for p in sorted(tmp.iterdir(), key=lambda p: order.get(p.name, len(order) + (p.name == PARTIAL_MARKER))):
        if p.name in OURS:
            durable.remove(p)
    left = sorted(p.name for p in tmp.iterdir())
    if not left and not keep_folder:
        tmp.rmdir()
        durable.fsync_dir(tmp.parent)
    return left


def keeps_anything(out: Path) -> bool:
    """Whether ``<out>.partial`` holds a model or a state (complete or not) that is worth keeping."""
    tmp = partial_dir(out)
    return any((tmp / name).exists() for name in (FINAL, FINAL_NEW, OLD, *STATES))


def kept(out: Path, steps: int | None = None) -> str:
    """Where the run's result is now, read from the disk (so it is true when it is printed)."""
    tmp = partial_dir(out)
    if (tmp / FINAL).is_dir():
        old = f" (the model it replaces is in {tmp / OLD})" if (tmp / OLD).is_dir() and not out.exists() else ""
        return f"the finished model is kept in {tmp / FINAL}{old}: run the same command with --resume to put it in {out}"
    step = saved_step(tmp)
    if step is not None:
        of = f" of {steps}" if steps else ""
        return f"the progress up to step {step}{of} is kept in {tmp}: run the same command with --resume to continue"
    if keeps_anything(out):
        return f"{tmp} is kept as it is (its saved state is incomplete or damaged): delete it to start over"
    return "nothing was kept"
