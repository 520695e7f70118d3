"""The results CSV's columns, in their order, and the schema version that names that order.

`schema_version` is the first column and changes whenever a column is added, removed or renamed, so `compare`
never matches columns by accident. A configuration is `CONFIG_KEY_COLUMNS` plus the workload's params
(`KEY_NAMES`); the metrics are `METRIC_COLUMNS`.
"""

from __future__ import annotations

from perf.metrics import stat_keys

SCHEMA_VERSION = 2

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
    "git_sha",
    "timestamp",
    "command",
    "run_options",
    "extra",
)
KEY_NAMES = (*CONFIG_KEY_COLUMNS, "workload_params")
