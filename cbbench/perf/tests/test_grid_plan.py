"""`cbbench plan`: the SLO check, the best configuration per GPU and the Pareto frontier on rows made by hand; the
command on a small simulated grid with tensor parallelism 1 and 2 (its summary is the analysis of the rows it
wrote, its files are perf's, `cbbench report` draws the frontier); and its one-line refusals."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from cbbench.perf import cli
from cbbench.perf.capacity import MAX_PLAN_RUNS
from cbbench.perf.report.html import render_html
from cbbench.perf.results.frontier import Slo, best_per_gpu, candidates, pareto, summary_lines
from cbbench.perf.results.run_json import read_run


def row(mode: str, seqs: int, tp: int, tput: float, ttft: float, tpot: float, **kw) -> dict:
    base = dict(
        batching=mode, max_num_seqs=seqs, tensor_parallel_size=tp, output_throughput=tput, p99_ttft_ms=ttft,
        p99_tpot_ms=tpot, completed=10,
    )  # fmt: skip
    return {**base, **kw}


ROWS = [
    row("continuous", 64, 1, 1000.0, 200.0, 20.0),  # meets; 1000 per GPU
    row("continuous", 256, 1, 1500.0, 900.0, 45.0),  # misses TTFT by 80%: the most per GPU, but out
    row("continuous", 256, 2, 2400.0, 300.0, 15.0),  # meets; 1200 per GPU: the best
    row("static", 256, 2, 2300.0, 300.0, 16.0),  # dominated by the one above (less per GPU, slower)
    row("continuous", 512, 4, 3000.0, 100.0, 8.0),  # meets; 750 per GPU at the lowest TPOT
    row("continuous", 128, 1, 0.0, math.nan, math.nan, completed=0),  # measured nothing: no candidate
]
SLO = Slo(ttft_p99_ms=500, tpot_p99_ms=40)


def test_best_per_gpu_is_the_most_tokens_per_gpu_that_meets_the_slo() -> None:
    cands = candidates(ROWS, SLO)
    assert len(cands) == 5
    best = best_per_gpu(cands)
    assert best is not None and best.row is ROWS[2] and best.per_gpu == 1200.0
    assert best_per_gpu(candidates(ROWS, Slo(ttft_p99_ms=50))) is None  # nothing that fast


def test_misses_say_by_how_much() -> None:
    (missed,) = [c for c in candidates(ROWS, SLO) if not c.meets_slo]
    assert missed.misses == ("TTFT p99 900.0 ms > 500 ms (+80%)", "TPOT p99 45.0 ms > 40 ms (+12%)")


def test_the_frontier_is_the_pareto_set_by_latency() -> None:
    front = pareto(candidates(ROWS, SLO))
    assert [c.row for c in front] == [ROWS[4], ROWS[2], ROWS[1]]  # 750 @ 8 ms, 1200 @ 15 ms, 1500 @ 45 ms


def test_the_tp_of_a_row_may_sit_in_extra() -> None:
    r = {k: v for k, v in ROWS[2].items() if k != "tensor_parallel_size"}
    (c,) = candidates([{**r, "extra": json.dumps({"tensor_parallel_size": 2})}], SLO)
    assert c.gpus == 2 and c.per_gpu == 1200.0
    (c,) = candidates([r], SLO)
    assert c.gpus == 1  # none recorded: one GPU


@pytest.mark.parametrize("kw", [{}, {"ttft_p99_ms": 0}, {"tpot_p99_ms": math.inf}, {"ttft_p99_ms": "5"}])
def test_a_bad_slo_is_refused(kw) -> None:
    with pytest.raises(ValueError, match="slo"):
        Slo(**kw)


def invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


SMALL = ["plan", "--workload", "fixed", "--workload-param", "input_len=256,output_len=32", "--num-prompts", "16"]


def test_plan_on_a_simulated_grid_with_tensor_parallelism(tmp_path) -> None:
    out = tmp_path / "plan.csv"
    args = [*SMALL, "--max-num-seqs", "8,16", "--max-num-batched-tokens", "1024", "--tensor-parallel-size", "1,2"]
    res = invoke(*args, "--batching", "continuous", "--slo-ttft-p99-ms", "200", "--slo-tpot-p99-ms", "50",
                 "--executor", "serial", "--output", str(out), "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = read_run(out.with_suffix(".json"))
    rows = doc["rows"]
    assert sorted((r["max_num_seqs"], r["tensor_parallel_size"]) for r in rows) == [(8, 1), (8, 2), (16, 1), (16, 2)]
    tp2 = {r["max_num_seqs"]: r for r in rows if r["tensor_parallel_size"] == 2}
    tp1 = {r["max_num_seqs"]: r for r in rows if r["tensor_parallel_size"] == 1}
    assert tp2[16]["output_throughput"] != tp1[16]["output_throughput"]  # TP is simulated, not ignored
    want = summary_lines(rows, Slo(200, 50))
    assert res.stdout.strip().splitlines()[-len(want) :] == want
    assert doc["config"]["capacity_plan"]["slo_ttft_p99_ms"] == 200
    page = render_html(doc)  # what `cbbench report` writes
    assert '<section id="frontier">' in page and page.count('<circle class="run ') == 4
    assert "best per GPU" in page


def test_plan_refusals_are_one_line_exit_2(monkeypatch) -> None:
    cases = [
        ([*SMALL, "--dry-run"], "cbbench plan: error: slo: give --slo-ttft-p99-ms, --slo-tpot-p99-ms or both"),
        ([*SMALL, "--slo-tpot-p99-ms", "50", "--request-rate", "1,2", "--dry-run"], "--request-rate: cbbench plan"),
        (
            [*SMALL, "--slo-tpot-p99-ms", "50", "--max-num-seqs", ",".join(map(str, range(1, 101))), "--dry-run"],
            f"plan: the search is 3600 runs (--max-num-seqs 100 x --max-num-batched-tokens 3 x "
            f"--tensor-parallel-size 4 x batching 3), over MAX_PLAN_RUNS={MAX_PLAN_RUNS}",
        ),
    ]
    for args, want in cases:
        res = invoke(*args)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and want in lines[0], res.stderr


def test_a_tp_the_device_refuses_is_dropped_from_the_default_list_and_refused_by_name(monkeypatch) -> None:
    from refengine.sim.sim_device import SimDevice

    real = SimDevice.create.__func__

    def only_one_and_two(cls, device, model, dtype, tensor_parallel_size=1):
        if tensor_parallel_size > 2:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: planted refusal")
        return real(cls, device, model, dtype, tensor_parallel_size)

    monkeypatch.setattr(SimDevice, "create", classmethod(only_one_and_two))
    res = invoke(*SMALL, "--slo-tpot-p99-ms", "50", "--max-num-seqs", "8", "--batching", "continuous", "--dry-run")
    assert res.exit_code == 0, res.output
    runs = [x for x in res.stdout.splitlines() if x.startswith("  refengine ")]
    assert sorted(x.split("tensor_parallel_size=")[1].split(",")[0] for x in runs) == ["1"] * 3 + ["2"] * 3
    assert "tensor_parallel_size 4,8 left out (planted refusal); searched 1,2" in res.stdout
    res = invoke(*SMALL, "--slo-tpot-p99-ms", "50", "--tensor-parallel-size", "1,4", "--dry-run")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and lines == ["cbbench plan: error: --tensor-parallel-size=4: planted refusal"]
