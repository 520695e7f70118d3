"""The results CSV's columns, in their order, and the schema version that names that order.

`schema_version` is the first column and changes whenever a column is added, removed or renamed, so `compare`
never matches columns by accident. A configuration is `CONFIG_KEY_COLUMNS` plus the workload's params
(`KEY_NAMES`); the metrics are `METRIC_COLUMNS`. A row's cells are typed as `ResultRow` says (`Cell`, `Empty`).
"""

from __future__ import annotations

from typing import TypedDict

from cbbench.perf.client_lag import CLIENT_COLUMNS
from cbbench.perf.metrics import stat_keys
from cbbench.perf.steady_state import NOTE_COLUMN, STEADY_COLUMNS

SCHEMA_VERSION = 5

CONFIG_KEY_COLUMNS = (
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
    "tensor_parallel_size",  # schema 3
    # schema 4: which side of an A/B gate ran the row ("base" | "head"; empty for any other run), so that the same
    # configuration measured on two trees stays two configurations for every reader that groups rows
    "arm",
)
THROUGHPUT_COLUMNS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
# Every run stores this dense set of latency percentiles whatever `--metric-percentiles` asks to show, so a gate can
# check any of them (other percentiles go into `extra`, and `compare` reads them from there too).
STORED_PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9)
LATENCY_COLUMNS = tuple(k for m in ("ttft", "tpot", "itl", "e2el", "queue") for k in stat_keys(m, STORED_PERCENTILES))
ENGINE_COLUMNS = (
    "num_preemptions",
    "recomputed_tokens",
    "peak_kv_blocks",
    "peak_kv_usage",
    "prefix_cache_hit_rate",
    "mean_slot_utilisation",
    "mean_token_budget_utilisation",
    "slot_waste",
    "num_steps",
)
METRIC_COLUMNS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    *THROUGHPUT_COLUMNS,
    *LATENCY_COLUMNS,
    *ENGINE_COLUMNS,
    # schema 5: the client's schedule delay and achieved rate (client_lag.py), the steady-state window's figures
    # (steady_state.py)
    *CLIENT_COLUMNS,
    *STEADY_COLUMNS,
)
# label: a name for the run (`--label`), not part of the configuration; command: the `cbbench perf` command line
# (options given explicitly); run_options: JSON of what shaped the run without defining its configuration
# (warm-up, threads, and the plan entry that `--resume` matches on).
COLUMNS = (
    "schema_version",
    "label",
    *CONFIG_KEY_COLUMNS,
    "repeat",
    "workload_params",
    *METRIC_COLUMNS,
    NOTE_COLUMN,  # schema 5: why a run has no steady-state figures (text, so not a metric); empty when it has them
    "git_sha",
    "timestamp",
    "command",
    "run_options",
    "extra",
)
KEY_NAMES = (*CONFIG_KEY_COLUMNS, "workload_params")

# Older files read as this version: each upgrade names the columns added since that version and the value every old
# row had in them (schema 2 predates tensor parallelism: every run was on one GPU; schema 3 predates `cbbench gate`:
# no run belonged to an arm).
# schema 4 predates the client's and the steady-state figures: not measured, empty cells.
_V5 = dict.fromkeys((*CLIENT_COLUMNS, *STEADY_COLUMNS, NOTE_COLUMN), "")
UPGRADES: dict[int, dict[str, str]] = {
    4: _V5,
    3: {"arm": "", **_V5},
    2: {"tensor_parallel_size": "1", "arm": "", **_V5},
}


def upgrade_lines(lines: list[list[str]]) -> list[list[str]] | None:
    """An older schema's file (header + lines) as this version's: the added columns filled with their old value and
    `schema_version` set to SCHEMA_VERSION; None if the header is not exactly an older version's."""
    header = tuple(lines[0])
    for version, added in UPGRADES.items():
        if header != tuple(c for c in COLUMNS if c not in added):
            continue
        at = sorted((i, added[c]) for i, c in enumerate(COLUMNS) if c in added)
        out = [list(COLUMNS)]
        for cells in lines[1:]:
            cells = list(cells)
            if cells and cells[0] == str(version):
                cells[0] = str(SCHEMA_VERSION)
            for i, value in at:
                cells.insert(i, value)
            out.append(cells)
        return out
    return None


# One cell of a results row: as `schema.make_row` made it (None where nothing was measured or known), as
# `rows.read_rows` reads it back (each column typed as pandas types it: whole numbers as ints, an empty cell NaN), or
# the text written in the file (the rows `--resume` keeps as they were written).
Cell = str | int | float | bool | None
# An empty cell: None in a row just made, NaN (a float) once read back.
Empty = float | None


class ResultRow(TypedDict):
    """One row of a results CSV: its cells other than the metrics, by name, typed as `make_row` makes them and
    `read_rows` reads them back (an empty cell is `Empty`; a number column pandas reads as floats holds floats). The
    metric columns (METRIC_COLUMNS, and any percentile in `extra`) hold numbers, read by name with `rows.number`."""

    schema_version: int
    label: str | Empty
    engine: str
    model: str
    device: str
    dtype: str | Empty
    workload: str
    num_prompts: float | None
    seed: float | None
    request_rate: float | None
    burstiness: float | None
    batching: str | Empty
    max_num_seqs: float | None
    max_num_batched_tokens: float | None
    block_size: float | None
    num_gpu_blocks: float | None
    num_cpu_blocks: float | None
    enable_chunked_prefill: bool | Empty
    long_prefill_token_threshold: float | None
    enable_prefix_caching: bool | Empty
    preemption_mode: str | Empty
    policy: str | Empty
    priority_preemption: bool | Empty
    attention_backend: str | Empty
    tensor_parallel_size: float | None
    arm: str | Empty
    repeat: int
    workload_params: str  # JSON: the workload's parameters
    steady_state_note: str | Empty
    git_sha: str | Empty
    timestamp: str | Empty
    command: str | Empty
    run_options: str | Empty  # JSON: what shaped the run without defining its configuration (plan_id, warmup, ...)
    extra: str | Empty  # JSON: the metrics that are not columns
