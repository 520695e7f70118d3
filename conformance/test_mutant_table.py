"""The mutant table itself (conformance/mutants/): every mutant's snippet is found exactly once in its file (a stale
one, its snippet gone after a refactor, would check nothing any more: it fails here rather than in silence), and
the patched file still compiles, so that a kill is the suite's, not a SyntaxError's.

Never part of a mutant's `tests`: with a mutant planted, its own snippet is gone from the copy, and this file would
then "kill" it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.mutants import MUTANTS
from conformance.mutate import copy_tree

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_applies_cleanly(mutant):
    """A stale mutant (its snippet gone after a refactor) checks nothing any more: it fails here, not in silence."""
    source = (ROOT / mutant.path).read_text()
    found = source.count(mutant.old)
    assert found == 1, f"stale: snippet found {found} times in {mutant.path} (update it in conformance/mutants/)"
    compile(source.replace(mutant.old, mutant.new), mutant.path, "exec")


def test_mutant_names_are_unique():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)) and len(names) >= 25


def test_no_mutant_runs_this_file():
    assert not [m.name for m in MUTANTS if any(t.endswith("test_mutant_table.py") for t in m.tests)]


def test_only_a_survivor_not_argued_equivalent_fails_the_run():
    from conformance.mutate import exit_status, markdown

    plain = next(m for m in MUTANTS if not m.equivalent)
    argued = [m for m in MUTANTS if m.equivalent]
    assert argued, "docs/mutation.md argues two mutants equivalent: they carry equivalent=True"
    assert exit_status([(argued[0], "survived", 1.0), (plain, "killed", 1.0)]) == 0
    assert exit_status([(argued[0], "survived", 1.0), (plain, "survived", 1.0)]) == 1
    assert "1 argued equivalent" in markdown([(argued[0], "survived", 1.0), (plain, "killed", 1.0)])


def test_the_copy_keeps_symbolic_links_as_links(tmp_path):
    """perf/, kernels/ and workloads/ may be links into cbbench/ (`perf -> cbbench/perf`): the copy holds the link
    itself, pointing into the copy, so that a mutant's path and a test's path through it reach the copy's file and
    a patch through it never edits the working tree."""
    repo, copy = tmp_path / "repo", tmp_path / "copy"
    (repo / "cbbench" / "perf").mkdir(parents=True)
    (repo / "cbbench" / "perf" / "report.py").write_text("X = 1\n")
    (repo / "perf").symlink_to("cbbench/perf")
    (repo / "setup.py").write_text("")
    (repo / "setup_link.py").symlink_to("setup.py")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    copy.mkdir()
    copy_tree(copy, root=repo)
    assert (copy / "perf").is_symlink() and str((copy / "perf").readlink()) == "cbbench/perf"
    assert (copy / "setup_link.py").is_symlink() and (copy / "cbbench" / "perf" / "report.py").is_file()
    (copy / "perf" / "report.py").write_text("X = 2\n")  # as a mutant planted at perf/report.py
    assert (copy / "cbbench" / "perf" / "report.py").read_text() == "X = 2\n"
    assert (repo / "cbbench" / "perf" / "report.py").read_text() == "X = 1\n"


def test_the_copy_refuses_a_link_out_of_the_repository(tmp_path):
    repo, copy = tmp_path / "repo", tmp_path / "copy"
    repo.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (repo / "perf").symlink_to(tmp_path / "elsewhere")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    copy.mkdir()
    with pytest.raises(SystemExit, match="perf links outside the repository"):
        copy_tree(copy, root=repo)


def test_the_copy_imports_its_own_perf(tmp_path):
    """A mutant planted in the copy's perf/ is seen only if `cbbench.perf` imports from the copy, not from the working
    tree the editable install points at (every report mutant then "survived"): the copy's own cbbench/ package, first
    on PYTHONPATH, is the one found."""
    copy_tree(tmp_path)
    code = "import cbbench.perf.exceptions as m; print(m.__file__)"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    where = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(where).resolve().is_relative_to(tmp_path.resolve()), where
