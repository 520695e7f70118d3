"""The benchmarks the GPU check prints ratios from, run here on the CPU and on a simulated GPU: a mixed step's host
time against a decode-only one (perf/bench/step.py), a decode step against its floor (benchmarks/step_floor.py) and
real / simulated throughput (benchmarks/real_vs_sim.py). No time is asserted: the numbers are only printed; what is
checked is that each runs, and the arithmetic of its floors and ratios."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from benchmarks import real_vs_sim, step_floor
from cbbench.perf.bench import step
from cbbench.perf.cli import app
from refengine.models.presets import TEST_MODEL


def test_bench_step_prints_the_mixed_over_decode_ratio() -> None:
    args = ["bench-step", "--stub-model", "--running", "3", "--iters", "2", "--warmup", "1", "--mixed-prompt-len", "9"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    row = re.search(r"^\s+3\s+9\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", res.output, re.M)
    assert row, res.output
    decode, mixed, ratio = map(float, row.groups())
    assert math.isclose(ratio, mixed / decode, rel_tol=0.01)
    bad = CliRunner().invoke(app, [*args[:-1], "1"])
    assert bad.exit_code == 2 and "mixed-prompt-len" in bad.output


def test_step_module_entry_point(capsys) -> None:
    assert step.main(["--running", "2", "--mixed-prompt-len", "5", "--iters", "2", "--warmup", "0"]) == 0
    assert "mixed/decode" in capsys.readouterr().out
    assert step.main(["--running", "2", "--mixed-prompt-len", "1"]) == 2


def test_weight_params_are_the_linears_a_decode_step_reads() -> None:
    """Against the real tiny model: every Linear's weight, plus lm_head (which is the embedding when tied)."""
    import torch

    from refengine import LLMEngine

    engine = LLMEngine(TEST_MODEL, num_gpu_blocks=16)
    model, mc = engine.model, engine.model_config
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    lm_head = (
        0
        if any(
            m.weight.shape == (mc.vocab_size, mc.hidden_size) for m in model.modules() if isinstance(m, torch.nn.Linear)
        )
        else mc.vocab_size * mc.hidden_size
    )
    assert step_floor.weight_params(mc) == linears + lm_head


@pytest.mark.parametrize("device", ["cpu", "sim:h200"])
def test_step_floor_runs_and_its_floor_is_bytes_over_bandwidth(device, capsys) -> None:
    row = step_floor.bench_step_floor(TEST_MODEL, device, running=3, context=20, iters=2, warmup=1)
    memory_ms = (row["weights_gb"] + row["kv_gb"]) / row["bandwidth_gb_s"] * 1e3
    assert math.isclose(row["memory_floor_ms"], memory_ms, rel_tol=1e-9)
    floor = max(row["memory_floor_ms"], row["compute_floor_ms"])
    assert math.isclose(row["step_over_floor"], row["step_ms"] / floor, rel_tol=1e-9) and row["step_ms"] > 0
    if device.startswith("sim"):
        assert row["ceilings"] == "data sheet (sim:h200)" and row["bandwidth_gb_s"] == 4800
        assert math.isnan(row["graphed_steps"])  # (a simulated GPU's steps do not say)
    assert step_floor.main(["--device", device, "--running", "2", "--context", "8", "--iters", "1"]) == 0
    assert "step/floor" in capsys.readouterr().out


def test_real_over_sim_per_configuration() -> None:
    cols = {"engine": "refengine", "max_num_seqs": 4}
    metrics = dict.fromkeys(
        ("mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "duration"),
        1.0,
    )
    real = pd.DataFrame(
        [
            {**cols, **metrics, "batching": b, "output_throughput": t}
            for b, t in (("continuous", 90.0), ("static", 60.0), ("continuous", 110.0))
        ]
    )
    sim = pd.DataFrame(
        [
            {**cols, **metrics, "batching": b, "output_throughput": t}
            for b, t in (("continuous", 200.0), ("static", 100.0))
        ]
    )
    rows = real_vs_sim.throughput_ratios(real, sim)
    by = {r.batching: r for r in rows.itertuples()}
    assert by["continuous"].real_tok_s == 100.0 and by["continuous"].real_over_sim == 0.5  # (median of repeats)
    assert by["static"].real_over_sim == 0.6
    assert real_vs_sim.continuous_over_static(rows, "real_tok_s") == {("refengine", 4): 100.0 / 60.0}
    assert "0.50x" in real_vs_sim.format_report(rows)


def test_real_vs_sim_entry_point_on_the_cpu(tmp_path, capsys) -> None:
    perf = [
        "--workload",
        "fixed",
        "--workload-param",
        "input_len=8,output_len=3",
        "--num-prompts",
        "2",
        "--batching",
        "continuous,static",
        "--max-num-seqs",
        "2",
        "--peers",
        "none",
        "--warmup",
        "0",
    ]
    assert real_vs_sim.main([str(tmp_path), "--real-device", "cpu", *perf]) == 0
    out = capsys.readouterr().out
    assert "real/sim" in out and "continuous / static (real" in out
    assert len(pd.read_csv(tmp_path / "real_vs_sim.csv")) == 2
    assert real_vs_sim.main([str(tmp_path), *perf, "--device", "cpu"]) == 2
