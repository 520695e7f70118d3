"""A gate judges only sound runs, and loses none: a run with failed requests, a usage that lies or a clock that stops
or runs backwards is an error of its arm (head: exit 1, base: exit 2), named in the verdict, never a ratio; a bad
usage from a server fails that request, not the run; every output is reserved before the first run and every
finished run is on disk; counts and run times are bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from benchmarks.fake_openai_server import FakeOpenAIServer
from cbbench.perf.backends.http_client import HttpTarget, make_session, stream_request, usage_counts
from cbbench.perf.cli import app
from cbbench.perf.gate import soundness
from cbbench.perf.gate.arms import MAX_REPEATS, Run
from cbbench.perf.gate.output import Outputs
from cbbench.perf.gate.run import FIRST_RUN_LIMIT_S, MIN_RUN_LIMIT_S, RUN_LIMIT_FACTOR, GateOptions, run_limit
from cbbench.perf.results.rows import read_rows
from refengine.tests.waiting import HangGuard, wait_for

# A servers gate small enough for the default run: each run is one client process of 4 short requests.
SERVERS = ["--workload", "fixed", "--workload-param", "input_len=8,output_len=8", "--num-prompts", "4",
           "--warmup", "0", "--repeats", "5", "--quiet"]  # fmt: skip


# --- the checks themselves -----------------------------------------------------------------------------------------

GOOD = {"request_id": "r0", "prompt_len": 8, "output_len": 4, "requested_output_len": 4, "arrival_time": 1.0,
        "first_token_time": 1.1, "finish_time": 1.4, "chunk_times": [1.1, 1.2, 1.3, 1.4],
        "output_len_source": "usage", "finish_reason": "length"}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"first_token_time": 0.9}, "before its arrival"),
        ({"finish_time": 1.05}, "finished before its first token"),
        ({"first_token_time": 1.0, "finish_time": 1.0, "chunk_times": [1.0] * 4}, "clock that stopped"),
        ({"chunk_times": [1.1, 1.3, 1.2, 1.4]}, "chunk_times run backwards"),
        ({"output_len": 4000}, "4000 output tokens for max_tokens 4"),
        ({"output_len": 2}, "fewer than the 4 content chunks"),
        ({"output_len": -8}, "output_len is -8"),
        ({"output_len": "many"}, "output_len is 'many'"),
        ({"arrival_time": math.inf}, "not a finite number"),
    ],
)
def test_an_impossible_request_record_is_named(change: dict[str, Any], says: str) -> None:
    assert soundness.record_problem(GOOD) is None
    why = soundness.record_problem({**GOOD, **change})
    assert why is not None and says in why
    assert soundness.records_problems([{**GOOD, **change, "finish_reason": "error"}]) == []


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"failed": 3, "completed": 5}, "failed 3 of 8 requests"),
        ({"output_throughput": -12.5}, "output_throughput is -12.5"),
        ({"output_throughput": math.inf}, "output_throughput is inf"),
        ({"mean_ttft_ms": "fast"}, "mean_ttft_ms is 'fast'"),
        ({"duration": 0.0}, "duration is 0 s"),
        ({"duration": 1.8e-30, "output_throughput": 6.5e32}, "beyond any machine"),
    ],
)
def test_an_impossible_row_is_named(row: dict[str, Any], says: str) -> None:
    good = {"failed": 0, "completed": 8, "duration": 2.0, "total_output_tokens": 32, "output_throughput": 16.0,
            "mean_ttft_ms": math.nan}  # fmt: skip
    assert soundness.row_problems(good) == []
    assert any(says in p for p in soundness.row_problems({**good, **row})), soundness.row_problems({**good, **row})


@pytest.mark.parametrize("lie", [-8, "many", 1.5, True, None, 4000, 1])
def test_a_usage_that_lies_is_refused_naming_its_field(lie: Any) -> None:
    if lie is None:
        assert usage_counts({"completion_tokens": None}, 3, 8)["completion_tokens"] is None  # absent: the fallback
        return
    with pytest.raises(ValueError, match="usage.completion_tokens"):
        usage_counts({"completion_tokens": lie}, 3, 8)


@pytest.mark.parametrize("lie", [lambda n: -8, lambda n: "many", lambda n: n * 1000, lambda n: {"n": n}])
def test_a_bad_usage_fails_that_request_not_the_run(lie: Any) -> None:
    """Against a server whose usage lies: every request is a failed record naming the field, none raises."""

    async def go(url: str) -> list[Any]:
        target = HttpTarget("openai", url, "fake-model")
        async with make_session(None, 30) as session:
            return [await stream_request(session, target, f"r{i}", [1, 2, 3], 3, 6) for i in range(2)]

    with FakeOpenAIServer(usage_lie=lie) as s:
        recs = asyncio.run(go(s.base_url))
    assert [r.finish_reason for r in recs] == ["error", "error"]
    assert all("usage.completion_tokens" in str(r.error) for r in recs)
    with FakeOpenAIServer() as s:  # the same client against an honest server: no error
        assert {r.finish_reason for r in asyncio.run(go(s.base_url))} == {"length"}


# --- bounds ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("repeats", [0, MAX_REPEATS + 1, 10**9])
def test_repeats_beyond_the_bound_are_refused_before_anything_is_built(repeats: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="repeats must be in"):
        GateOptions(base="HEAD", repeats=repeats, cwd=tmp_path)
    res = CliRunner().invoke(app, ["gate", "--base", "HEAD", "--repeats", str(repeats), "--dry-run"])
    assert res.exit_code == 2 and "repeats must be in" in res.stderr


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "1e12"])
def test_a_run_timeout_out_of_range_is_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run-timeout"):
        GateOptions(base="HEAD", run_timeout=float(bad), cwd=tmp_path)


def test_the_default_run_limit_follows_the_runs_size() -> None:
    def run(wall: float) -> Run:
        return Run("base", 0, Path("x.csv"), [], wall, 0.0)

    assert run_limit([], None) == FIRST_RUN_LIMIT_S
    assert run_limit([run(1.0)], None) == MIN_RUN_LIMIT_S
    assert run_limit([run(100.0), run(60.0)], None) == RUN_LIMIT_FACTOR * 100.0
    assert run_limit([run(100.0)], 7.0) == 7.0


def test_a_newline_in_a_revision_is_refused_whole(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="line break"):
        GateOptions(base="main\nFAKE: all good", cwd=tmp_path)


# --- outputs ---------------------------------------------------------------------------------------------------------


def test_outputs_are_reserved_exclusively_and_default_names_never_collide(tmp_path: Path) -> None:
    """Many gates reserving a default name in the same second on one clone (threads here; one process id, so the
    exclusive create alone keeps them apart): every one gets its own pair, and releasing one touches no other's."""
    got: list[Outputs] = []
    barrier = threading.Barrier(8)

    def take() -> None:
        barrier.wait()  # all at once
        got.append(Outputs.reserve(None, None, tmp_path / "results"))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({o.csv for o in got}) == len(got) == 8
    assert all(o.csv.is_file() and o.csv.with_suffix(".records").is_dir() for o in got)
    got[0].release()
    assert not got[0].csv.exists() and all(o.csv.exists() for o in got[1:])


def test_an_output_that_appears_between_the_look_and_the_create_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another gate's (or tool's) file that appears after the gate looked: the exclusive create refuses it and leaves
    it as it was."""
    import cbbench.perf.gate.output as output

    monkeypatch.setattr(output, "check_target", lambda p: None)  # (the look found nothing)
    theirs = tmp_path / "g.json"
    theirs.write_text("theirs")
    with pytest.raises(ValueError, match="exists"):
        Outputs.reserve(tmp_path / "g.csv", None, tmp_path)
    assert theirs.read_text() == "theirs" and not (tmp_path / "g.csv").exists()


def test_an_output_that_exists_or_cannot_be_made_is_refused_before_any_run(tmp_path: Path) -> None:
    taken = tmp_path / "g.csv"
    taken.with_suffix(".json").write_text("{}")  # another tool's file where the JSON would go
    with pytest.raises(ValueError, match="exists"):
        Outputs.reserve(taken, None, tmp_path)
    assert not taken.exists() and taken.with_suffix(".json").read_text() == "{}"  # nothing made, nothing touched
    with pytest.raises(ValueError, match="cannot create"):
        Outputs.reserve(Path("/proc/cbbench-gate/g.csv"), None, tmp_path)
    (tmp_path / "summary.md").mkdir()
    with pytest.raises(ValueError, match="summary: cannot append"):
        Outputs.reserve(tmp_path / "h.csv", tmp_path / "summary.md", tmp_path)
    assert not (tmp_path / "h.csv").exists()  # the pair reserved before the summary was refused is released


# --- end to end, against fake servers: arm errors, never a ratio ------------------------------------------------------


def _gate(base: FakeOpenAIServer, head: FakeOpenAIServer, out: Path, *extra: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(
        app, ["gate", "--base-url", base.base_url, "--head-url", head.base_url, "--output", str(out), *SERVERS, *extra]
    )
    return res.exit_code, res.stdout, res.stderr


def test_a_head_server_that_fails_requests_fails_the_gate_as_an_arm_error(tmp_path: Path) -> None:
    out = tmp_path / "g.csv"
    with FakeOpenAIServer() as base, FakeOpenAIServer(fail_every=2) as head:
        code, stdout, err = _gate(base, head, out, "--format", "json")
    assert code == 1, err
    doc = json.loads(stdout)
    assert doc["error"]["arm"] == "head" and doc["rows"] == []  # named, and no ratio
    assert "not sound" in doc["error"]["message"] and "failed 2 of 4 requests" in doc["error"]["message"]
    assert err.strip().count("\n") == 0 and str(out) in err  # one line, naming the runs kept
    assert [r["arm"] for r in read_rows(out)] == ["base"]  # the base run that finished is on disk
    runs = json.loads(out.with_suffix(".json").read_text())["config"]["gate"]["runs"]
    assert [(r["arm"], r["failed"], r["sound"]) for r in runs] == [("base", 0, True)]


def test_a_base_server_whose_usage_lies_is_a_base_error(tmp_path: Path) -> None:
    out = tmp_path / "g.csv"
    with FakeOpenAIServer(usage_lie=lambda n: n * 1000) as base, FakeOpenAIServer() as head:
        code, stdout, err = _gate(base, head, out)
    assert code == 2, err
    assert "ERROR: the base arm failed" in stdout and "usage" in stdout
    assert not out.exists() and not out.with_suffix(".records").exists()  # no run finished: nothing reserved stays


def test_the_exit_code_table_of_docs_gate_md_is_the_codes_the_gate_gives() -> None:
    """Every row of docs/gate.md's exit-code table names a code this module's gates end with, and the reverse."""
    from cbbench.perf.gate.run import EXIT_INCONCLUSIVE
    from cbbench.perf.gate.signals import HANDLED, Interrupted

    doc = (Path(__file__).resolve().parents[3] / "docs" / "gate.md").read_text()
    table = doc.split("| exit |", 1)[1].split("\n\n", 1)[0]
    codes = {int(line.split("|")[1].strip().strip("`")) for line in table.splitlines()[2:] if line.startswith("|")}
    given = {0, 1, 2, EXIT_INCONCLUSIVE} | {Interrupted(s).exit_code for s in HANDLED}
    assert codes == given


def _pids_under(folder: Path) -> list[int]:
    """The processes whose command line names `folder`, once those just killed have had time to go: a killed process
    leaves /proc when the kernel has torn it down, not at once, and later on a loaded machine; one still there after
    the hang guard was never killed."""
    with contextlib.suppress(HangGuard):
        wait_for(lambda: not _pids_naming(folder), "the killed processes leaving")
    return _pids_naming(folder)


def _pids_naming(folder: Path) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if str(folder) in (p / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                continue
    return out


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_exit_codes_of_a_signalled_gate_are_128_plus_the_signal(tmp_path: Path) -> None:
    """The table's signal rows, seen: SIGHUP during a run ends the gate with 129, the run's process (and its
    children) gone, its scratch folder gone; the docs' table is checked against these by the test above."""
    import signal
    import subprocess
    import sys

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with FakeOpenAIServer(token_delay_s=0.05) as base, FakeOpenAIServer(token_delay_s=0.05) as head:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cbbench.perf.cli", "gate", "--base-url", base.base_url, "--head-url",
             head.base_url, "--output", str(tmp_path / "g.csv"), *SERVERS],
            env={**os.environ, "TMPDIR": str(scratch)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        wait_for(lambda: list(scratch.glob("cbbench-gate-*/runs/*.err")) or proc.poll() is not None, "a run's start")
        assert list(scratch.glob("cbbench-gate-*/runs/*.err")), "no run started"
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert b"interrupted (SIGHUP)" in err
    assert list(scratch.iterdir()) == []  # the scratch folder (and the run's files in it) removed
    assert _pids_under(scratch) == []  # no run left behind
    assert not (tmp_path / "g.csv").exists()  # no run finished: the reserved output released


def test_a_sweep_with_too_few_repeats_is_refused_before_the_first_measured_run(tmp_path: Path) -> None:
    """Three request rates x 7 metrics = 21 tests need 6 runs per arm: 5 is refused from the arms' dry runs, before
    any request reaches a server."""
    out = tmp_path / "g.csv"
    with FakeOpenAIServer() as base, FakeOpenAIServer() as head:
        code, _, err = _gate(base, head, out, "--request-rate", "50,100,inf")
        assert base.requests == head.requests == 0
    assert code == 2 and "21 test(s)" in err and "--repeats 6" in err, err
    assert not out.exists()


@pytest.mark.slow  # a base run, then a head run held until its time limit: about half a minute
def test_a_run_past_its_time_limit_is_a_failed_run_of_its_arm(tmp_path: Path) -> None:
    out = tmp_path / "g.csv"
    with FakeOpenAIServer() as base, FakeOpenAIServer(token_delay_s=10) as head:
        code, stdout, err = _gate(base, head, out, "--run-timeout", "20")
    assert code == 1 and "head run 1" in err and "time limit of 20 s" in err, err
    assert "ERROR: the head arm failed" in stdout


@pytest.mark.slow  # two gates of ten client runs each, at once: about a minute on a shared CPU
def test_two_gates_at_once_in_one_clone_keep_their_own_outputs(tmp_path: Path) -> None:
    """Started in the same second in the same folder with the default output: two pairs, each whole, each gate's
    own; the gate whose head fails keeps its base run and removes nothing of the other's."""
    import subprocess
    import sys

    with FakeOpenAIServer() as base, FakeOpenAIServer() as head, FakeOpenAIServer(fail_every=3) as broken:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cbbench.perf.cli",
                    "gate",
                    "--base-url",
                    base.base_url,
                    "--head-url",
                    h.base_url,
                    *SERVERS,
                ],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for h in (head, broken)
        ]
        codes = [p.wait(timeout=600) for p in procs]
    assert codes == [0, 1], [p.stderr.read() for p in procs if p.stderr]
    pairs = sorted((tmp_path / "results").glob("gate-*.csv"))
    assert len(pairs) == 2
    arms = sorted(len(read_rows(p)) for p in pairs)
    assert arms == [1, 10]  # the failed gate's one base run; the other's every run


@pytest.mark.slow  # a tree gate to its first head run per clock: about two minutes on a shared CPU
@pytest.mark.parametrize(
    ("clock", "says"),
    [
        ("return self._now - (0.1 if self._now > 0.5 else 0.0)", "backwards"),  # one jump back, the run still > 0 s
        ("return -self._now", "duration must be > 0"),  # every later time earlier: perf itself refuses the run
        ("return self._now * 1e-30", "a clock that stopped"),  # all but stopped: 6.5e32 tok/s
    ],
)
def test_a_head_whose_simulated_clock_is_broken_is_a_head_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: str, says: str
) -> None:
    from gate_repos import commit_change, copy_of_this_checkout, git

    repo = copy_of_this_checkout(tmp_path / "repo")
    good = git(repo, "rev-parse", "HEAD")
    bad = commit_change(repo, "refengine/clock.py", "    def now(self) -> float:\n        return self._now",
                        f"    def now(self) -> float:\n        {clock}", "a broken clock")  # fmt: skip
    git(repo, "checkout", "-q", "--detach", good)
    monkeypatch.chdir(repo)
    out = tmp_path / "g.csv"
    res = CliRunner().invoke(
        app, ["gate", "--base", good, "--head", bad, "--output", str(out), "--device", "sim:h200",
              "--num-prompts", "4", "--repeats", "5", "--quiet"],
    )  # fmt: skip
    assert res.exit_code == 1 and "head run 1" in res.stderr and says in res.stderr, res.output
    assert "ERROR: the head arm failed" in res.stdout


def test_a_revision_missing_from_a_shallow_clone_says_to_fetch_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gate_repos import git

    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q")
    for i in range(2):
        (origin / "f.txt").write_text(str(i))
        git(origin, "add", "f.txt")
        git(origin, "commit", "-qm", f"commit {i}")
    first = git(origin, "rev-list", "--max-parents=0", "HEAD")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{origin}", str(shallow))
    monkeypatch.chdir(shallow)
    res = CliRunner().invoke(app, ["gate", "--base", first, "--dry-run"])
    assert res.exit_code == 2 and "shallow clone" in res.stderr and "--unshallow" in res.stderr, res.output
    monkeypatch.chdir(origin)  # the same revision in the full history: no hint (and it resolves)
    res = CliRunner().invoke(app, ["gate", "--base", "no-such-rev", "--dry-run"])
    assert res.exit_code == 2 and "shallow" not in res.stderr
