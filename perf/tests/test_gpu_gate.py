"""ci/gpu_gate.sh's logic on a CPU machine: it reruns the baseline with `cbbench perf --like` and compares with the
baseline's sidecar tolerances (no `--tolerance` flags), a missing baseline is one line and exit 2 before anything
runs, and, with the device named by GPU_SLUG and a CPU baseline in BASELINE_DIR, a real run passes on a rerun of
the baseline and fails (exit 1, a FAIL summary) once the baseline claims better than the rerun can do."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cbbench.perf.results.compare import DIRECTIONS
from cbbench.perf.results.gate import read_tolerance_file

REPO = Path(__file__).resolve().parents[2]
GATE = "ci/gpu_gate.sh"
H200_TOLERANCES = REPO / "results/baselines/h200.tolerances.toml"
# The real run below is one configuration of results/baselines/cpu.csv made smaller (2 prompts, 4 output tokens),
# once. A shared CPU's speed varies by 2x, so it is gated on what the scheduler does alone: those figures are
# exact for a fixed workload (the stale 8-prompt numbers of the row can only be matched or beaten by 2 prompts).
SMALL = {"num_prompts": 2, "output_len": 4}
EXACT = '[tolerances]\n"*_throughput" = "off"\n"*_ms" = "off"\nnum_preemptions = "1%"\npeak_kv_blocks = "1%"\n'
TOO_FEW_BLOCKS = 1  # 2 prompts of 64 + 4 tokens hold 10 blocks of 16: a baseline claiming 1 is beaten by nothing


def gate(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run(["bash", GATE, *args], cwd=REPO, capture_output=True, text=True, env=full, timeout=timeout)


def test_the_gate_takes_its_tolerances_from_the_baseline_sidecar() -> None:
    text = (REPO / GATE).read_text()
    assert "--tolerance" not in text and "--like" in text


def test_dry_run_reruns_the_baseline_like_and_compares(tmp_path: Path) -> None:
    (tmp_path / "h200.csv").write_text("stub\n")  # a dry run only looks for it
    (tmp_path / "h200.tolerances.toml").write_text("[tolerances]\n")
    res = gate("--dry-run", env={"BASELINE_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    base = tmp_path / "h200.csv"
    assert f"perf --like {base} --repeats 3 --output results/gpu-ci/h200.csv --quiet" in res.stdout
    assert f"compare {base} results/gpu-ci/h200.csv" in res.stdout
    assert f"tolerances: {tmp_path / 'h200.tolerances.toml'}" in res.stdout


def test_missing_baseline_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = gate(env={"BASELINE_DIR": str(tmp_path), "GPU_SLUG": "h200", "PYTHON": "/nonexistent/python3"})
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line and f"no baseline {tmp_path / 'h200.csv'}" in line and "UPDATE_BASELINE=1" in line
    assert res.stdout == ""  # it stopped before setup, tests or perf
    dry = gate("--dry-run", env={"BASELINE_DIR": str(tmp_path)})
    assert dry.returncode == 0 and "no baseline" in dry.stdout  # a dry run says so and shows the plan


def test_h200_tolerances_parse_and_each_has_its_reason() -> None:
    tolerances = read_tolerance_file(H200_TOLERANCES)
    assert tolerances, "an empty sidecar would gate at compare's defaults only"
    for pattern in tolerances:
        assert any(fnmatch.fnmatchcase(m, pattern) for m in DIRECTIONS), f"{pattern} matches no metric"
    lines = H200_TOLERANCES.read_text().splitlines()
    explained = False  # a comment explains the block of tolerances right under it (up to a blank line)
    for line in lines[lines.index("[tolerances]") + 1 :]:
        if not line.strip():
            explained = False
        elif line.startswith("#"):
            explained = True
        else:
            assert explained or "#" in line, f"no reason given for: {line}"


@pytest.mark.slow  # the whole CPU gate script, about a minute: nightly; test_sim_gate.py gates a planted bug every run
def test_gate_on_the_cpu_passes_then_catches_a_regression(tmp_path: Path) -> None:
    df = pd.read_csv(REPO / "results/baselines/cpu.csv")
    one = df[(df["batching"] == "continuous") & (df["repeat"] == 0)].copy()
    assert len(one) == 1
    params = {**json.loads(one["workload_params"].iloc[0]), **SMALL}
    one["workload_params"], one["num_prompts"] = json.dumps(params), SMALL["num_prompts"]
    baseline = tmp_path / "cpu-test.csv"
    one.to_csv(baseline, index=False)
    (tmp_path / "cpu-test.tolerances.toml").write_text(EXACT)
    env = {
        "BASELINE_DIR": str(tmp_path),
        "GPU_SLUG": "cpu-test",
        "SKIP_SETUP": "1",
        "SKIP_TESTS": "1",
        "REPEATS": "1",
        "OUT": str(tmp_path / "out"),
    }
    res = gate(env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "no regression beyond tolerance (1 configuration(s) in common)" in res.stdout
    new = pd.read_csv(tmp_path / "out" / "cpu-test.csv")
    assert list(new["batching"]) == ["continuous"] and list(new["completed"]) == [SMALL["num_prompts"]]
    assert new["peak_kv_blocks"].iloc[0] > TOO_FEW_BLOCKS

    one["peak_kv_blocks"] = TOO_FEW_BLOCKS
    one.to_csv(baseline, index=False)
    res = gate(env={**env, "SUMMARY": str(tmp_path / "summary.md")}, timeout=300)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "FAIL" in summary and r"peak\_kv\_blocks" in summary  # (markdown escapes the underscores)
