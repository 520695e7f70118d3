"""`cbbench gate` end to end on the CPU, the device whose numbers are noisy: real engine runs of two trees, in fresh
processes, in ABBA order. An A/A gate (the same commit on both sides) does not fail (it passes, or is inconclusive:
5 runs of a shared CPU rarely rule out a 25 % change); a scratch commit that makes every
engine step busy-wait three times its own duration (gate_power's planted slowdown, 4x per step) fails on
output throughput. (The false-alarm rate and the power at a 5 % slowdown, at the default repeats, are measured by
`python -m benchmarks.gate_power campaign`, docs/gate.md: too long for a test.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gate_repos import copy_of_this_checkout, git
from tiny_run import TINY_RUN
from typer.testing import CliRunner

from benchmarks.gate_power import plant_step_delay
from cbbench.perf.cli import app

# A small run with enough decode steps (4 requests x 24 tokens on 2 slots) that the steps, not the process start,
# dominate its measured time.
CPU_RUN = [*TINY_RUN, "--device", "cpu", "--workload-param", "input_len=16,output_len=24", "--num-prompts", "4"]
# per arm: significant at alpha 0.05 with up to 3 of the 25 base-head pairs the wrong way round (P(U <= 3) = 7 / 252).
# 4 per arm allowed one, and a clean clone's CI at nice 19 beside two CPU-bound jobs missed a 2x step time with 2.
REPEATS = "5"
# One gated metric, so the test is not a 5 % coin toss on a shared CPU: an A/A gate fails only if the head's output
# throughput looks more than MIN_EFFECT worse AND significantly so, which the machine's noise (2x swings between
# runs seen at load 10, but alike for both arms in ABBA order) does not do; the planted 4x step time cuts output
# throughput far beyond it.
MIN_EFFECT = ["--min-effect", "off", "--min-effect", "output_throughput=25%"]
PLANTED_DELAY = 3.0  # each step busy-waits three times its own duration: 4x the step time
SLOWEST_PLANTED_RATIO = 0.8  # head / base output throughput at 4x step time (2x gave 0.37 to 0.6 here)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_this_checkout(tmp_path_factory.mktemp("gate-cpu") / "repo")


def gate(repo: Path, monkeypatch: pytest.MonkeyPatch, out: Path, *args: str) -> tuple[int, dict]:
    monkeypatch.chdir(repo)
    argv = ["gate", "--base", "HEAD", *args, "--repeats", REPEATS, "--output", str(out), "--format", "json"]
    argv += ["--on-inconclusive", "pass"]  # (5 runs of a shared CPU rarely rule out 25 %: said, not failed)
    res = CliRunner().invoke(app, [*argv, *MIN_EFFECT, *CPU_RUN])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def _throughput(doc: dict) -> dict:
    (row,) = [r for r in doc["rows"] if r["metric"] == "output_throughput"]
    return row


def test_an_a_a_gate_on_the_cpu_passes(repo, monkeypatch, tmp_path):
    code, doc = gate(repo, monkeypatch, tmp_path / "aa.csv")
    row = _throughput(doc)
    assert code == 0 and not doc["regressed"], json.dumps(row)
    assert row["status"] != "regressed" and row["low"] <= row["ratio"] <= row["high"]
    assert [r["metric"] for r in doc["rows"]] == ["output_throughput"]  # the one metric asked for, no other


def test_a_planted_step_slowdown_on_the_cpu_fails(repo, monkeypatch, tmp_path):
    tag = plant_step_delay(repo, PLANTED_DELAY)
    code, doc = gate(repo, monkeypatch, tmp_path / "planted.csv", "--head", tag)
    row = _throughput(doc)
    assert code == 1 and doc["regressed"], json.dumps(row)
    assert row["status"] == "regressed" and row["ratio"] < SLOWEST_PLANTED_RATIO, json.dumps(row)
    assert row["high"] < 1.0  # the whole interval on the slow side
    assert git(repo, "rev-parse", "HEAD") != git(repo, "rev-parse", tag)  # the base stayed the unchanged commit
