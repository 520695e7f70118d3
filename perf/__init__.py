"""cbbench.perf: the perf suite (imported as `cbbench.perf`, never as a bare `perf`).

Code map: `cli.py` (the `cbbench` typer app), `perf_cmd.py` (`cbbench perf`: options, sweep, outputs),
`runner.py` (one workload through refengine for one batching mode), `peers.py` (Hugging Face static `generate`,
transformers' continuous batching), `report.py` (the terminal table and ratios), `metrics.py` (vLLM-named metrics),
`results.py` (CSV schema, JSON), `compare.py` (the regression gate), `timeline.py` (the slot Gantt chart),
`plot.py` (TTFT / throughput against a swept knob), `bench_scheduler.py` (scheduler
cost per step), `kernel_bench.py` (attention kernels against the HBM floor), `knobs.py` (the engine-knob options,
generated from the config fields); `tests/` holds the perf tool's own tests.
"""
