"""The repository's commit, read with git where there is one: what a run record stores as the commit
it was trained at, and the order of two commits (is one an ancestor of the other).

Every function answers ``None`` where git or the repository is missing (a pip install), so that a
caller says "unknown" instead of failing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

#: the folders whose uncommitted changes make a run differ from its commit
TRACKED = ("src", "notebooks", "book")


def git(repo: str | Path, *args: str) -> str | None:
    """``git -C repo args...``'s stdout without its last newline, or None where it fails."""
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.rstrip("\n") if r.returncode == 0 else None


def commit_state(repo: str | Path) -> dict | None:
    """``{"commit": HEAD's sha, "date": its committer date (ISO 8601), "clean": no uncommitted change
    in src/, notebooks/ or book/}``, or None outside a git checkout."""
    line = git(repo, "show", "-s", "--format=%H %cI", "HEAD")
    if not line:
        return None
    commit, date = line.split(" ", 1)
    status = git(repo, "status", "--porcelain", "--untracked-files=no", "--", *TRACKED)
    return {"commit": commit, "date": date, "clean": status == ""}


def is_ancestor(repo: str | Path, older: str, newer: str) -> bool | None:
    """Whether commit ``older`` is ``newer`` or one of its ancestors; None where git cannot tell (no
    repository, or a commit it does not hold)."""
    try:
        r = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(r.returncode)
