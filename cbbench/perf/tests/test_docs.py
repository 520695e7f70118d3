"""The docs say what the code is: the one code map (docs/architecture.md) is current with the modules' docstrings,
and every module has a docstring that says what it owns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_code_map_is_current() -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "ci" / "codemap.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr


def test_code_map_check_fails_on_a_new_module(tmp_path: Path) -> None:
    """The check can fail: a copy of the tree with one more module is out of date."""
    import shutil

    for name in ("ci", "docs", "refengine", "cbbench", "benchmarks", "conformance"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.npz", "data"))
    res = subprocess.run(
        [sys.executable, str(tmp_path / "ci" / "codemap.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr  # the copy is current, so what fails below is the new module
    (tmp_path / "cbbench" / "workloads" / "extra.py").write_text('"""A module the map has not seen."""\n')
    res = subprocess.run(
        [sys.executable, str(tmp_path / "ci" / "codemap.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 1 and "out of date" in res.stderr
