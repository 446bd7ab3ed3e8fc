"""Writing files so that a crash, a kill or a full disk leaves either the old state or the new one.

The ground floor of ``checkpoints/pretrained.py`` and ``train/run_folder.py`` (a training run's output
folder): data is flushed to the disk (fsync) before the rename that makes it visible, and the rename
is flushed with its folder. ``hold_signals`` keeps Ctrl-C (and SIGTERM) from cutting such a
sequence in two: the first one waits for the end of the block, a second one interrupts at once.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the entries of ``path`` (files created, renamed or removed in it) durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform that cannot open folders (Windows): renames are durable there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path``, then every folder, innermost first."""
    folders = [path]
    for p in sorted(path.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            folders.append(p)
        elif p.is_file():
            fsync_file(p)
    for d in reversed(folders):
        fsync_dir(d)


def write_file(path: Path, write, binary: bool = False) -> None:
    """Replace ``path`` in one rename, durably, with what ``write(f)`` writes into ``path.new``
    (opened as text in UTF-8, or as bytes when ``binary``)."""
    new = path.with_name(path.name + ".new")
    with open(new, "wb") if binary else open(new, "w", encoding="utf-8") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(new, path)
    fsync_dir(path.parent)


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename, durably."""
    write_file(path, lambda f: f.write(text))


def real_folder(given: Path | str, label: str = "") -> Path:
    """``given`` as the real folder a command will write: symbolic links resolved (a link to a
    missing folder names the folder to create); a loop, or a root, raises ValueError in one line
    that starts with ``label`` (the option, as the user typed it: ``"--out "``, ``"OUT="``)."""
    out = Path(os.path.abspath(given))
    real = Path(os.path.realpath(out))
    if real.is_symlink() or (out.is_symlink() and real == out):
        raise ValueError(f"{label}{given} is a symbolic link that does not resolve (a loop); name a real folder")
    if not real.name or real.parent == real:
        raise ValueError(f"{label}{given} is not a folder this program can create; name a new folder")
    return real


def link_loop(path: Path) -> bool:
    """Whether ``path`` (or a folder above it) is a symbolic link that never resolves (a loop)."""
    try:
        Path(path).resolve(strict=True)
    except RuntimeError:  # Python before 3.13 raises this for a loop
        return True
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be made and written into (None: it can), found before any work and
    without leaving anything behind: a probe folder is made and removed in its nearest existing
    ancestor (``folder`` itself when it exists)."""
    folder = Path(os.path.abspath(folder))
    ancestor = next(p for p in (folder, *folder.parents) if p.exists())
    if not ancestor.is_dir():
        return f"{ancestor} is a file"
    try:
        os.rmdir(tempfile.mkdtemp(dir=ancestor, prefix=".probe-"))
    except OSError as err:
        return f"{ancestor} cannot be written ({err.strerror})"
    return None


def remove(path: Path) -> None:
    """Remove a file or a folder tree (not following a link); nothing if it is not there."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


@contextmanager
def hold_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """Inside the block, the first SIGINT/SIGTERM is held until the block ends (``held`` then names
    it); a second one raises KeyboardInterrupt at once. Elsewhere than the main thread: no effect."""
    held: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def handler(signum, frame):
        if held:
            raise KeyboardInterrupt
        held.append(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield held
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def ignore_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """Inside the block SIGINT/SIGTERM do nothing: for the few file removals after a commit, which
    must not stop half-way and leave a folder that reads as an interrupted run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
