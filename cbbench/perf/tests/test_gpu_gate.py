"""ci/gpu_gate.sh on a CPU machine: its verdict is `cbbench gate` of this tree against GATE_BASE (no stored baseline:
a missing one skips only the trend check, with a notice); the trend check splits the stored baseline into its `perf
--like` groups, reruns them in one process and compares the merged rows with the baseline's sidecar tolerances (no
`--tolerance` flags). With the device named by GPU_SLUG and a baseline in BASELINE_DIR, the whole flow runs for
real: on the simulated H200 the gate passes an unchanged tree and fails a scratch commit that slows every simulated
step; the trend check, on a baseline of ci/gpu_env.sh's runs made on the simulated H200, passes on an unchanged tree
and fails on a 20% step slowdown planted through the simulator (CBBENCH_SIM_PLANTED_SLOWDOWN), and on a CPU
baseline it fails once the baseline claims better than a rerun can do."""

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

REPO = Path(__file__).resolve().parents[3]
GATE = "ci/gpu_gate.sh"
H200_TOLERANCES = REPO / "results/baselines/h200.tolerances.toml"
SIM_BASELINE = REPO / "results/baselines/sim-h200.csv"
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


def test_dry_run_reruns_every_part_of_the_baseline_like_and_compares(tmp_path: Path) -> None:
    base = tmp_path / "h200.csv"
    two = pd.concat([pd.read_csv(SIM_BASELINE), pd.read_csv(SIM_BASELINE).assign(model="qwen2.5-0.5b")])
    two.to_csv(base, index=False)  # two (workload, model) groups: two parts
    (tmp_path / "h200.tolerances.toml").write_text("[tolerances]\n")
    res = gate("--dry-run", env={"BASELINE_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    perf = next(line for line in res.stdout.splitlines() if "gpu_runs perf" in line).split()
    assert perf[perf.index("perf") + 1] == "results/gpu-ci/runs"
    assert [perf[i + 1] for i, a in enumerate(perf) if a == "--repeats"] == ["3", "3"]
    assert [a for a in perf if a.startswith("@")] == ["@part0", "@part1"] and perf.count("--like") == 2
    assert "gpu_runs merge results/gpu-ci/h200.csv results/gpu-ci/runs/part0.csv results/gpu-ci/runs/part1.csv" in (
        res.stdout
    )
    assert f"compare {base} results/gpu-ci/h200.csv" in res.stdout
    assert f"tolerances: {tmp_path / 'h200.tolerances.toml'}" in res.stdout
    assert not (REPO / "results/gpu-ci").exists() or not any((REPO / "results/gpu-ci").iterdir())
    lines = res.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if " gate --base " in line)  # the verdict first, the trend after
    assert at < next(i for i, line in enumerate(lines) if "gpu_runs perf" in line)
    argv = lines[at].split()
    assert argv[argv.index("--device") + 1] == "cuda" and argv[argv.index("--repeats") + 1] == "10"
    assert argv[argv.index("--output") + 1] == "results/gpu-ci/gate.csv"
    # an inconclusive GPU gate adds runs, then fails the job (docs/gate.md)
    assert argv[argv.index("--max-repeats") + 1] == "16" and argv[argv.index("--on-inconclusive") + 1] == "fail"


def test_a_missing_baseline_skips_the_trend_check_not_the_gate(tmp_path: Path) -> None:
    res = gate("--dry-run", env={"BASELINE_DIR": str(tmp_path), "GATE_BASE": "abc123"})
    assert res.returncode == 0, res.stderr
    assert " gate --base abc123 " in res.stdout  # the gate needs no stored baseline
    assert f"trend check skipped: no baseline {tmp_path / 'h200.csv'}" in res.stdout and "gpu_runs" not in res.stdout


def test_the_workflows_gate_base_against_head_with_the_history_they_need() -> None:
    for name, script in (("cpu.yml", "ci/cpu_gate.sh"), ("gpu.yml", "ci/gpu_gate.sh")):
        text = (REPO / ".github" / "workflows" / name).read_text()
        assert "fetch-depth: 0" in text and "git merge-base HEAD" in text and "GATE_BASE:" in text
        assert f"run: bash {script}" in text
    gpu = (REPO / ".github" / "workflows" / "gpu.yml").read_text()
    assert "present" not in gpu  # no step waits for a stored baseline any more
    assert "head.repo.full_name == github.repository" in gpu  # a fork's pull request never runs on the card


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


@pytest.mark.slow  # the whole CPU trend check, about a minute: nightly; test_sim_gate.py gates a planted bug every run
def test_trend_check_on_the_cpu_passes_then_catches_a_regression(tmp_path: Path) -> None:
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
        "SKIP_GATE": "1",  # the trend check alone (the gate's own test is below)
        "TREND_FAILS": "1",
        "TREND_REPEATS": "1",
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


# ci/gpu_env.sh's runs made small for the simulated H200: every group (both models, both workloads, hf-static), a
# few prompts each on 8 slots, so that continuous and static differ and the run takes seconds
SIM_RUN = {"cuda": "sim:h200"}
SIM_SMALL = {"--num-prompts": "12", "--max-num-seqs": "8", "--warmup": "1"}
PLANTED = "1.2"  # the planted regression: every step 20% slower


def sim_gpu_runs() -> list[str]:
    """GPU_QWEN_RUNS and GPU_LLAMA_RUNS of ci/gpu_env.sh, on sim:h200, small."""
    script = 'source ci/gpu_env.sh; printf "%s\\n" "${GPU_QWEN_RUNS[@]}" "${GPU_LLAMA_RUNS[@]}"'
    res = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    args = res.stdout.splitlines()
    out = []
    for i, a in enumerate(args):
        prev = args[i - 1] if i else ""
        out.append(SIM_SMALL.get(prev, SIM_RUN.get(a, a)))
    assert out.count("sim:h200") == out.count("@qwen0.5b-sharegpt") + 4 and "--executor" not in out
    return out


@pytest.mark.slow  # three gate runs of five groups on the simulated H200: a minute or two on a shared CPU
def test_trend_check_on_the_simulated_h200_passes_unchanged_and_fails_a_planted_slowdown(tmp_path: Path) -> None:
    """The trend check of ci/gpu_gate.sh (split, rerun every part in one process, merge, compare with the H200's own
    tolerances) on a baseline of the GPU check's runs, recorded on the simulated H200 the way gpu_check.sh records
    one: an unchanged tree passes; a 20% slower step, planted through the simulator, fails on throughput."""
    runs = tmp_path / "runs"
    made = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_runs", "perf", str(runs), *sim_gpu_runs()],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    parts = sorted(runs.glob("*.csv"))
    assert len(parts) == 5
    from benchmarks.gpu_runs import merge

    baseline = tmp_path / "h200.csv"
    assert merge(baseline, parts)[1] == []
    (tmp_path / "h200.tolerances.toml").write_text(H200_TOLERANCES.read_text())
    env = {
        "BASELINE_DIR": str(tmp_path),
        "GPU_SLUG": "h200",
        "SKIP_SETUP": "1",
        "SKIP_TESTS": "1",
        "SKIP_GATE": "1",
        "TREND_FAILS": "1",
        "TREND_REPEATS": "1",
        "OUT": str(tmp_path / "out"),
    }
    res = gate(env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "no regression beyond tolerance" in res.stdout
    new = pd.read_csv(tmp_path / "out" / "h200.csv")
    assert len(new) == len(pd.read_csv(baseline)) and set(new["device"]) == {"sim:h200"}

    summary = tmp_path / "summary.md"
    res = gate(env={**env, "SUMMARY": str(summary), "CBBENCH_SIM_PLANTED_SLOWDOWN": PLANTED}, timeout=600)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    text = summary.read_text()
    assert "FAIL" in text and r"output\_throughput" in text


def test_planted_slowdown_scales_every_simulated_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook the gate test plants its regression through: every simulated step takes the factor times as long,
    so a run's simulated time scales by it; unset it is 1; anything but a number > 0 is refused by name."""
    from refengine import LLMEngine, SamplingParams
    from refengine.sim.sim_device import PLANTED_SLOWDOWN_ENV

    def sim_seconds() -> float:
        with LLMEngine("llama-3.1-8b", device="sim:h200", max_num_seqs=4) as engine:
            for i in range(6):
                engine.add_request(str(i), list(range(100, 140 + 9 * i)), SamplingParams(max_tokens=8 + i))
            while engine.has_unfinished_requests():
                engine.step()
            return engine.model_runner.busy_seconds

    monkeypatch.delenv(PLANTED_SLOWDOWN_ENV, raising=False)
    base = sim_seconds()
    monkeypatch.setenv(PLANTED_SLOWDOWN_ENV, PLANTED)
    slow = sim_seconds()
    assert base > 0 and slow == pytest.approx(float(PLANTED) * base, rel=1e-9)
    for bad in ("0", "-1", "fast", "inf"):
        monkeypatch.setenv(PLANTED_SLOWDOWN_ENV, bad)
        with pytest.raises(ValueError, match=PLANTED_SLOWDOWN_ENV):
            LLMEngine("llama-3.1-8b", device="sim:h200", max_num_seqs=4)


@pytest.mark.slow  # two gates of 5 + 5 simulated runs through the script: a minute or two on a shared CPU
def test_the_scripts_gate_passes_an_unchanged_tree_and_fails_a_slower_commit(tmp_path: Path) -> None:
    """ci/gpu_gate.sh's verdict, `cbbench gate`, on the simulated H200 in a copy of this checkout: GATE_BASE=HEAD
    against the unchanged work tree passes; a commit that makes every simulated step 2 % slower, gated against its
    parent, fails, and the step summary says so (no stored baseline anywhere: the trend check is skipped)."""
    from gate_repos import copy_of_this_checkout, git

    from benchmarks.gate_power import PLANTED_SIM, SIM_FILE

    repo = copy_of_this_checkout(tmp_path / "repo")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "SKIP_SETUP": "1",
        "SKIP_TESTS": "1",
        "GPU_SLUG": "h200",
        "BASELINE_DIR": str(tmp_path / "no-baselines"),
        "GATE_ARGS": "--device sim:h200 --num-prompts 20 --quiet",
        "REPEATS": "5",
        "MAX_REPEATS": "5",  # (a simulated run repeats to the digit: no run to add, and no look to pay for)
        "GATE_BASE": "HEAD",
        "OUT": str(tmp_path / "out"),
        "SUMMARY": str(tmp_path / "summary.md"),
    }
    script = ["bash", str(repo / GATE)]
    res = subprocess.run(script, cwd=repo, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "PASS" in (tmp_path / "summary.md").read_text() and "trend check skipped" in res.stdout
    (repo / SIM_FILE).write_text((repo / SIM_FILE).read_text() + PLANTED_SIM.format(factor="1.02"))
    git(repo, "commit", "-qam", "every simulated step 2 % slower")
    res = subprocess.run(
        script, cwd=repo, capture_output=True, text=True, env={**env, "GATE_BASE": "HEAD~1"}, timeout=900
    )
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    assert "**FAIL**" in (tmp_path / "summary.md").read_text()
