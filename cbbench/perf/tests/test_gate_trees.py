"""The gate's trees and run order: a revision checked out as a detached worktree and removed again (on an error too),
each layout of the repository imported from its own tree (the link folder of setup.py's mapping, or the root of a
`cbbench/` package) even with this checkout's cbbench installed, and the ABBA order of the runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cbbench.perf.gate import trees as tr
from cbbench.perf.gate.arms import BASE, HEAD, run_order

GIT_ID = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], check=True, capture_output=True, text=True).stdout


def _fake_repo(root: Path, layout: str) -> Path:
    """A repository whose tree imports as cbbench.perf.cli and refengine, in one of the two layouts."""
    pkg = root / "cbbench" if layout == "package" else root
    for folder in ("kernels", "perf/cli", "workloads"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")  # (git keeps no empty folder)
    if layout == "package":
        (pkg / "__init__.py").write_text("")
    (root / "refengine").mkdir()
    (root / "refengine" / "__init__.py").write_text("")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    return root


@pytest.mark.parametrize("layout", ["mapped", "package"])
def test_each_layout_imports_from_its_own_tree_even_with_cbbench_installed(tmp_path, layout):
    repo = _fake_repo(tmp_path / "repo", layout)
    assert tr.layout(repo) == layout
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sha = tr.head_sha(repo)
    tree = tr.check_out(repo, BASE, "HEAD", sha, scratch / "base")
    try:
        assert (scratch / "base" / "refengine" / "__init__.py").is_file()
        env = tr.arm_environment(tr.import_root(tree, scratch))
        tr.check_imports(tree, env)  # cbbench.perf.cli and refengine resolve inside the worktree
        if layout == "mapped":  # without the link folder this checkout's installed cbbench wins: the check fails
            with pytest.raises(ValueError, match="imports cbbench.perf.cli from .*, not from its tree"):
                tr.check_imports(tree, tr.arm_environment(tmp_path / "nothing-here"))
    finally:
        tr.remove(repo, tree)
    assert not (scratch / "base").exists()
    assert str(scratch / "base") not in git(repo, "worktree", "list")


def test_a_tree_without_cbbench_is_refused(tmp_path):
    (tmp_path / "perf").mkdir()
    with pytest.raises(ValueError, match="holds no cbbench"):
        tr.layout(tmp_path)


def test_revisions_resolve_or_are_named_as_missing(tmp_path):
    repo = _fake_repo(tmp_path / "repo", "mapped")
    assert tr.resolve(repo, "HEAD", "--base") == tr.head_sha(repo)
    for bad in ("no-such-branch", "-x", ""):
        with pytest.raises(ValueError, match="--base"):
            tr.resolve(repo, bad, "--base")
    with pytest.raises(ValueError, match="not inside a git repository"):
        tr.repo_root(tmp_path)


def test_dirty_means_uncommitted_changes_to_tracked_files(tmp_path):
    repo = _fake_repo(tmp_path / "repo", "mapped")
    assert not tr.dirty(repo)
    (repo / "untracked.txt").write_text("x")
    assert not tr.dirty(repo)
    (repo / "refengine" / "__init__.py").write_text("changed = True\n")
    assert tr.dirty(repo) and tr.work_tree(repo, HEAD).dirty


def test_a_checkout_that_fails_names_the_arm(tmp_path):
    repo = _fake_repo(tmp_path / "repo", "mapped")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")  # git refuses a non-empty folder
    with pytest.raises(ValueError, match="for the base arm"):
        tr.check_out(repo, BASE, "HEAD", tr.head_sha(repo), tmp_path / "taken")


def test_the_scratch_folder_is_removed_on_an_error():
    with pytest.raises(KeyboardInterrupt), tr.scratch_folder() as folder:
        (folder / "x").write_text("x")
        raise KeyboardInterrupt
    assert not folder.exists()


def test_run_order_is_abba_blocks():
    order = run_order(4)
    assert [a for a, _ in order] == [BASE, HEAD, HEAD, BASE, BASE, HEAD, HEAD, BASE]
    assert [i for a, i in order if a == BASE] == [0, 1, 2, 3] and [i for a, i in order if a == HEAD] == [0, 1, 2, 3]
    for block in range(2):  # every block of four: the arms' mean positions are equal (a linear drift cancels)
        positions = {
            arm: [k for k, (a, _) in enumerate(order[4 * block : 4 * block + 4]) if a == arm] for arm in (BASE, HEAD)
        }
        assert sum(positions[BASE]) == sum(positions[HEAD])
    assert [a for a, _ in run_order(3)] == [BASE, HEAD, HEAD, BASE, BASE, HEAD]
    with pytest.raises(ValueError):
        run_order(0)


def test_this_checkout_is_a_tree_the_gate_can_run():
    root = Path(__file__).resolve().parents[3]
    assert tr.layout(root) in ("mapped", "package")
    assert sys.executable  # (the arms share this interpreter)


def test_arms_write_bytecode_and_name_their_tree_first(monkeypatch, tmp_path):
    """With PYTHONDONTWRITEBYTECODE every run would compile its tree again (a warm work tree would not): the arms
    write bytecode, and compile_tree fills a fresh worktree's caches before any run."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = tr.arm_environment(tmp_path / "links")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPATH"] == f"{tmp_path / 'links'}:/elsewhere"
    repo = _fake_repo(tmp_path / "repo", "mapped")
    tr.compile_tree(tr.work_tree(repo, HEAD))
    assert list((repo / "refengine" / "__pycache__").glob("__init__.*.pyc"))


def test_a_run_that_recorded_another_trees_sha_is_refused(tmp_path):
    """After every run the rows' git_sha (written by the arm's own code) must be the arm's commit: a run of another
    tree (a shadowed import path) stops the gate; the work tree's `-dirty` and an unknown sha pass."""
    from cbbench.perf.gate.arms import Arm, Run
    from cbbench.perf.gate.run import _check_ran

    tree = tr.Tree(BASE, "main", "a" * 40, tmp_path, checked_out=True)
    arm = Arm(BASE, tree.name, tmp_path, {}, tree=tree)
    for ok in ("a" * 40, "a" * 40 + "-dirty", "unknown"):
        _check_ran(arm, Run(BASE, 0, tmp_path / "r.csv", [{"git_sha": ok}], 1.0, 1.0))
    with pytest.raises(ValueError, match="ran another tree's code"):
        _check_ran(arm, Run(BASE, 0, tmp_path / "r.csv", [{"git_sha": "b" * 40}], 1.0, 1.0))
