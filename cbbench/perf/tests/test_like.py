"""`cbbench perf --like BASELINE.csv` reruns exactly the baseline's configurations, and the README's gate
commands work verbatim on the committed baseline: its rerun shares every configuration with it, and the
baseline compared with itself passes under its own tolerance file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.perf.backends import in_process
from cbbench.perf.cli import app
from cbbench.perf.plan.like import load_like
from cbbench.perf.results.files import read_csv
from cbbench.perf.results.schema import config_key
from refengine.models.presets import TEST_MODEL

ROOT = Path(__file__).resolve().parents[3]
BASELINE = ROOT / "results" / "baselines" / "cpu.csv"


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_readme_shows_like_and_compare_and_the_cpu_gate_gates_with_cbbench_gate():
    readme = (ROOT / "README.md").read_text()
    gate = (ROOT / "ci" / "cpu_gate.sh").read_text()
    assert "cbbench perf --like results/baselines/cpu.csv --output NEW.csv" in readme
    assert "cbbench compare results/baselines/cpu.csv NEW.csv" in readme
    assert re.search(r'cbbench" gate --base "\$GATE_BASE"', gate)  # no stored CPU baseline: base and head in one job
    assert "baselines/cpu.csv" not in gate  # retired: its tolerances let throughput fall 60 %
    assert re.search(r'cbbench" perf --like "\$SIM_BASELINE" --output "\$OUT/sim-h200.csv"', gate)
    assert re.search(r'cbbench" compare "\$SIM_BASELINE" "\$OUT/sim-h200.csv"\n', gate)
    assert "--tolerance" not in gate  # tolerances live with the baseline
    assert (BASELINE.parent / "cpu.tolerances.toml").is_file()


def test_committed_baseline_parses_into_a_plan():
    plan = load_like(BASELINE)
    df = read_csv(BASELINE)
    assert plan.workload == df.loc[0, "workload"] and plan.repeats == df["repeat"].max() + 1
    assert len(plan.entries) == len({config_key(r) for r in df.to_dict("records")})
    assert plan.command.startswith("cbbench perf ")


def test_baseline_against_itself_passes():
    res = invoke("compare", str(BASELINE), str(BASELINE))
    assert res.exit_code == 0, res.output
    assert "cpu.tolerances.toml" in res.output and "in common" in res.output
    assert "(cpu-baseline)" in res.output  # the baseline's --label names it


def test_like_reruns_every_configuration_of_the_baseline(tmp_path):
    new = tmp_path / "NEW.csv"
    res = invoke("perf", "--like", str(BASELINE), "--repeats", "1", "--output", str(new), "--quiet")
    assert res.exit_code == 0, res.output
    base_keys = {config_key(r) for r in read_csv(BASELINE).to_dict("records")}
    new_df = read_csv(new)
    assert {config_key(r) for r in new_df.to_dict("records")} == base_keys and len(new_df) == len(base_keys)
    res = invoke("compare", str(BASELINE), str(new))
    assert res.exit_code in (0, 1), res.output  # speed on a shared CPU may move; the match may not
    assert f"{len(base_keys)} configuration(s) in common" in res.output.replace("\n", " ")


def test_like_on_a_sweep_with_peers(tmp_path, monkeypatch):
    made = tmp_path / "made.csv"
    res = invoke(
        "perf",
        "--model",
        TEST_MODEL,
        "--workload",
        "fixed",
        "--workload-param",
        "input_len=8,output_len=4",
        "--num-prompts",
        "3",
        "--max-num-seqs",
        "2",
        "--warmup",
        "0",
        "--cpu-threads",
        "0",
        "--quiet",
        "--peers",
        "hf-static",
        "--batching",
        "continuous",
        "--max-num-batched-tokens",
        "16,64",
        "--output",
        str(made),
    )
    assert res.exit_code == 0, res.output
    plan = load_like(made)
    assert sorted((e, m, k.max_num_batched_tokens) for e, m, k in plan.entries) == [
        ("hf-static", "static", None),
        ("refengine", "continuous", 16),
        ("refengine", "continuous", 64),
    ]
    seen = []
    real = in_process.run_refengine
    monkeypatch.setattr(in_process, "run_refengine", lambda *a, **k: seen.append(k["knobs"]) or real(*a, **k))
    again = tmp_path / "again.csv"
    assert invoke("perf", "--like", str(made), "--output", str(again), "--quiet").exit_code == 0
    assert sorted(k.max_num_batched_tokens for k in seen) == [16, 64] and seen[0].num_gpu_blocks
    key = lambda p: sorted(map(config_key, read_csv(p).to_dict("records")))  # noqa: E731
    assert key(again) == key(made)


@pytest.mark.parametrize("extra", [["--workload", "sharegpt"], ["--max-num-seqs", "8"], ["--batching", "static"]])
def test_like_refuses_options_that_change_the_configurations(tmp_path, extra):
    res = invoke("perf", "--like", str(BASELINE), "--output", str(tmp_path / "x.csv"), *extra)
    assert res.exit_code == 2 and "--like takes the configurations from" in res.stderr
    assert not (tmp_path / "x.csv").exists()
