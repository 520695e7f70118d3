"""The root conftest.py's guard: a run that leaves a new or changed file in the checkout fails (exit 1, the paths
listed), under pytest-xdist as the default addopts run it, while what a test writes to a relative path lands in its
scratch working directory and pytest-benchmark keeps no `.benchmarks` folder there. Checked on a copy of that
conftest.py in a scratch checkout (pytester), run in a subprocess: under xdist (a controller, a worker) and without."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT_CONFTEST = Path(__file__).resolve().parents[3] / "conftest.py"
TESTS = {
    "test_relative": """
from pathlib import Path

def test_writes_a_relative_path():  # as `cbbench perf` does with its default --result-dir results
    Path("results").mkdir()
    Path("results/run.json").write_text("{}")
""",
    "test_checkout": """
from pathlib import Path

def test_writes_into_the_checkout():
    (Path(__file__).parent / "results").mkdir(exist_ok=True)
    (Path(__file__).parent / "results" / "planted.json").write_text("{}")

def test_changes_a_file_of_the_checkout():
    (Path(__file__).parent / "notes.md").write_text("changed, longer than before")
""",
}
XDIST = ("-p", "xdist", "-n", "1", "--dist", "loadfile", "-p", "no:cacheprovider")  # a controller and a worker


@pytest.fixture
def checkout(pytester: pytest.Pytester) -> Path:
    """A checkout with the root conftest.py, the tests above, a committed file and a user's earlier result; beside
    it (not in it) pytester keeps the subprocess's output."""
    root = pytester.mkdir("checkout")
    (root / "conftest.py").write_text(ROOT_CONFTEST.read_text())
    for name, text in TESTS.items():
        (root / f"{name}.py").write_text(text)
    (root / "notes.md").write_text("as committed")
    (root / "results").mkdir()
    (root / "results" / "old.csv").write_text("a user's own result, there before the run")
    return root


def test_a_test_that_writes_into_the_checkout_fails_the_run(pytester: pytest.Pytester, checkout: Path) -> None:
    res = pytester.runpytest_subprocess(*XDIST, str(checkout))
    res.assert_outcomes(passed=3)  # every test passed: the guard alone fails the run
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    out = res.stdout.str()
    assert "tests wrote into the checkout" in out
    listed = [line.split()[-2:] for line in out.splitlines() if line.startswith(("  new ", "  changed ", "  removed "))]
    assert listed == [["new", "results/planted.json"], ["changed", "notes.md"]]  # not the relative write
    assert not (checkout / ".benchmarks").exists()


def test_a_clean_run_passes(pytester: pytest.Pytester, checkout: Path) -> None:
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", str(checkout / "test_relative.py"))
    res.assert_outcomes(passed=1)
    assert res.ret == pytest.ExitCode.OK and "tests wrote into the checkout" not in res.stdout.str()
    assert sorted(p.name for p in (checkout / "results").iterdir()) == ["old.csv"]
    assert not (checkout / ".benchmarks").exists()
