"""Replays a workload through one engine configuration and returns what `compute_metrics` needs.

`run_refengine` drives `refengine.LLMEngine` for one batching mode and knob set, made of the run's `EngineArgs` (the
plan built, and so checked, them once: `EngineKnobs.engine_args`); `RefengineBackend` is it registered
as the "refengine" backend. The peers (Hugging Face static `generate`, transformers' continuous batching) are
hf.py's and return the same `RunResult`.

Replay rules, the same for every engine so the rows compare:
- every request is greedy (temperature 0), `ignore_eos`, and generates exactly its own `output_len` tokens;
- offline workloads (every arrival 0) add all requests at t0; Poisson / gamma arrivals add each request when its
  time comes (its `arrival_time` is t0 + the workload's offset), stepping the engine meanwhile;
- a multi-turn workload's turn k is added when turn k - 1 has finished, its prompt the conversation so far with the
  answers' own token ids (`conversations.TurnFeeder`); its records carry `conversation_id` and `turn`;
- the run is timed from the first add (t0) to the last finish; a warm-up of a few short synthetic requests runs
  first, on the same engine, and is left out of every record and step;
- times are the engine's clock (`engine.clock`): `time.monotonic()` on a real device, simulated GPU seconds on a
  `sim:<gpu>` device, where waiting for an arrival jumps the virtual clock instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cbbench.perf.backends.backend import WARMUP_OUTPUT_LEN, Backend, ProgressFn, RunResult, warmup_prompts
from cbbench.perf.backends.conversations import TurnFeeder, tag_record
from cbbench.perf.knobs import EngineKnobs, engine_knobs, knob_names
from cbbench.perf.plan.declared import RUN
from cbbench.perf.records import ENGINE_REQUEST_KEYS, ENGINE_STEP_KEYS, RequestRecord, StepRecord
from refengine.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from cbbench.perf.plan.spec import RunSpec
    from cbbench.workloads.workload import Workload, WorkloadRequest
    from refengine import LLMEngine
    from refengine.engine.engine_args import EngineArgs
    from refengine.engine.step_stats import StepStats

# the knobs a configuration may set (batching is a run's own column); generated from the config fields
SWEEP_KNOBS = knob_names(exclude=("batching",))


def step_records(step_stats: Sequence[StepStats]) -> list[StepRecord]:
    """The engine's StepStats -> `StepRecord`s.

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
    out: list[StepRecord] = []
    for s in step_stats:
        d = StepRecord(
            s.time,
            s.num_scheduled_tokens,
            s.num_running,
            s.num_waiting,
            s.num_prefill_tokens,
            s.num_decode_tokens,
            s.kv_blocks_used,
            num_preempted=s.num_preempted,
            scheduled_req_ids=list(s.scheduled_req_ids),
            running_req_ids=list(s.running_req_ids),
            prefill_req_ids=list(s.prefill_req_ids),
            cuda_graph=s.cuda_graph,
            layout=ENGINE_STEP_KEYS,
        )
        batches = {b for b in s.batch_ids.values() if b is not None}
        if len(batches) == 1:  # static batching runs one batch at a time
            d.batch_id = next(iter(batches))
        if batches:
            d.slots_held = sum(len(batch_size[b]) for b in batches)
            d.num_running = len(s.scheduled_req_ids)
        out.append(d)
    return out


def run_refengine(
    workload: Workload,
    *,
    engine_args: EngineArgs,
    knobs: EngineKnobs,
    warmup: int = RUN.warmup.default,
    progress: ProgressFn | None = None,
    max_concurrency: int | None = None,
) -> RunResult:
    """Run `workload` through a fresh LLMEngine of `engine_args` (`knobs.engine_args(...)`: the configuration's
    batching mode and `knobs`, whose order names the run's knobs in its result).

    `max_concurrency` caps the requests in flight as `vllm bench serve --max-concurrency` does: a request that is
    due while the cap is full is added when a slot frees, and its arrival (TTFT's start) is that moment."""
    from refengine.engine.llm_engine import LLMEngine  # (loads torch: `perf --dry-run` imports the backends)

    # shut down when the run ends: its device memory goes back before the next configuration's engine sizes its
    # KV cache (`perf --like` runs every configuration of a baseline in this one process)
    with LLMEngine.from_engine_args(engine_args) as e:
        return _run_on(
            e, workload, str(engine_args.config.scheduler.batching), knobs, warmup, progress, max_concurrency
        )


def _run_on(
    engine: LLMEngine,
    workload: Workload,
    batching: str,
    knobs: EngineKnobs,
    warmup: int,
    progress: ProgressFn | None,
    max_concurrency: int | None,
) -> RunResult:
    """run_refengine's run on an engine made for it."""
    sc = engine.scheduler.config
    # the knobs given, then as the engine resolved every scheduler knob, its attention backend and its TP size
    resolved = {
        k.name: getattr(sc, k.name) for k in engine_knobs() if k.source == "SchedulerConfig" and k.name in SWEEP_KNOBS
    }
    result = RunResult(
        "refengine",
        batching,
        EngineKnobs.of(
            {
                **knobs.given(),
                **resolved,
                "attention_backend": engine.attention_backend,
                "tensor_parallel_size": engine.config.tensor_parallel_size,
            }
        ),
    )

    def params(n: int) -> SamplingParams:  # (only finished outputs are read: FINAL_ONLY, as vLLM's offline runs)
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)

    for i, prompt in enumerate(warmup_prompts(warmup, engine.config.seed, engine.model_config.vocab_size)):
        engine.add_request(f"warmup-{i}", prompt, params(WARMUP_OUTPUT_LEN + i))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step_stats.clear()
    engine.finished_requests.clear()

    records, t0 = _replay(engine, workload.requests, params, max_concurrency, progress)
    result.records = sorted(records, key=lambda r: int(r.request_id))
    result.duration = max(r.finish_time for r in records if r.finish_time is not None) - t0
    result.steps = step_records(engine.step_stats)
    return result


def _replay(
    engine: LLMEngine,
    requests: Sequence[WorkloadRequest],
    params: Callable[[int], SamplingParams],
    max_concurrency: int | None,
    progress: ProgressFn | None,
) -> tuple[list[RequestRecord], float]:
    """Add each request when it is due (`TurnFeeder`: its arrival, or a conversation's previous answer), under the
    concurrency cap, stepping the engine meanwhile; the records of every request, in finishing order, and t0."""
    feeder = TurnFeeder(requests)
    records: list[RequestRecord] = []
    cap = max_concurrency or len(requests)
    clock = engine.clock  # every time below is the engine's, so a simulated run's are all virtual
    t0 = clock.now()
    in_flight, slot_freed = 0, t0
    if progress:
        progress(0)  # the measured run starts: the engine is built and warmed up
    while len(records) < len(requests):
        now = clock.now()
        while in_flight < cap and (due := feeder.pop_due(now - t0)) is not None:
            i, at = due
            engine.add_request(
                str(i), feeder.prompt_ids(i), params(requests[i].output_len), arrival_time=max(t0 + at, slot_freed)
            )
            in_flight += 1
        if not engine.has_unfinished_requests():
            due_at = feeder.next_due()
            if due_at is None:  # nothing running and nothing to come: a request the engine never finished
                break
            clock.sleep_until(t0 + due_at)
            continue
        outs = [o for o in engine.step() if o.finished]
        now = clock.now()
        for o in outs:  # the answer's own token ids are the next turn's history
            feeder.finished(int(o.request_id), now - t0, o.outputs[0].token_ids if o.outputs else ())
        # the engine's per-request dict (`output_processor.request_metrics`) becomes a record here, at perf's edge
        done = [
            tag_record(RequestRecord.from_dict(o.metrics, ENGINE_REQUEST_KEYS), requests[int(o.request_id)])
            for o in outs
        ]
        if done and in_flight >= cap:
            slot_freed = now
        in_flight -= len(done)
        records.extend(done)
        if progress and done:
            progress(len(done), done)
    return records, t0


@Backend.register("refengine", kind="engine")
class RefengineBackend(Backend):
    """refengine's `LLMEngine`, in this process: one fresh engine per run."""

    def run(self, spec: RunSpec, progress: ProgressFn | None = None) -> RunResult:
        assert spec.engine_args is not None, "the plan makes an in-process run's EngineArgs"
        return run_refengine(
            spec.workload,
            engine_args=spec.engine_args,
            knobs=spec.knobs,
            warmup=self.settings.warmup,
            progress=progress,
            max_concurrency=spec.load.max_concurrency,
        )
