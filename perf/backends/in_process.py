"""Replays a workload through one engine configuration and returns what `compute_metrics` needs.

`run_refengine` drives `refengine.LLMEngine` for one batching mode and knob set; the peers (Hugging Face static
`generate`, transformers' continuous batching) live in `peers.py` and return the same `RunResult`.

Replay rules, the same for every engine so the rows compare:
- every request is greedy (temperature 0), `ignore_eos`, and generates exactly its own `output_len` tokens;
- offline workloads (every arrival 0) add all requests at t0; Poisson / gamma arrivals add each request when its
  time comes (its `arrival_time` is t0 + the workload's offset), stepping the engine meanwhile;
- the run is timed from the first add (t0) to the last finish; a warm-up of a few short synthetic requests runs
  first, on the same engine, and is left out of every record and step;
- times are `time.monotonic()` (the engine's clock).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cbbench.perf.knobs import engine_knobs, knob_names

# Synthetic warm-up prompts: short, and drawn far from the workloads' token ids so they never seed the prefix cache
WARMUP_PROMPT_LEN = 16
WARMUP_OUTPUT_LEN = 4
_WARMUP_TOKEN_RANGE = (50_000, 60_000)

# the knobs a configuration may set (batching is a run's own column); generated from the config fields
SWEEP_KNOBS = knob_names(exclude=("batching",))

ProgressFn = Callable[[int], None]  # called with the number of requests that finished since the last call


@dataclass
class RunResult:
    """One measured run of one configuration (`error` set, and nothing else, when it could not run)."""

    engine: str                          # "refengine" | "hf-static" | "hf-cb"
    batching: str
    knobs: dict[str, Any]                # the knobs that define this configuration (CSV config columns)
    records: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    duration: float = math.nan
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks: int | None = None
    error: str | None = None

    def metrics(self, *, metric_percentiles: Sequence[float], goodput: Mapping[str, float] | None) -> dict[str, Any]:
        from cbbench.perf.metrics import compute_metrics

        return compute_metrics(self.records, self.duration, steps=self.steps, max_num_seqs=self.max_num_seqs,
                               max_num_batched_tokens=self.max_num_batched_tokens,
                               num_gpu_blocks=self.num_gpu_blocks, metric_percentiles=metric_percentiles,
                               goodput=goodput)


def warmup_prompts(n: int, seed: int) -> list[list[int]]:
    """Prompts of 1-4 x WARMUP_PROMPT_LEN tokens: with staggered output lengths (WARMUP_OUTPUT_LEN + i) the warm-up
    meets every decode batch size from n down to 1 and several prefill shapes, so that the first measured run does
    not pay for first-use kernel selection (measured here: without it, whichever mode ran first was ~10% slower)."""
    rng = np.random.default_rng(seed + 7919)
    return [rng.integers(*_WARMUP_TOKEN_RANGE, size=WARMUP_PROMPT_LEN * (1 + i % 4)).tolist() for i in range(n)]


def warmup_lengths(n: int, seed: int) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of each warm-up request, for the checks made before a sweep runs."""
    return [(len(p), WARMUP_OUTPUT_LEN + i) for i, p in enumerate(warmup_prompts(n, seed))]


def engine_kwargs(*, device: str, dtype: str | None, seed: int, batching: str,
                  knobs: Mapping[str, Any]) -> dict[str, Any]:
    """LLMEngine keyword arguments for one configuration (None knobs are left to the engine's defaults)."""
    kw = {k: v for k, v in knobs.items() if v is not None}
    # stats_log_size=None: keep every step's stats (the engine keeps only the newest by default)
    return {"device": device, "dtype": dtype, "seed": seed, "batching": batching, "stats_log_size": None, **kw}


def step_dicts(step_stats: Sequence[Any]) -> list[dict[str, Any]]:
    """StepStats -> the step dicts of `perf.metrics`.

    Static batching (steps whose requests carry a batch id): a batch holds all its slots from the step it is
    admitted until its last member finishes, while only the members scheduled in a step produce work; so
    `slots_held` is the batch's size and `num_running` counts the scheduled members only (what `slot_waste`
    divides by).

    Each step also keeps who held a slot (`scheduled_req_ids`, `running_req_ids`, `prefill_req_ids`, and the static
    `batch_id` shared by all its requests, or None), so that `cbbench report` can draw the slot timeline from the
    JSON alone.
    """
    batch_size: dict[int, set[str]] = {}
    for s in step_stats:
        for rid, b in s.batch_ids.items():
            if b is not None:
                batch_size.setdefault(b, set()).add(rid)
    out: list[dict[str, Any]] = []
    for s in step_stats:
        d = {"time": s.time, "num_scheduled_tokens": s.num_scheduled_tokens, "num_running": s.num_running,
             "num_waiting": s.num_waiting, "num_prefill_tokens": s.num_prefill_tokens,
             "num_decode_tokens": s.num_decode_tokens, "kv_blocks_used": s.kv_blocks_used,
             "num_preempted": s.num_preempted, "slots_held": None,
             "scheduled_req_ids": list(s.scheduled_req_ids), "running_req_ids": list(s.running_req_ids),
             "prefill_req_ids": list(s.prefill_req_ids), "batch_id": None}
        batches = {b for b in s.batch_ids.values() if b is not None}
        if len(batches) == 1:  # static batching runs one batch at a time
            d["batch_id"] = next(iter(batches))
        if batches:
            d["slots_held"] = sum(len(batch_size[b]) for b in batches)
            d["num_running"] = len(s.scheduled_req_ids)
        out.append(d)
    return out


def _wait_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def run_refengine(workload: Any, *, model: str, device: str, dtype: str | None, seed: int, batching: str,
                  knobs: Mapping[str, Any], warmup: int = 8, progress: ProgressFn | None = None,
                  max_concurrency: int | None = None) -> RunResult:
    """Run `workload` through a fresh LLMEngine for one batching mode and knob set.

    `max_concurrency` caps the requests in flight as `vllm bench serve --max-concurrency` does: a request that is
    due while the cap is full is added when a slot frees, and its arrival (TTFT's start) is that moment."""
    from refengine import LLMEngine, SamplingParams

    engine = LLMEngine(model, **engine_kwargs(device=device, dtype=dtype, seed=seed, batching=batching, knobs=knobs))
    sc = engine.scheduler.config
    result = RunResult("refengine", batching, dict(knobs), max_num_seqs=sc.max_num_seqs,
                       max_num_batched_tokens=sc.max_num_batched_tokens, num_gpu_blocks=sc.num_gpu_blocks)
    result.knobs.update({k.name: getattr(sc, k.name) for k in engine_knobs()
                         if k.source == "SchedulerConfig" and k.name in SWEEP_KNOBS})
    result.knobs["attention_backend"] = engine.attention_backend

    from refengine.sampling_params import RequestOutputKind

    def params(n: int) -> SamplingParams:  # (only finished outputs are read: FINAL_ONLY, as vLLM's offline runs)
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)

    for i, prompt in enumerate(warmup_prompts(warmup, seed)):
        engine.add_request(f"warmup-{i}", prompt, params(WARMUP_OUTPUT_LEN + i))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step_stats.clear()
    engine.finished_requests.clear()

    reqs = list(enumerate(workload.requests))
    reqs.sort(key=lambda x: x[1].arrival_time)  # stable: arrival order, then workload order
    records: list[dict[str, Any]] = []
    cap = max_concurrency or len(reqs)
    t0 = time.monotonic()
    nxt, slot_freed = 0, t0
    while nxt < len(reqs) or engine.has_unfinished_requests():
        now = time.monotonic()
        while nxt < len(reqs) and t0 + reqs[nxt][1].arrival_time <= now and nxt - len(records) < cap:
            i, r = reqs[nxt]
            engine.add_request(str(i), r.prompt_token_ids, params(r.output_len),
                               arrival_time=max(t0 + r.arrival_time, slot_freed))
            nxt += 1
        if not engine.has_unfinished_requests():
            _wait_until(t0 + reqs[nxt][1].arrival_time)
            continue
        done = [o.metrics for o in engine.step() if o.finished]
        if done and nxt - len(records) >= cap:
            slot_freed = time.monotonic()
        records.extend(done)
        if progress and done:
            progress(len(done))
    result.records = sorted(records, key=lambda r: int(r["request_id"]))
    result.duration = max(r["finish_time"] for r in records) - t0
    result.steps = step_dicts(engine.step_stats)
    return result
