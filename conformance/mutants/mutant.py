"""What a mutant is, the files they patch, and the fast suite subsets (by area) that should kill them."""

from __future__ import annotations

from dataclasses import dataclass

SCHED = "refengine/scheduler/scheduler.py"
PREEMPTION = "refengine/scheduler/preemption.py"
BATCHING = "refengine/scheduler/batching.py"
POOL = "refengine/kv_cache/block_pool.py"
KV = "refengine/kv_cache/kv_cache_manager.py"
QUEUE = "refengine/scheduler/request_queue.py"
RUNNER = "refengine/worker/model_runner.py"
INPUT_BATCH = "refengine/worker/input_batch.py"  # the runner's persistent rows (tokens, sampling params, banned ids)
SAMPLING_INPUTS = "refengine/worker/sampling_inputs.py"  # the runner's per-step sampling tensors
SAMPLER = "refengine/sample/sampler.py"
DETOK = "refengine/engine/detokenizer.py"
OUTPUT = "refengine/engine/output_processor.py"
ENGINE = "refengine/engine/llm_engine.py"
# the HTML report's Python-drawn charts (through perf -> cbbench/perf where that is a link)
TIMELINE = "perf/report/timeline.py"  # the slot timeline's cells: which request holds which slot at each step
TIMELINE_SVG = "perf/report/timeline_svg.py"  # the slot timeline, drawn
FRONTIER_SVG = "perf/report/frontier_svg.py"  # the capacity plan's throughput-per-GPU against latency chart
SERVER_SERIES = "perf/report/server_series.py"  # an HTTP run's scraped /metrics over time

# The fast subsets, by area: each is quick (seconds to a minute here) and run with -x.
# (the stateful Hypothesis machine, test_scheduler_stateful.py, is left out: minutes per run; the recorded traces
# come first because they are the fastest to fail)
SCHED_TESTS = [
    "conformance/test_recorded_traces.py",
    "conformance/test_scheduler_examples.py",
    "refengine/tests/test_async_scheduling.py",
]
# priority scheduling one rule at a time first (seconds), then the scheduler's area
PRIORITY_TESTS = ["conformance/test_priority_scheduling.py", *SCHED_TESTS]
RUNNER_TESTS = [
    "refengine/tests/test_model_runner.py",
    "refengine/tests/test_model_runner_transfers.py",
    "refengine/tests/test_engine_behaviour.py",
]
SAMPLER_TESTS = ["refengine/tests/test_sampler.py", "refengine/tests/test_penalties.py"]
OUTPUT_TESTS = [
    "refengine/tests/test_detokenizer.py",
    "refengine/tests/test_output_kind.py",
    "refengine/tests/test_engine_behaviour.py",
]
# greedy tokens against Hugging Face generate on the same weights: what sees a KV cache written to the wrong slots
# (the engine's own tests compare the engine with itself)
HF_TESTS = ["refengine/tests/test_engine_hf.py"]
# the tests written for the mutants that the area subsets let survive (docs/mutation.md says which)
KILL_TESTS = ["conformance/test_mutation_kills.py"]
# what a random-weight model's greedy tokens do not show: the KV a step attends to (each sampled step's logits
# against a dense forward), the tokens a re-prefill samples, EOS under min_tokens with a model that prefers it
# the scheduler's statistics (SchedulerStats: prefix-cache queries and hits, first admissions apart from readmissions)
STATS_TESTS = ["refengine/tests/test_interfaces.py"]
# the report's figures against the step records they are drawn from (geometry first: it is the fast one)
REPORT_TESTS = [
    "perf/tests/test_timeline_geometry.py",
    "perf/tests/test_report_figure_geometry.py",
    "perf/tests/test_step_stats.py",
    "perf/tests/test_html_report.py",
]
# The adapters (conformance/adapters/): a bug there changes only the runs against that engine, which the default
# suite (refengine) never makes. Their mutants run the engine's conformance run (`--engine NAME`) in the environment
# that has the engine: transformers is in the project's own; vLLM in ci/setup_vllm_env.sh's .venv-vllm, SGLang in
# ci/setup_sglang_env.sh's .venv-sglang.
TF_ADAPTER = "conformance/adapters/transformers_adapter.py"
VLLM_ADAPTER = "conformance/adapters/vllm_adapter.py"
VLLM_PYTHON = ".venv-vllm/bin/python"
SGLANG_ADAPTER = "conformance/adapters/sglang_adapter.py"
SGLANG_PYTHON = ".venv-sglang/bin/python"
# (the state machine is left out: minutes a run; the examples and the adapter's own cases come first)
TF_ENGINE_TESTS = [
    "conformance/test_transformers_adapter.py",
    "conformance/test_scheduler_examples.py",
    "--engine",
    "transformers",
]
VLLM_ENGINE_TESTS = [
    "conformance/test_scheduler_examples.py",
    "conformance/test_recorded_traces.py",
    "conformance/test_priority_scheduling.py",
    "--engine",
    "vllm",
]
# (SGLang's examples mostly skip or expect a known difference, which a wrong view fails as surely: the state machine,
# whose universal invariants read every view at every step, is what judges its adapter)
SGLANG_ENGINE_TESTS = [
    "conformance/test_sglang_adapter.py",
    "conformance/test_scheduler_stateful.py",
    "conformance/test_scheduler_examples.py",
    "conformance/test_priority_scheduling.py",
    "--engine",
    "sglang",
]
KV_BEHAVIOUR_TESTS = [
    "refengine/tests/test_prefix_cache_partial_blocks.py",
    "refengine/tests/test_swap_partial_block.py",
    "refengine/tests/test_min_tokens_eos_preferred.py",
    "refengine/tests/test_recompute_reprefill.py",
    "refengine/tests/test_dense_logits.py",
]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str  # the bug, in words
    # argued in docs/mutation.md to change no behaviour the engine can reach: its survival does not fail the run
    equivalent: bool = False
    # the interpreter that runs its subset, relative to the repository ("": the tool's own); an engine's environment
    # for an adapter's mutant. Where it is missing the mutant is "unavailable": neither killed nor survived.
    python: str = ""


def mutant(
    name: str, path: str, old: str, new: str, tests: list[str], what: str, *, equivalent: bool = False, python: str = ""
) -> Mutant:
    return Mutant(name, path, old, new, tuple(tests), what, equivalent, python)
