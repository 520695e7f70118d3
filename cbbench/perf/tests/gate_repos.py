"""A scratch git repository holding this checkout's files, for the gate's end-to-end tests: one commit of every file
git tracks or would track (uncommitted changes included, so the tests run the code under test), never a branch of
this repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GIT_ID = ["-c", "user.name=cbbench-test", "-c", "user.email=test@cbbench.local"]


def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], capture_output=True, text=True, check=True)
    return res.stdout.strip()


def copy_of_this_checkout(dst: Path) -> Path:
    """`dst` as a new repository with one commit of this checkout's files; returns it."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        rel = raw.decode()
        src = ROOT / rel
        if not rel or not src.exists() or (src.is_dir() and not src.is_symlink()):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel, follow_symlinks=False)
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "commit", "-q", "-m", "the checkout under test")
    return dst


def commit_change(repo: Path, path: str, old: str, new: str, message: str) -> str:
    """A commit on top of HEAD that replaces `old` by `new` in `path` (HEAD moves to it); returns its sha."""
    target = repo / path
    text = target.read_text()
    assert old in text, f"{path} no longer holds {old!r}"
    target.write_text(text.replace(old, new))
    git(repo, "commit", "-q", "-am", message)
    return git(repo, "rev-parse", "HEAD")
