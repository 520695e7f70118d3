"""The results CSV schema, repeat aggregation, the run JSON, and `compare` as a CI gate."""

from __future__ import annotations

import csv
import json
import math

import pytest
from rich.console import Console

from cbbench.perf.results.columns import COLUMNS, SCHEMA_VERSION
from cbbench.perf.results.compare import compare, main_compare, parse_tolerances, render_table, resolve_tolerances
from cbbench.perf.results.environment import environment_info
from cbbench.perf.results.files import append_rows, read_csv, write_csv, write_run_json
from cbbench.perf.results.rows import read_rows
from cbbench.perf.results.schema import aggregate_repeats, config_key, make_row
from cbbench.workloads.catalog import get_workload

# The column order of schema version 4 (2 plus tensor_parallel_size in 3, plus a gate's arm in 4). Changing COLUMNS
# means bumping SCHEMA_VERSION and this list together.
EXPECTED_COLUMNS_V4 = (
    "schema_version",
    "label",
    "engine",
    "model",
    "device",
    "dtype",
    "workload",
    "num_prompts",
    "seed",
    "request_rate",
    "burstiness",
    "batching",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "enable_prefix_caching",
    "preemption_mode",
    "policy",
    "priority_preemption",
    "attention_backend",
    "tensor_parallel_size",
    "arm",
    "repeat",
    "workload_params",
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    *(
        f"{s}_{m}_ms"
        for m in ("ttft", "tpot", "itl", "e2el", "queue")
        for s in ("mean", "median", "std", "p50", "p75", "p90", "p95", "p99", "p99.9")
    ),
    "num_preemptions",
    "recomputed_tokens",
    "peak_kv_blocks",
    "peak_kv_usage",
    "prefix_cache_hit_rate",
    "mean_slot_utilisation",
    "mean_token_budget_utilisation",
    "slot_waste",
    "num_steps",
    "git_sha",
    "timestamp",
    "command",
    "run_options",
    "extra",
)
# schema 5: the client's schedule delay and achieved rate, the steady-state window's figures and its note
V5_METRICS = (
    "median_schedule_delay_ms",
    "p99_schedule_delay_ms",
    "max_schedule_delay_ms",
    "achieved_request_rate",
    "steady_state_duration",
    "steady_output_throughput",
    *(f"steady_{s}_{m}_ms" for m in ("ttft", "tpot", "itl") for s in ("mean", "median", "p99")),
)
_AT = EXPECTED_COLUMNS_V4.index("git_sha")
EXPECTED_COLUMNS_V5 = (*EXPECTED_COLUMNS_V4[:_AT], *V5_METRICS, "steady_state_note", *EXPECTED_COLUMNS_V4[_AT:])
KNOBS = {
    "max_num_seqs": 8,
    "max_num_batched_tokens": 512,
    "block_size": 16,
    "num_gpu_blocks": 256,
    "preemption_mode": "recompute",
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "dtype": "float32",
}
BASE_METRICS = {
    "request_throughput": 2.0,
    "output_throughput": 200.0,
    "total_token_throughput": 600.0,
    **{f"{s}_{m}_ms": 100.0 for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")},
}


def row(batching="continuous", repeat=0, engine="refengine", input_len=8, **metric_changes):
    metrics = {**BASE_METRICS, **metric_changes}
    return make_row(
        metrics=metrics,
        engine=engine,
        workload=get_workload("fixed", num_prompts=4, seed=0, input_len=input_len, output_len=4),
        batching=batching,
        config=KNOBS,
        repeat=repeat,
        model="tiny-qwen2",
        device="cpu",
        git_sha="abc",
        timestamp="2025-01-01T00:00:00+00:00",
    )


def scale(factor_tp=1.0, factor_lat=1.0):
    return {k: v * (factor_tp if "throughput" in k else factor_lat) for k, v in BASE_METRICS.items()}


@pytest.fixture
def baseline(tmp_path):
    return write_csv(tmp_path / "base.csv", [row(b) for b in ("continuous", "static")])


def gate(tmp_path, baseline, rows, **kw):
    new = write_csv(tmp_path / "new.csv", rows)
    return main_compare(baseline, new, console=Console(file=open(tmp_path / "out.txt", "w"), width=200), **kw)


def test_csv_schema_is_fixed(tmp_path):
    assert COLUMNS == EXPECTED_COLUMNS_V5 and SCHEMA_VERSION == 5
    path = write_csv(tmp_path / "r.csv", [row()])
    with path.open() as f:
        header = next(csv.reader(f))
    assert tuple(header) == EXPECTED_COLUMNS_V5
    df = read_csv(path)
    assert df.loc[0, "schema_version"] == 5 and df.loc[0, "engine"] == "refengine"
    assert df.loc[0, "workload"] == "fixed" and df.loc[0, "num_prompts"] == 4
    assert json.loads(df.loc[0, "workload_params"])["input_len"] == 8
    assert df.loc[0, "request_rate"] == math.inf


def test_unknown_metrics_go_to_extra_and_headers_must_match(tmp_path):
    r = row(p97_ttft_ms=7.0)
    assert json.loads(r["extra"]) == {"p97_ttft_ms": 7.0}
    path = append_rows(tmp_path / "r.csv", [r])
    append_rows(path, [row(repeat=1)])
    assert len(read_csv(path)) == 2
    other = tmp_path / "other.csv"
    other.write_text("schema_version,engine\n5,refengine\n")
    with pytest.raises(ValueError, match="header"):
        append_rows(other, [row()])
    with pytest.raises(ValueError, match="columns"):
        read_csv(other)


def _older(tmp_path, version: int, dropped: tuple[str, ...]) -> tuple:
    """A file of an older schema: this one's row without the columns added since `version`."""
    new = write_csv(tmp_path / "new.csv", [row(tensor_parallel_size=1)])
    header, line = new.read_text().splitlines()
    cells = next(csv.reader([line]))
    names = header.split(",")
    old_cells = [str(version), *(c for n, c in zip(names[1:], cells[1:]) if n not in dropped)]
    old = tmp_path / f"v{version}.csv"
    with old.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([c for c in EXPECTED_COLUMNS_V5 if c not in dropped])
        w.writerow(old_cells)
    return new, old


_V5 = (*V5_METRICS, "steady_state_note")


@pytest.mark.parametrize("version, dropped", [(2, ("tensor_parallel_size", "arm", *_V5)), (3, ("arm", *_V5)), (4, _V5)])
def test_an_older_schema_file_reads_as_this_one(tmp_path, version, dropped):
    """Schema 2 (before tensor parallelism), 3 (before `cbbench gate`'s arm) and 4 (before the client's and the
    steady-state figures) files, e.g. older baselines, read with tensor_parallel_size 1, no arm and empty schema-5
    cells, by both readers, and a resumed or compared run matches them by configuration."""
    new, old = _older(tmp_path, version, dropped)
    df = read_csv(old)
    assert tuple(df.columns) == COLUMNS and df.loc[0, "tensor_parallel_size"] == 1 and df.loc[0, "schema_version"] == 5
    assert math.isnan(df.loc[0, "arm"]) and math.isnan(df.loc[0, "steady_output_throughput"])
    (rows,) = read_rows(old)
    assert rows["tensor_parallel_size"] == 1 and config_key(rows) == config_key(read_rows(new)[0])
    # an old file missing one of its own columns is not upgraded: the version mismatch is named
    broken = tmp_path / "broken.csv"
    broken.write_text(",".join(EXPECTED_COLUMNS_V5[:5]) + "\n" + f"{version},a,b,c,d\n")
    with pytest.raises(ValueError, match=f"schema_version \\[{version}\\]"):
        read_csv(broken)


def test_aggregate_repeats_gives_median_and_spread(tmp_path):
    rows = [row(repeat=i, output_throughput=v) for i, v in enumerate([190.0, 210.0, 200.0])]
    agg = aggregate_repeats(read_csv(write_csv(tmp_path / "r.csv", rows)))
    assert len(agg) == 1 and agg.loc[0, "num_repeats"] == 3
    assert (
        agg.loc[0, "output_throughput"],
        agg.loc[0, "output_throughput_min"],
        agg.loc[0, "output_throughput_max"],
    ) == (200.0, 190.0, 210.0)


def test_planted_regression_fails(tmp_path, baseline):
    assert gate(tmp_path, baseline, [row("continuous", **scale(0.8)), row("static")]) == 1
    rows, regressed = compare(baseline, tmp_path / "new.csv")
    assert regressed
    bad = {(r["config"].split()[-1], r["metric"]) for r in rows if r["status"] == "regressed"}
    assert bad == {("continuous", m) for m in ("request_throughput", "output_throughput", "total_token_throughput")}


def test_noise_inside_tolerance_passes(tmp_path, baseline):
    # throughput -3 % (tolerance 5 %), latencies +8 % (tolerance 10 %)
    assert gate(tmp_path, baseline, [row(b, **scale(0.97, 1.08)) for b in ("continuous", "static")]) == 0


def test_direction_is_respected(tmp_path, baseline):
    # faster and quicker: every change beyond tolerance is an improvement
    assert gate(tmp_path, baseline, [row(b, **scale(1.3, 0.7)) for b in ("continuous", "static")]) == 0
    rows, _ = compare(baseline, tmp_path / "new.csv")
    assert {r["status"] for r in rows if r["metric"] != "request_goodput"} == {"improved"}
    assert {r["status"] for r in rows if r["metric"] == "request_goodput"} == {"n/a"}  # no SLO given
    # latency up 20 % is a regression even though the same number up on a throughput would not be
    assert gate(tmp_path, baseline, [row("continuous", **scale(1.0, 1.2)), row("static")]) == 1
    rows, _ = compare(baseline, tmp_path / "new.csv")
    assert {r["metric"] for r in rows if r["status"] == "regressed"} == {
        f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")
    }


def test_repeats_are_compared_by_median(tmp_path, baseline):
    # one slow repeat of three does not move the median
    rows = [row("continuous", i, **scale(f)) for i, f in enumerate([0.5, 1.0, 1.01])] + [row("static")]
    assert gate(tmp_path, baseline, rows) == 0


def test_missing_and_new_configs_are_reported(tmp_path, baseline):
    assert gate(tmp_path, baseline, [row("continuous"), row("none")]) == 1
    rows, _ = compare(baseline, tmp_path / "new.csv")
    assert {(r["config"].split()[-1], r["status"]) for r in rows if r["metric"] == ""} == {
        ("static", "missing in new"),
        ("none", "new config"),
    }
    assert gate(tmp_path, baseline, [row("continuous"), row("none")], fail_on_missing=False) == 0


def test_workload_params_are_part_of_the_config(tmp_path, baseline):
    assert gate(tmp_path, baseline, [row("continuous", input_len=16), row("static")]) == 1
    rows, _ = compare(baseline, tmp_path / "new.csv")
    assert {(r["config"], r["status"]) for r in rows if r["metric"] == ""} == {
        ("refengine fixed continuous input_len=8", "missing in new"),
        ("refengine fixed continuous input_len=16", "new config"),
    }


def test_tolerance_overrides(tmp_path, baseline):
    new_rows = [row(b, **scale(0.93)) for b in ("continuous", "static")]  # -7 %: beyond 5 %
    assert gate(tmp_path, baseline, new_rows) == 1
    assert gate(tmp_path, baseline, new_rows, tolerance_overrides=parse_tolerances(["*_throughput=10%"])) == 0
    assert parse_tolerances(["p99_ttft_ms=0.2", "mean_itl_ms=off"]) == {"p99_ttft_ms": 0.2, "mean_itl_ms": None}
    tol = resolve_tolerances({"mean_itl_ms": None, "mean_queue_ms": 0.3})
    assert "mean_itl_ms" not in tol and tol["mean_queue_ms"] == 0.3
    with pytest.raises(ValueError, match="direction"):
        resolve_tolerances({"completed": 0.1})


def test_unreadable_input_exits_2(tmp_path, baseline):
    assert gate(tmp_path, tmp_path / "absent.csv", [row()]) == 2
    rows, regressed = compare(baseline, baseline)
    assert not regressed and {r["status"] for r in rows} == {"ok", "n/a"}
    console = Console(width=80, record=True, file=open(tmp_path / "table.txt", "w"))
    console.print(render_table(rows))
    text = console.export_text()
    assert "p99_ttft_ms" in text and "refengine fixed static" in text


def test_run_json_is_strict_json(tmp_path):
    w = get_workload("fixed", num_prompts=2, seed=0, input_len=4, output_len=2)
    env = environment_info("cpu")
    assert {"git_sha", "torch_version", "triton_version", "device", "python"} <= set(env)
    path = write_run_json(
        tmp_path / "run.json",
        config={"device": "cpu", **KNOBS},
        rows=[row()],
        records=[{"request_id": "r0", "ttft": math.nan}],
        workload=w,
        environment=env,
    )
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert doc["workload"]["params"]["request_rate"] == "inf" and doc["records"][0]["ttft"] == "nan"
    assert doc["config"]["max_num_seqs"] == 8 and doc["environment"]["device"] == "cpu"
