"""ci/shape_check.py on a small synthetic tree: the limits sit exactly at 300 lines a file and 60 lines a function."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "shape_check.py"


@pytest.fixture(scope="module")
def shape() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shape_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines(n: int) -> str:
    return "".join(f"x{i} = {i}\n" for i in range(n))


def _function(name: str, n: int) -> str:
    """A function of exactly `n` lines, its def line included."""
    return f"def {name}():\n" + "".join(f"    y{i} = {i}\n" for i in range(n - 1))


def _write(root: Path, files: dict[str, str | bytes]) -> list[str]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
    return list(files)


def test_a_file_of_301_lines_fails_and_300_passes(shape: ModuleType, tmp_path: Path) -> None:
    paths = _write(
        tmp_path,
        {
            "ok.py": _lines(300),
            "long.py": _lines(301),
            "docs/long.md": "line\n" * 301,
            "no_newline_at_end.txt": "a\n" * 300 + "b",  # 301 lines, the last unterminated
            "results/baselines/x.json": "{}\n" * 5000,  # generated data: exempt
            "blob.bin": b"\0" * 4000 + b"\n" * 400,  # binary: no lines
        },
    )
    assert shape.long_files(tmp_path, paths) == [
        ("docs/long.md", 301),
        ("long.py", 301),
        ("no_newline_at_end.txt", 301),
    ]


def test_a_function_of_61_lines_in_perf_fails_and_60_passes(shape: ModuleType, tmp_path: Path) -> None:
    nested = (
        "class Runner:\n    def outer(self):\n        def inner():\n"
        + "            z = 1\n" * 60
        + "        return inner\n"
    )
    paths = _write(
        tmp_path,
        {
            "perf/a.py": _function("fits", 60) + "\n\n" + _function("too_long", 61),
            "perf/sub/b.py": nested,  # inner is 61 lines; outer, around it, 63
            "refengine/c.py": _function("elsewhere", 200),  # the function limit is perf/'s alone
        },
    )
    found = shape.long_functions(tmp_path, paths)
    assert [(name, size) for _, name, size in found] == [
        ("too_long", 61),
        ("Runner.outer", 63),
        ("Runner.outer.inner", 61),
    ]
    assert found[0][0] == "perf/a.py:63"  # path:line of the def (60 lines, two blank ones, then it)


@pytest.mark.skipif(shutil.which("git") is None, reason="the script lists the files git tracks")
def test_the_script_prints_each_offender_and_exits_1(tmp_path: Path) -> None:
    _write(tmp_path, {"big.py": _lines(301), "perf/f.py": _function("f", 61), "untracked.py": _lines(400)})
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "big.py", "perf/f.py"], cwd=tmp_path, check=True)
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 1
    assert "big.py: 301 lines (limit 300)" in run.stdout
    assert "perf/f.py:1: function f is 61 lines (limit 60)" in run.stdout
    assert "untracked.py" not in run.stdout  # only what git tracks
    (tmp_path / "big.py").write_text(_lines(300))
    (tmp_path / "perf/f.py").write_text(_function("f", 60))
    fixed = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path)], capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stdout
