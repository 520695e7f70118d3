"""benchmarks/ (the project's measurements of itself) stands beside the product, not in it: the wheel's package list
leaves it out, what ships imports none of it, and it runs as `python -m benchmarks.<name>` from the repository's
root, where the test run imports it too, and from nowhere else (the editable install does not lend it either).
docs/architecture.md, "The harness and its self-measurement", lists which module went where and why."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[3]
BENCHMARKS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem != "__init__")
# the modules that stay in the package because a `cbbench` command runs them (bench-*, kernels, sim validate)
COMMAND_MODULES = ("cbbench.perf.bench.step", "cbbench.perf.bench.profile", "cbbench.perf.sim.run_validation")


def shipped_packages(root: Path) -> list[str]:
    """The packages pyproject.toml's `[tool.setuptools.packages.find]` puts in the wheel, found under `root`."""
    find = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return find_packages(str(root), include=find["include"], exclude=find.get("exclude", ()))


def test_the_wheel_leaves_benchmarks_out() -> None:
    shipped = shipped_packages(REPO)
    assert {"cbbench.perf", "cbbench.perf.bench", "cbbench.perf.sim", "refengine"} <= set(shipped)  # (it finds)
    assert [p for p in shipped if p == "benchmarks" or p.startswith("benchmarks.")] == []
    assert len(BENCHMARKS) > 10 and all((REPO / "benchmarks" / f"{m}.py").is_file() for m in BENCHMARKS)
    for module in COMMAND_MODULES:
        assert module.rpartition(".")[0] in shipped and (REPO / (module.replace(".", "/") + ".py")).is_file()


def test_the_package_check_can_fail(tmp_path: Path) -> None:
    """A pyproject whose patterns take in every package ships benchmarks: the check above would see it."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["*"]\n')
    assert shipped_packages(tmp_path) == ["benchmarks"]


def test_benchmarks_import_from_the_root_here_and_not_from_elsewhere(tmp_path: Path) -> None:
    """This run imports it (pytest puts the root, which holds conftest.py, on sys.path); `python -m` finds it in the
    root; from any other folder, with the same interpreter and its editable install, it is not there."""
    import benchmarks.gpu_runs

    assert Path(benchmarks.gpu_runs.__file__).resolve() == REPO / "benchmarks" / "gpu_runs.py"
    code = "import importlib.util, sys; print(importlib.util.find_spec('benchmarks') is not None)"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # (no PYTHONPATH)
    here = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    away = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
    )
    assert (here.stdout.strip(), away.stdout.strip()) == ("True", "False"), here.stderr + away.stderr
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.ratio_series", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "--neighbour-runs" in run.stdout, run.stderr
