"""The project's measurements of itself, beside the product as asv keeps its benchmarks beside asv: the GPU check's
runs and the gate's power campaigns, the simulator's calibration and validation drivers, the HTTP client's and
server's overheads, the engine's launch counts, step floor and stop-list cost, and the fake OpenAI server the
client is measured (and tested) against. No `cbbench` command runs any of it, so none of it ships in the wheel
(pyproject.toml packages only refengine and cbbench); each is run from the repository's root as
`python -m benchmarks.<name>`. What a user's command runs, `cbbench bench-*`, `kernels` and `sim validate`
included, stays in cbbench/perf (docs/architecture.md, "The harness and its self-measurement")."""
