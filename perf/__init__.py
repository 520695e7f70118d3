"""cbbench.perf: the perf suite (imported as `cbbench.perf`, never as a bare `perf`).

Code map: `cli/` (the `cbbench` typer commands, thin), `sweep.py` (`cbbench perf`: plan -> run -> write),
`plan/` (the options, load points, checks, and the typed `RunPlan` of `RunSpec`s), `backends/` (one `Backend` per
engine or server, registered by name: refengine in process, hf-static, hf-cb, openai, openai-chat), `records.py`
(`RequestRecord`, `StepRecord`), `metrics.py` (vLLM-named metrics from records), `results/` (CSV / JSON schema,
writer, `--like`, compare, gate, tolerances), `report/` (terminal table, plots, HTML report, slot timeline),
`bench/` (micro-benchmarks: step, scheduler, sampler, async, kernels, HTTP overhead), `knobs.py` (the engine-knob
options, generated from the config fields); `tests/` holds the perf tool's own tests.
"""
