"""The commands that only read results (`--help`, compare, plot, report, show) never import torch, and `--help`,
compare and show not pandas, numpy or pydantic either (their imports alone outlast the 1 s these commands may take):
each runs in a fresh interpreter and reports which of them reached `sys.modules`. Timing is benchmarks/cli_startup.py's job."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cbbench.perf.cli import app
from refengine.models.presets import TEST_MODEL

# a sweep of max_num_seqs, so that `plot` has an x axis
TINY = [
    "--model",
    TEST_MODEL,
    "--workload",
    "fixed",
    "--workload-param",
    "input_len=8,output_len=4",
    "--num-prompts",
    "2",
    "--max-num-seqs",
    "1,2",
    "--warmup",
    "1",
    "--cpu-threads",
    "0",
    "--quiet",
    "--peers",
    "none",
    "--batching",
    "continuous",
]
# Runs the command as the `cbbench` script does, then prints the exit code and whether torch was imported
PROBE = """
import json, sys
# pydantic: typer 0.2x coerces with it (cli/app.py avoids that). symbolic_shapes: torch imports it (1.2 s) on the
# first empty_like of a meta tensor, which the model loader avoids
HEAVY = ("pandas", "numpy", "pydantic", "torch.fx.experimental.symbolic_shapes")
from cbbench.perf.cli import app
code = 0
try:
    app(sys.argv[1:], prog_name="cbbench")
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "heavy": [m for m in HEAVY if m in sys.modules]}))
"""
SUBPROCESS_TIMEOUT_S = 120  # a cold interpreter on a shared 2-core machine; the commands take ~1 s


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("fast")
    res = CliRunner().invoke(app, ["perf", *TINY, "--result-dir", str(out)])
    assert res.exit_code == 0, res.output
    (csv,) = out.glob("*.csv")
    (js,) = out.glob("*.json")
    return out, csv, js


def probe(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _command_names() -> set[str]:
    import typer.main

    return set(typer.main.get_command(app).commands)


def test_help_leaves_torch_out():
    assert probe("--help")["torch"] is False


@pytest.mark.parametrize("args", [["--help"], ["plot", "--help"], ["report", "--help"], ["compare", "--help"]])
def test_help_leaves_pandas_and_numpy_out(args):
    assert probe(*args) == {"code": 0, "torch": False, "heavy": []}


def test_compare_and_show_leave_pandas_and_numpy_out(run_files):
    out, csv, js = run_files
    for args in (["compare", str(csv), str(csv)], ["show", str(csv)], ["show", str(csv), "--format", "json"]):
        assert probe(*args) == {"code": 0, "torch": False, "heavy": []}, args


def test_result_commands_leave_torch_out(run_files):
    out, csv, js = run_files
    cases = [
        ["compare", str(csv), str(csv)],
        ["plot", str(csv), "--knob", "max_num_seqs", "--out", str(out / "p.png")],
        ["report", str(js), "-o", str(out / "r.html")],
    ]
    if "show" in _command_names():  # another change adds it; when it exists it is held to the same rule
        cases.append(["show", str(csv)])
    for args in cases:
        assert {k: v for k, v in probe(*args).items() if k != "heavy"} == {"code": 0, "torch": False}, args
    assert (out / "r.html").exists() and any(out.glob("p*.png"))


def test_probe_sees_torch():
    """The control: a command that needs the engine does import torch, so a False above means something. And
    loading the model leaves torch.fx's symbolic shapes out (refengine/models/loader.py's `_empty_model`)."""
    seen = probe("generate", "hi", "--max-tokens", "1", "--model", TEST_MODEL)
    assert seen["code"] == 0 and seen["torch"] is True and "numpy" in seen["heavy"], seen
    assert "torch.fx.experimental.symbolic_shapes" not in seen["heavy"], seen


def test_perf_plan_and_refusals_leave_torch_out():
    """`perf --dry-run` plans a CPU run (presets, tokenizer, dtype by name) and a bad knob is refused without torch,
    in a moment instead of the 4-5 s a torch import costs."""
    assert probe("perf", "--model", TEST_MODEL, "--peers", "none", "--dry-run")["torch"] is False
    refused = probe("perf", "--max-num-seqs", "0", "--dry-run")
    assert refused["code"] == 2 and refused["torch"] is False, refused
