"""`cbbench gate`'s bad input: one line on stderr, exit 2, nothing written and no worktree left: a revision that does
not exist, a dirty work tree where --head names its commit, an option the base tree's perf does not know (the arm
and its error line named), two servers that serve different models or none at all, an existing output, and too
few repeats for the tests to ever be significant. A failed head run fails the gate (exit 1)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from gate_repos import commit_change, copy_of_this_checkout, git
from typer.testing import CliRunner

from benchmarks.fake_openai_server import FakeOpenAIServer
from cbbench.perf.cli import app

SIM = ["--device", "sim:h200", "--num-prompts", "4", "--quiet"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_this_checkout(tmp_path_factory.mktemp("gate-cli") / "repo")


def gate(repo: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(repo)
    res = CliRunner().invoke(app, ["gate", *args])
    return res.exit_code, res.stdout, res.stderr


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _nothing_left(repo: Path, out: Path) -> None:
    assert not out.exists() and not out.with_suffix(".json").exists() and not out.with_suffix(".records").exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1  # the checkouts of the gate are gone


def test_a_revision_that_does_not_exist(repo, monkeypatch, tmp_path):
    out = tmp_path / "g.csv"
    code, _, err = gate(repo, monkeypatch, "--base", "no-such-rev", "--output", str(out), *SIM)
    assert code == 2 and "--base no-such-rev: no such revision" in _one_line(err)
    _nothing_left(repo, out)


def test_a_dirty_work_tree_where_head_names_its_commit(repo, monkeypatch, tmp_path):
    out = tmp_path / "g.csv"
    readme = repo / "README.md"
    text = readme.read_text()
    readme.write_text(text + "\nan uncommitted change\n")
    try:
        code, _, err = gate(repo, monkeypatch, "--base", "HEAD", "--head", "HEAD", "--output", str(out), *SIM)
    finally:
        readme.write_text(text)
    assert code == 2 and "uncommitted changes" in _one_line(err) and "--head HEAD" in err
    _nothing_left(repo, out)


def test_an_option_the_base_tree_does_not_know_names_the_arm(tmp_path, monkeypatch):
    repo = copy_of_this_checkout(tmp_path / "repo")
    head = git(repo, "rev-parse", "HEAD")
    # an older perf that spelled the option otherwise
    old = commit_change(
        repo,
        "perf/plan/declared.py",
        "warmup = option(int, 8, ",
        'warmup = option(int, 8, flags=("--warm-up",), help=',
        "old",
    )
    git(repo, "checkout", "-q", "--detach", head)
    out = tmp_path / "g.csv"
    code, _, err = gate(repo, monkeypatch, "--base", old, "--warmup", "2", "--output", str(out), *SIM)
    line = _one_line(err)
    assert code == 2 and f"the base arm ({old[:7]}" in line and "cannot run this configuration" in line
    assert "--warmup" in line  # perf's own words: No such option
    _nothing_left(repo, out)


def test_an_existing_output_is_refused_before_anything_runs(repo, monkeypatch, tmp_path):
    out = tmp_path / "g.csv"
    out.write_text("keep me\n")
    code, _, err = gate(repo, monkeypatch, "--base", "HEAD", "--output", str(out), *SIM)
    assert code == 2 and "exists" in _one_line(err) and out.read_text() == "keep me\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--base", "HEAD", "--base-url", "http://127.0.0.1:9"], "not both"),
        (["--base-url", "http://127.0.0.1:9"], "go together"),
        ([], "--base REV is missing"),
        (["--base", "HEAD", "--repeats", "4"], "use --repeats 5"),
        (["--base", "HEAD", "--confidence", "1.5"], "confidence"),
        (["--base", "HEAD", "--min-effect", "mean_ttft_ms=fast"], "expected a number"),
        (["--base", "HEAD", "--backend", "openai"], "--backend is for two servers"),
    ],
)
def test_bad_options_are_one_line(repo, monkeypatch, tmp_path, args, message):
    code, _, err = gate(repo, monkeypatch, *args, "--output", str(tmp_path / "g.csv"), *SIM)
    assert code == 2 and message in _one_line(err)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when the block ends: nothing listens there


def test_servers_that_serve_different_models_or_do_not_answer(repo, monkeypatch, tmp_path):
    out = tmp_path / "g.csv"
    with FakeOpenAIServer(model="model-a") as a, FakeOpenAIServer(model="model-b") as b:
        code, _, err = gate(repo, monkeypatch, "--base-url", a.base_url, "--head-url", b.base_url, "--output", str(out))
        assert code == 2 and "different models: base model-a, head model-b" in _one_line(err)
        code, _, err = gate(
            repo,
            monkeypatch,
            "--base-url",
            a.base_url,
            "--head-url",
            b.base_url,
            "--model",
            "model-a",
            "--output",
            str(out),
        )
        assert code == 2 and f"--head-url {b.base_url} does not serve --model model-a" in _one_line(err)
        dead = f"http://127.0.0.1:{_closed_port()}"
        code, _, err = gate(repo, monkeypatch, "--base-url", a.base_url, "--head-url", dead, "--output", str(out))
        assert code == 2 and f"--head-url {dead}: no server answers" in _one_line(err)
        assert not a.bodies and not b.bodies  # nothing was measured
    assert not out.exists()


def test_dry_run_shows_the_arms_the_order_and_the_commands(repo, monkeypatch, tmp_path):
    code, out, err = gate(repo, monkeypatch, "--base", "HEAD", "--repeats", "5", "--dry-run", "--warmup", "2", *SIM)
    assert code == 0, err
    assert "order (5 runs per arm, one at a time): B H H B B H H B B H" in out
    base = next(line for line in out.splitlines() if line.startswith("base:"))
    assert "perf --device sim:h200 --num-prompts 4 --warmup 2 --batching continuous --peers none" in base
    assert "--repeats 1" in base and "--quiet" in base
    assert len(git(repo, "worktree", "list").splitlines()) == 1  # a dry run checks nothing out


def test_a_head_that_crashes_fails_the_gate_and_a_base_that_crashes_is_bad_input(tmp_path, monkeypatch):
    """A run that exits non-zero stops the gate: the head's change broke the benchmark (exit 1, a failed gate), or
    the base cannot be measured (exit 2); the line names the arm, the run's own error and where its stderr is kept
    (with the traceback under CBBENCH_DEBUG=1); the runs that finished before it are kept in the output."""
    from cbbench.perf.results.rows import read_rows

    repo = copy_of_this_checkout(tmp_path / "repo")
    good = git(repo, "rev-parse", "HEAD")
    sim = repo / "refengine" / "sim" / "sim_device.py"
    sim.write_text(
        sim.read_text()
        + '\n\ndef planted_slowdown() -> float:  # noqa: F811\n    raise RuntimeError("planted crash")\n'
    )
    git(repo, "commit", "-qam", "a simulated engine that cannot start")
    bad = git(repo, "rev-parse", "HEAD")
    out = tmp_path / "g.csv"
    monkeypatch.setenv("CBBENCH_DEBUG", "1")
    code, stdout, err = gate(
        repo, monkeypatch, "--base", good, "--head", bad, "--repeats", "5", "--output", str(out), *SIM
    )
    line = _one_line(err)
    assert code == 1 and line.startswith("cbbench gate: error: head run 1") and "planted crash" in line
    assert "ERROR: the head arm failed" in stdout  # the verdict names the arm, no ratio
    kept = tmp_path / "g.head-run1.err"
    assert str(kept) in line and "Traceback" in kept.read_text() and "planted crash" in kept.read_text()
    assert [r["arm"] for r in read_rows(out)] == ["base"]  # the base run that finished first is kept
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    out2 = tmp_path / "g2.csv"
    code, _, err = gate(repo, monkeypatch, "--base", bad, "--head", good, "--repeats", "5", "--output", str(out2), *SIM)
    assert code == 2 and _one_line(err).startswith("cbbench gate: error: base run 1")
    assert (tmp_path / "g2.base-run1.err").is_file()
    _nothing_left(repo, out2)  # no run finished: the reserved output is released
