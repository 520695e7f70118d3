"""LLMEngine: add_request / step / abort_request over the scheduler, the model runner and the output processor.

Each step(): schedule -> forward + sample -> update_from_output (EOS, stop ids, length) -> the output processor
(incremental outputs: the tokens new since the last step, with per-request timestamps for TTFT / TPOT / ITL) ->
the requests it reports (ended by a stop string, or whose output failed) finished through the scheduler here ->
the step's StepStats. docs/engine.md follows one step hop by hop.
With async_scheduling=True the forward runs in a worker thread and step() schedules and launches step N+1 before
it processes step N's output (refengine/worker/batch_queue.py): outputs come back one step later, tokens are the same.
The model (or `model_impl`), the sampler and the detokenizer factory come in through the constructor, so a
benchmark or a test swaps one without patching. What the engine runs on, a real device or a simulated GPU, is its
Device (`engine.platform`, refengine/worker/device.py), chosen once in the constructor (refengine/engine/platform.py).
Lifetime: shutdown(), the end of a `with` block, or the engine's collection gives its device memory back (the KV
caches, the CUDA graphs, the reference to the weights, then the allocator's cache), so that engines made one
after another in a process each find the memory the last one used.
"""

from __future__ import annotations

import collections
import functools
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

import refengine.sample.sampler as sampler_module
from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.engine.engine_args import EngineArgs, with_resolved
from refengine.engine.output_processor import DetokenizerFactory, OutputProcessor
from refengine.engine.platform import make_device
from refengine.engine.processor import Processor
from refengine.engine.step_stats import StepStats
from refengine.outputs import RequestOutput
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler.scheduler import Scheduler
from refengine.scheduler.scheduler_output import ModelRunnerOutput, SchedulerOutput
from refengine.worker.device import Device, Runner, StepQueue
from refengine.worker.model_runner import Sampler

NewRequest = tuple[Any, ...]  # add_requests' entries: add_request's arguments, the last three optional

logger = logging.getLogger(__name__)

_SHUT_DOWN = "this LLMEngine has been shut down (shutdown(), or the end of its `with` block); create a new one"


class _ReleasedRunner:
    """Stands in for the model runner of a shut-down engine: it holds nothing, and runs nothing."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        raise RuntimeError(f"execute_model(): {_SHUT_DOWN}")


class LLMEngine:
    def __init__(
        self,
        model: str | EngineArgs = "tiny-qwen2",
        *,
        model_impl: torch.nn.Module | None = None,
        sampler: Sampler | None = None,
        detokenizer_factory: DetokenizerFactory | None = None,
        **kwargs: Any,
    ) -> None:
        """`model`: a preset name or a local Hugging Face folder, and `kwargs` the engine knobs (EngineConfig and
        SchedulerConfig fields); or the `EngineArgs` made (and so checked) already, with no knobs beside them
        (`from_engine_args`). `model_impl` replaces the loaded weights with a module of the same interface
        (forward, compute_logits), for `model`'s config; `sampler` and `detokenizer_factory` replace refengine's."""
        if isinstance(model, EngineArgs) and kwargs:
            raise ValueError(f"give the engine knobs in its EngineArgs, not beside them: {sorted(kwargs)}")
        # bad knobs fail here, before a model is loaded
        args = model if isinstance(model, EngineArgs) else EngineArgs.from_kwargs(model, **kwargs)
        cfg = args.config
        # the one place the kind of device is decided (refengine/engine/platform.py): a real one, or device="sim:<gpu>",
        # a simulated GPU (no weights, no forward: a runner on a virtual clock, refengine/sim/)
        self.platform: Device = make_device(cfg, model_impl)
        self.clock = self.platform.clock
        parts = self.platform.parts
        (self.device, self.dtype, self.model, self.attention_backend, self.model_config, self.tokenizer) = parts
        self.device_label = self.platform.label
        mc = self.model_config
        self.max_model_len = mc.max_position_embeddings if cfg.max_model_len is None else cfg.max_model_len
        if not 2 <= self.max_model_len <= mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len must be in [2, {mc.max_position_embeddings}] for this model, got {self.max_model_len}"
            )
        kv_given = args.num_gpu_blocks_given
        num_blocks = (
            cfg.scheduler.num_gpu_blocks
            if kv_given
            else self.platform.num_gpu_blocks(cfg, max_model_len=self.max_model_len)
        )
        self.config = cfg = with_resolved(cfg, max_model_len=self.max_model_len, num_gpu_blocks=num_blocks)
        sc = cfg.scheduler
        # Every running request owns at least one KV block of its own (the one holding its last token is never a
        # prefix-cache hit), so no more than num_gpu_blocks requests ever need an input-batch row at once.
        num_rows = min(sc.max_num_seqs, sc.num_gpu_blocks)
        self.platform.check_memory(cfg, num_rows=num_rows, kv_given=kv_given)
        self.scheduler = Scheduler(sc, eos_token_id=mc.eos_token_id)
        self.scheduler.clock = self.clock.now
        self.model_runner: Runner = self.platform.make_runner(
            cfg, num_rows=num_rows, sampler=sampler or sampler_module.sample
        )
        self._released = False
        self.platform.warm_up(sc.block_size, self.max_model_len)
        self.processor = Processor(self.tokenizer, mc, sc, self.max_model_len)
        self._pending: list[RequestOutput] = []  # outputs of requests aborted between steps
        self.batch_queue: StepQueue | None = (
            self.platform.make_batch_queue(self.model_runner.execute_model) if sc.async_scheduling else None
        )
        # the step function, chosen here once (as vLLM's EngineCore picks step or step_with_batch_queue), so that
        # step() itself never asks which mode it runs in; shutdown() swaps in one that refuses. A function of the
        # engine, not a bound method: that would tie the engine to itself in a cycle, and a dropped engine must go
        # (and stop its worker thread) at once, by reference counting
        self._step: Callable[[LLMEngine], list[RequestOutput]] = (
            LLMEngine._step_sync
            if self.batch_queue is None
            else functools.partial(LLMEngine._step_async, queue=self.batch_queue)
        )
        self._shut_down = False
        # the newest stats_log_size steps and finished requests, for metrics; the caller may clear them
        self.step_stats: collections.deque[StepStats] = collections.deque(maxlen=cfg.stats_log_size)
        self.finished_requests: collections.deque[Request] = collections.deque(maxlen=cfg.stats_log_size)
        self.output_processor = OutputProcessor(
            self.tokenizer, self.finished_requests, detokenizer_factory or IncrementalDetokenizer
        )

    @classmethod
    def from_engine_args(
        cls,
        args: EngineArgs,
        *,
        model_impl: torch.nn.Module | None = None,
        sampler: Sampler | None = None,
        detokenizer_factory: DetokenizerFactory | None = None,
    ) -> LLMEngine:
        """An engine of arguments made (and so checked) already, as vLLM's LLMEngine.from_engine_args: a benchmark
        checks every configuration of its sweep before the first run, then hands each run's arguments on as they
        are. The other arguments are the constructor's."""
        return cls(args, model_impl=model_impl, sampler=sampler, detokenizer_factory=detokenizer_factory)

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict[str, Any],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        """Validate and queue a request; bad input raises ValueError naming the field and changes nothing."""
        self._queue(self._process(request_id, prompt, params, arrival_time, priority))

    def add_requests(self, requests: Sequence[NewRequest]) -> list[Request]:
        """All or nothing: validate every request, then queue them all; on an invalid one raise ValueError naming
        it ("request i: ...") and queue none. Each entry holds add_request's arguments: (request_id, prompt,
        params, arrival_time, priority), the last three optional. Returns the queued requests, in order."""
        built: list[tuple[Request, str | None]] = []
        seen: set[str] = set()
        for i, entry in enumerate(requests):
            try:
                req = self._process(*entry)
                if req[0].request_id in seen:
                    raise ValueError(f"request_id {req[0].request_id!r} is already in use")
            except ValueError as e:
                raise ValueError(f"request {i}: {e}" if len(requests) > 1 else str(e)) from None
            seen.add(req[0].request_id)
            built.append(req)
        for req in built:
            self._queue(req)
        return [req for req, _ in built]

    def _process(
        self,
        request_id: str,
        prompt: str | list[int] | dict[str, Any],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> tuple[Request, str | None]:
        """Build the request without queuing it."""
        if self._shut_down:
            raise RuntimeError(f"add_request(): {_SHUT_DOWN}")
        if isinstance(request_id, str) and (
            request_id in self.scheduler.requests
            or request_id in self.output_processor
            or (self.batch_queue is not None and self.batch_queue.holds(request_id))
        ):
            raise ValueError(f"request_id {request_id!r} is already in use")
        arrival_time = self.clock.now() if arrival_time is None else arrival_time
        return self.processor.process(request_id, prompt, params, arrival_time, priority)

    def _queue(self, built: tuple[Request, str | None]) -> None:
        req, prompt_text = built
        self.scheduler.add_request(req)
        self.output_processor.add_request(req, prompt_text)

    def abort_request(self, request_id: str | list[str]) -> None:
        """Abort requests by id (unknown or finished ids are ignored, as in vLLM); their final outputs, finish_reason
        "abort", come from the next step()."""
        if isinstance(request_id, str):
            ids = [request_id]
        elif isinstance(request_id, (list, tuple, set, frozenset)) and all(isinstance(r, str) for r in request_id):
            ids = list(request_id)
        else:
            raise ValueError(f"request_id must be a string or a list of strings, got {request_id!r}")
        for rid in ids:
            req = self.scheduler.requests.get(rid)
            if req is None:
                continue
            self.scheduler.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
            self._pending.append(self.output_processor.output_of(req))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's LLMEngine.reset_prefix_cache() (its default, running requests left
        alone): True once done; False, nothing changed, while a request still holds KV blocks (one running, or
        a step in flight under async scheduling). Call it from the thread that steps the engine."""
        if self._shut_down:
            raise RuntimeError(f"reset_prefix_cache(): {_SHUT_DOWN}")
        return self.scheduler.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending) or bool(self.batch_queue)

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    # ---- lifetime -------------------------------------------------------------------------------------------
    def shutdown(self) -> list[RequestOutput]:
        """Stop the engine (idempotent; call it from the thread that steps it). The steps in flight are waited for
        and processed, so the tokens their forwards sampled are kept; then every unfinished request is aborted
        (finish_reason "abort", `error` saying why, its KV blocks freed) and the async worker thread exits; then its
        device memory goes back (`_release`). Returns those last outputs, as step() would have; later step() /
        add_request() calls raise RuntimeError."""
        if self._shut_down:
            return []
        outputs, self._pending = self._pending, []
        try:
            while self.batch_queue:  # drain, as step() does once nothing is left to schedule
                outputs += self._process_step(self.batch_queue.oldest(), self.batch_queue.collect)
            unfinished = list(self.scheduler.requests.values())
            if unfinished:
                logger.warning("shutdown: aborting %d unfinished request(s)", len(unfinished))
            for req in unfinished:
                req.error = req.error or "aborted: the engine was shut down"
            self.abort_request([req.request_id for req in unfinished])
            outputs, self._pending = outputs + self._pending, []
        finally:
            self._shut_down = True
            self._step = LLMEngine._step_shut_down
            if self.batch_queue is not None:
                self.batch_queue.shutdown()
            self._release()
        return outputs

    def _release(self) -> None:
        """Give the device memory back (idempotent): the Device empties the runner in place (its KV caches, host
        swap space and CUDA graphs) and drops the model; the engine drops its own references to both, and only
        then the Device returns what was freed (gc, torch.cuda.empty_cache), as nothing of the engine holds it."""
        if self._released:
            return
        self._released = True
        runner, self.model_runner = self.model_runner, _ReleasedRunner()  # (a stopped batch queue let go of it)
        self.model = None
        self.platform.release(runner)
        del runner
        self.platform.return_memory()

    def __del__(self) -> None:
        """Dropped without shutdown(): the memory goes back now, not at some later collection. Not at interpreter
        exit (the process gives everything back, and the modules this needs may be gone)."""
        if sys.is_finalizing() or getattr(self, "_released", True):
            return
        try:
            if self.batch_queue is not None:
                self.batch_queue.shutdown()
            self._release()
        except Exception:  # noqa: BLE001 (a finaliser must not raise; the memory goes back with the process)
            logger.debug("releasing a dropped engine failed", exc_info=True)

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ---- step -----------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration. It never raises for a request's sake: a failure tied to one request (its stop check,
        detokenisation, output, or its own values failing its row or the sampler: refengine/worker/step_isolation.py)
        finishes that request alone with finish_reason "abort" and `error` set; any other failure of the batched
        forward + sampling aborts the requests of this step the same way; the engine goes on."""
        return self._step(self)

    def _step_sync(self) -> list[RequestOutput]:
        """Sync scheduling (vLLM's EngineCore.step): schedule, run the forward, process its output."""
        outputs, self._pending = self._pending, []
        sched = self.scheduler
        if not sched.has_unfinished_requests():
            return outputs
        out = sched.schedule()
        return outputs + self._process_step(out, self.model_runner.execute_model)

    def _step_async(self, queue: StepQueue) -> list[RequestOutput]:
        """Async scheduling (vLLM's step_with_batch_queue): schedule step N+1 and launch it behind step N's running
        forward, then wait for step N and process its output; with nothing left to schedule, drain the queue."""
        outputs, self._pending = self._pending, []
        sched = self.scheduler
        scheduled = sched.has_unfinished_requests()
        if scheduled:
            queue.submit(sched.schedule())
        if queue.full() or (queue and not scheduled):
            outputs += self._process_step(queue.oldest(), queue.collect)
        return outputs

    def _step_shut_down(self) -> list[RequestOutput]:
        """The step function of a shut-down engine, rather than stepping one whose requests were aborted."""
        raise RuntimeError(f"step(): {_SHUT_DOWN}")

    def _process_step(
        self, out: SchedulerOutput, forward: Callable[[SchedulerOutput], ModelRunnerOutput]
    ) -> list[RequestOutput]:
        """One step's output, back up the path: `forward(out)` gives the sampled tokens (the runner's execute_model
        runs the forward now; a batch queue's collect waits for the one it launched), or raises if the forward
        failed; the scheduler appends them and runs its stop checks; the output processor builds the outputs and
        reports the requests its stop strings ended or whose output failed; the engine finishes those through the
        scheduler."""
        sched, op = self.scheduler, self.output_processor
        try:
            runner_output = forward(out)
            sampled = runner_output.by_request()
            finished = {r.request_id for r in sched.update_from_output(out, sampled)}
        except Exception as exc:  # noqa: BLE001 (whatever failed, the other requests must not be lost)
            self._record(out)
            return self._abort_step(out, exc)
        self._record(out, runner_output.cuda_graph)
        # requests whose own values failed their row or the sampler got no token: abort them alone
        failed = [
            (req, exc)
            for rid, exc in runner_output.failed.items()
            if rid not in finished and (req := op.request_of(rid)) is not None
        ]
        outputs = self._abort_failed(failed, "sampling")
        step = op.process_outputs(sampled)
        outputs += step.outputs + self._abort_failed(step.failed, "request")
        if step.stopped:
            outputs += self._finish_stopped(step.stopped)
        return outputs

    def _finish_stopped(self, stopped: list[Request]) -> list[RequestOutput]:
        """Finish the requests a stop string ended, then their final outputs. The stop string decides the reason,
        also of a request that EOS or its length ended in the same step (as in vLLM)."""
        sched = self.scheduler
        sched.finish_requests([r.request_id for r in stopped], RequestStatus.FINISHED_STOPPED)
        sched.set_finished_status(
            [r for r in stopped if r.status != RequestStatus.FINISHED_STOPPED], RequestStatus.FINISHED_STOPPED
        )
        final, failed = self.output_processor.outputs_of(stopped)
        return final + self._abort_failed(failed, "request")

    def _abort_step(self, out: SchedulerOutput, exc: BaseException) -> list[RequestOutput]:
        """The forward or the batched sampling failed: no request of this step can be trusted to have its KV and
        its token, so each one is aborted with the error (and a swap-preempted one, whose copy may not have run).
        Requests that were not in the step keep running; the next schedule() tells the runner who left."""
        logger.error("step failed; aborting its %d request(s)", len(out.num_scheduled_tokens), exc_info=exc)
        ids = list(out.num_scheduled_tokens) + (out.preempted_req_ids if out.blocks_to_swap_out else [])
        # (from the output side, not the scheduler: update_from_output may have finished some before it failed)
        op = self.output_processor
        return self._abort_failed(
            [(req, exc) for rid in dict.fromkeys(ids) if (req := op.request_of(rid)) is not None], "step"
        )

    def _abort_failed(self, failures: list[tuple[Request, BaseException]], what: str) -> list[RequestOutput]:
        """Finish each request alone as aborted, with the error on its output; its KV blocks go back to the pool."""
        outputs = []
        for req, exc in failures:
            logger.error("%s %r failed; aborting it", what, req.request_id, exc_info=exc)
            req.error = req.error or f"{what} failed: {type(exc).__name__}: {exc}"
            if req.is_finished():  # (already finished by this step's stop check: its blocks are freed)
                self.scheduler.set_finished_status([req], RequestStatus.FINISHED_ABORTED)
            else:
                self.scheduler.finish_requests([req.request_id], RequestStatus.FINISHED_ABORTED)
            outputs.append(self.output_processor.aborted_output(req))
        return outputs

    def _record(self, out: SchedulerOutput, cuda_graph: bool | None = None) -> None:
        stats = self.scheduler.make_stats(out)
        self.step_stats.append(StepStats.of_step(out, stats, self.clock.now(), cuda_graph))
