"""ci/readme_examples.py finds every example command of a README's ```bash blocks and `--check` plans, parses or
runs each: on a small README-like file (good examples pass, broken ones fail, each on its own line) and on the
real README (every example parses; the perf ones plan)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.perf.cli import app

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "ci" / "readme_examples.py")
rx = importlib.util.module_from_spec(_spec)
sys.modules["readme_examples"] = rx  # dataclasses look their module up there
_spec.loader.exec_module(rx)

README_LIKE = """# A tool

```bash
bash ci/setup.sh && .venv/bin/cbbench --help     # set up, then look
export CBBENCH_DEBUG=1
cbbench perf --workload fixed \\
    --num-prompts 4                               # a comment, not an option
cbbench show results/<file>.csv --format markdown
cbbench compare results/baselines/cpu.csv NEW.csv
cbbench serve --port 8001
pytest perf/tests/test_rows.py
python -c "import cbbench.perf.cli"
```

```python
cbbench = "not a shell example"
```
"""
BROKEN = """```bash
cbbench perf --no-such-option
cbbench serve --port abc
pytest no/such/folder/
cbbench show results/baselines/cpu.csv --format yaml
```
"""


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """The results files the examples read, made here in this process: --check would start a `cbbench perf` for them
    (a torch import and a model load, ~10 s). The real README's check (nightly) makes them its own way."""
    folder = tmp_path_factory.mktemp("fixtures")
    res = CliRunner().invoke(app, [*shlex.split(rx.FIXTURE_RUN), "--output", str(folder / "sweep.csv")])
    assert res.exit_code == 0, res.output
    return folder


def test_extract_finds_the_commands_of_bash_blocks():
    got = [(ex.line, ex.argv) for ex in rx.extract(README_LIKE)]
    assert got == [
        (4, ["bash", "ci/setup.sh"]),
        (4, [".venv/bin/cbbench", "--help"]),
        (6, ["cbbench", "perf", "--workload", "fixed", "--num-prompts", "4"]),
        (8, ["cbbench", "show", "results/<file>.csv", "--format", "markdown"]),
        (9, ["cbbench", "compare", "results/baselines/cpu.csv", "NEW.csv"]),
        (10, ["cbbench", "serve", "--port", "8001"]),
        (11, ["pytest", "perf/tests/test_rows.py"]),
        (12, ["python", "-c", "import cbbench.perf.cli"]),
    ]


def test_check_passes_a_readme_like_file(tmp_path, fixtures, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(README_LIKE)
    assert rx.main(["--check", "--readme", str(readme), "--fixtures", str(fixtures)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "8 of 8 examples pass" in out
    assert not list(ROOT.glob("fixture-*")) and not (ROOT / "NEW.csv").exists()  # nothing written into the checkout


def test_check_fails_each_broken_example(tmp_path, fixtures, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(BROKEN)
    assert rx.main(["--check", "--readme", str(readme), "--fixtures", str(fixtures)]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith(("ok", "FAIL"))]
    assert len(lines) == 4 and all(x.startswith("FAIL") for x in lines), lines
    assert "no/such/folder/" in lines[2]


@pytest.mark.slow  # about 2 minutes (a `perf --dry-run` subprocess per example): nightly; the machinery is tested above
def test_check_passes_the_real_readme(fixtures, capsys):
    examples = rx.extract((ROOT / "README.md").read_text())
    assert any(rx.cbbench_args(ex) and rx.cbbench_args(ex)[0] == "perf" for ex in examples)
    assert rx.main(["--check", "--fixtures", str(fixtures)]) == 0, capsys.readouterr().out


def test_list_prints_every_example(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(README_LIKE)
    assert rx.main(["--list", "--readme", str(readme)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "6: cbbench perf --workload fixed --num-prompts 4"


def test_full_times_every_example_and_lists_the_slow_ones(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text('```bash\npython -c "import time; time.sleep(0.3)"\npython -c "raise SystemExit(3)"\n```\n')
    assert rx.main(["--full", "--readme", str(readme), "--slow-s", "0.2"]) == 1  # the second one fails
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"\s+\d+\.\d s  line 2: python -c .* ok", out[0]), out
    assert re.match(r"\s+\d+\.\d s  line 3: python -c .* FAILED", out[1]), out
    assert [x for x in out if x.startswith("over 0.2 s")][0].endswith(
        "line 2: python -c 'import time; time.sleep(0.3)'"
    )


def test_only_files_the_repository_tracks_are_read_from_the_checkout(tmp_path, fixtures):
    """A user's own `prompts.jsonl` in the repository root (untracked) must not stand in for the example's file; a
    results JSON stands in with its CSV and its record folder, so `report` reads the records."""
    stray = ROOT / f"prompts-untracked-{os.getpid()}.jsonl"
    stray.write_text('{"prompt": "not the fixture"}\n')
    try:
        jsonl = fixtures / "prompts.jsonl"
        jsonl.write_text('{"prompt": "the fixture", "output_len": 4}\n')
        made = {".csv": fixtures / "sweep.csv", ".json": fixtures / "sweep.json", ".jsonl": jsonl}
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        args = ["perf", "--dataset-path", stray.name, "--like", "results/baselines/cpu.csv"]
        got = rx.substitute(args, made, scratch)
        assert Path(got[2]).read_text() == jsonl.read_text() and got[4] == "results/baselines/cpu.csv"
        (report_json,) = rx.substitute(["results/<file>.json"], made, scratch)
        assert Path(report_json).with_suffix(".records").is_dir() and Path(report_json).with_suffix(".csv").is_file()
    finally:
        stray.unlink()
