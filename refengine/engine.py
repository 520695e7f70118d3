"""LLMEngine: add_request / step / abort_request over the scheduler, the model runner and the detokenizer.

Each step(): schedule -> forward + sample -> update_from_output (EOS, stop ids, length) -> stop strings ->
incremental outputs (the tokens new since the last step) with per-request timestamps for TTFT / TPOT / ITL.
With async_scheduling=True the forward runs in a worker thread and step() schedules and launches step N+1 before
it processes step N's output (refengine/batch_queue.py): outputs come back one step later, tokens are the same.
"""
from __future__ import annotations

import collections
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from refengine.attention import default_backend_name, get_attention_backend
from refengine.batch_queue import BatchQueue
from refengine.config import EngineConfig, SchedulerConfig
from refengine.detokenizer import IncrementalDetokenizer
from refengine.kv_cache_manager import cdiv
from refengine.kv_sizing import default_num_gpu_blocks
from refengine.model_runner import ModelRunner
from refengine.outputs import CompletionOutput, RequestOutput
from refengine.processor import Processor
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler
from refengine.scheduler_output import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class StepStats:
    """What one step did; the perf suite turns these into utilisation figures and slot timelines, from these
    fields alone (it never looks inside the scheduler)."""

    time: float
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    num_preempted: int
    scheduled_req_ids: list[str]
    running_req_ids: list[str]
    # the scheduled requests whose tokens this step are prompt tokens (or recomputed ones after a preemption)
    prefill_req_ids: list[str] = field(default_factory=list)
    # static batching: the batch (1, 2, ...) of every scheduled or running request, which holds its slot until the
    # whole batch has left; None in the other modes, where a finished request frees its slot at once
    batch_ids: dict[str, int | None] = field(default_factory=dict)


_ENGINE_KEYS = {f.name for f in fields(EngineConfig)} - {"scheduler"}


def _kv_bytes_per_block(mc, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * mc.num_hidden_layers * block_size * mc.num_key_value_heads * mc.head_dim * elem


@functools.lru_cache(maxsize=2)
def _preset_model(model: str, device: torch.device, dtype: torch.dtype, seed: int, backend: str):
    from refengine.loader import load_model

    return load_model(model, device=device, dtype=dtype, seed=seed, attention_backend=backend)


_SHUT_DOWN = "this LLMEngine has been shut down (shutdown(), or the end of its `with` block); create a new one"


def _while_open(method: Callable) -> Callable:
    """step() after shutdown() raises, rather than stepping an engine whose requests were aborted."""
    @functools.wraps(method)
    def guarded(self: "LLMEngine", *args, **kwargs):
        if self._shut_down:
            raise RuntimeError(f"{method.__name__}(): {_SHUT_DOWN}")
        return method(self, *args, **kwargs)
    return guarded


def _load_model_cached(model: str, device: torch.device, dtype: torch.dtype, seed: int, backend: str):
    """Presets are pure functions of (name, seed, ...), so engines in one process share their weights (inference
    only); a folder is read afresh each time."""
    from refengine.loader import PRESETS, load_model

    if model in PRESETS:
        return _preset_model(model, device, dtype, seed, backend)
    return load_model(model, device=device, dtype=dtype, seed=seed, attention_backend=backend)


class LLMEngine:
    def __init__(self, model: str = "tiny-qwen2", **kwargs) -> None:
        from refengine.loader import check_attention_backend, load_tokenizer, resolve_device, resolve_dtype

        model = os.fspath(model) if isinstance(model, os.PathLike) else model
        unknown = set(kwargs) - _ENGINE_KEYS - set(SchedulerConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown engine option(s): {sorted(unknown)}")
        sched_kw = {k: v for k, v in kwargs.items()
                    if k in SchedulerConfig.__dataclass_fields__ and k not in _ENGINE_KEYS and v is not None}
        eng_kw = {k: v for k, v in kwargs.items() if k in _ENGINE_KEYS}
        self.config = EngineConfig(model=model, scheduler=sched_kw, **eng_kw)
        cfg = self.config
        SchedulerConfig(**sched_kw)  # bad knobs fail here, before a model is loaded
        self.device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, self.device)
        self.dtype = dtype
        backend = cfg.attention_backend or default_backend_name(self.device)
        check_attention_backend(backend, self.device)
        self.model, self.model_config = _load_model_cached(model, self.device, dtype, cfg.seed, backend)
        self.attention_backend = get_attention_backend(backend).name
        self.tokenizer = load_tokenizer(model)
        mc = self.model_config
        self.max_model_len = mc.max_position_embeddings if cfg.max_model_len is None else cfg.max_model_len
        if not 2 <= self.max_model_len <= mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len must be in [2, {mc.max_position_embeddings}] for this model, got {self.max_model_len}"
            )
        block_size = sched_kw.get("block_size", SchedulerConfig.block_size)
        kv_field = ("num_gpu_blocks" if "num_gpu_blocks" in sched_kw else "kv_cache_memory_gb"
                    if cfg.kv_cache_memory_gb is not None or self.device.type != "cuda" else "gpu_memory_utilization")
        if "num_gpu_blocks" not in sched_kw:
            sched_kw["num_gpu_blocks"] = self._sized_num_blocks(block_size)
        sc = SchedulerConfig(max_model_len=self.max_model_len, **sched_kw)
        # Every running request owns at least one KV block of its own (the one holding its last token is never a
        # prefix-cache hit), so no more than num_gpu_blocks requests ever need an input-batch row at once.
        num_rows = min(sc.max_num_seqs, sc.num_gpu_blocks)
        self._check_memory(sc, num_rows, kv_field)
        self.scheduler = Scheduler(eos_token_id=mc.eos_token_id, max_model_len=self.max_model_len, **sched_kw)
        self.model_runner = ModelRunner(
            self.model, mc, num_gpu_blocks=sc.num_gpu_blocks, num_cpu_blocks=sc.num_cpu_blocks,
            block_size=sc.block_size, max_num_seqs=num_rows, max_model_len=self.max_model_len,
            device=self.device, dtype=dtype, seed=cfg.seed, enforce_eager=cfg.enforce_eager,
        )
        if self.attention_backend == "triton" and self.device.type == "cuda":  # compile now, not in a measured step
            from cbbench.kernels import warmup_attention_kernels

            warmup_attention_kernels(mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, sc.block_size,
                                     dtype, self.max_model_len, self.device)
        self.processor = Processor(self.tokenizer, mc, sc, self.max_model_len)
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._prompts: dict[str, str | None] = {}
        self._sent: dict[str, int] = {}  # output tokens already returned per request
        self._pending: list[RequestOutput] = []  # outputs of requests aborted between steps
        self.batch_queue = BatchQueue(self.model_runner.execute_model) if sc.async_scheduling else None
        self._shut_down = False
        # the newest stats_log_size steps and finished requests, for metrics; the caller may clear them
        self.step_stats: collections.deque[StepStats] = collections.deque(maxlen=cfg.stats_log_size)
        self._static_batch: dict[str, int] = {}  # static batching: the batch of each request in the last step
        self.finished_requests: collections.deque[Request] = collections.deque(maxlen=cfg.stats_log_size)

    def _check_memory(self, sc: SchedulerConfig, num_rows: int, kv_field: str) -> None:
        """Before anything is allocated: the KV caches and the input batch must fit in the memory free now."""
        from refengine.loader import check_memory

        per_block = _kv_bytes_per_block(self.model_config, sc.block_size, self.dtype)
        host = torch.device("cpu")
        batch_row = (self.max_model_len + cdiv(self.max_model_len, sc.block_size)) * 4  # int32 token ids + block table
        check_memory(self.device, [(kv_field, sc.num_gpu_blocks * per_block, self.device),
                                   ("num_cpu_blocks", sc.num_cpu_blocks * per_block, host),
                                   ("max_num_seqs", num_rows * batch_row, host)])

    def _sized_num_blocks(self, block_size: int) -> int:
        """_default_num_blocks, with its failures told as the knob that caused them."""
        cfg = self.config
        per_block = _kv_bytes_per_block(self.model_config, block_size, self.dtype)
        if cfg.kv_cache_memory_gb is not None and cfg.kv_cache_memory_gb * 2**30 < per_block:
            raise ValueError(f"kv_cache_memory_gb={cfg.kv_cache_memory_gb} holds no KV block of {block_size} tokens "
                             f"({per_block} bytes)")
        try:
            return self._default_num_blocks(block_size)
        except torch.cuda.OutOfMemoryError as exc:  # the profiling forward of max_num_batched_tokens tokens
            budget = cfg.scheduler.get("max_num_batched_tokens", SchedulerConfig.max_num_batched_tokens)
            raise ValueError(f"max_num_batched_tokens={budget}: one step of that many tokens does not fit in "
                             f"device memory ({exc}); lower it") from None

    def _default_num_blocks(self, block_size: int) -> int:
        cfg, sched_kw = self.config, self.config.scheduler
        return default_num_gpu_blocks(
            self.model, self.model_config, device=self.device, dtype=self.dtype, block_size=block_size,
            bytes_per_block=_kv_bytes_per_block(self.model_config, block_size, self.dtype),
            max_model_len=self.max_model_len, kv_cache_memory_gb=cfg.kv_cache_memory_gb,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_num_batched_tokens=sched_kw.get("max_num_batched_tokens", SchedulerConfig.max_num_batched_tokens),
            max_num_seqs=sched_kw.get("max_num_seqs", SchedulerConfig.max_num_seqs),
        )

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        """Validate and queue a request; bad input raises ValueError naming the field and changes nothing."""
        self._queue(*self._process(request_id, prompt, params, arrival_time, priority))

    def _process(self, request_id: str, prompt, params, arrival_time, priority) -> tuple[Request, str | None]:
        """Build the request without queuing it (LLM.generate builds a whole batch first, so that it is atomic)."""
        if self._shut_down:
            raise RuntimeError(f"add_request(): {_SHUT_DOWN}")
        if isinstance(request_id, str) and (request_id in self.scheduler.requests or request_id in self._detok
                                          or (self.batch_queue is not None and self.batch_queue.holds(request_id))):
            raise ValueError(f"request_id {request_id!r} is already in use")
        return self.processor.process(request_id, prompt, params, arrival_time, priority)

    def _queue(self, req: Request, prompt_text: str | None) -> None:
        rid = req.request_id
        self.scheduler.add_request(req)
        self._detok[rid] = IncrementalDetokenizer(self.tokenizer, req)
        self._prompts[rid] = prompt_text
        self._sent[rid] = 0

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
            self._pending.append(self._make_output(req))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending) or bool(self.batch_queue)

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    # ---- lifetime -------------------------------------------------------------------------------------------
    def shutdown(self) -> list[RequestOutput]:
        """Stop the engine (idempotent; call it from the thread that steps it). The steps in flight are waited for
        and processed, so the tokens their forwards sampled are kept; then every unfinished request is aborted
        (finish_reason "abort", `error` saying why, its KV blocks freed) and the async worker thread exits. Returns
        those last outputs, as step() would have; later step() / add_request() calls raise RuntimeError."""
        if self._shut_down:
            return []
        outputs, self._pending = self._pending, []
        try:
            while self.batch_queue:  # drain, as step() does once nothing is left to schedule
                outputs += self._process_step(*self.batch_queue.pop())
            unfinished = list(self.scheduler.requests.values())
            if unfinished:
                logger.warning("shutdown: aborting %d unfinished request(s)", len(unfinished))
            for req in unfinished:
                req.error = req.error or "aborted: the engine was shut down"
            self.abort_request([req.request_id for req in unfinished])
            outputs, self._pending = outputs + self._pending, []
        finally:
            self._shut_down = True
            if self.batch_queue is not None:
                self.batch_queue.shutdown()
        return outputs

    def __enter__(self) -> "LLMEngine":
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    # ---- step -----------------------------------------------------------------------------------------------
    @_while_open
    def step(self) -> list[RequestOutput]:
        """One iteration. It never raises for a request's sake: a failure tied to one request (its stop check,
        detokenisation, output) finishes that request alone with finish_reason "abort" and `error` set; a failure
        of the batched forward + sampling aborts the requests of this step the same way; the engine goes on."""
        outputs, self._pending = self._pending, []
        sched = self.scheduler
        if self.batch_queue is None:
            if not sched.has_unfinished_requests():
                return outputs
            out = sched.schedule()
            return outputs + self._process_step(out, lambda: self.model_runner.execute_model(out))
        # async scheduling (vLLM's step_with_batch_queue): schedule step N+1 and launch it behind step N's running
        # forward, then wait for step N and process its output; with nothing left to schedule, drain the queue
        scheduled = sched.has_unfinished_requests()
        if scheduled:
            self.batch_queue.submit(sched.schedule())
        if self.batch_queue.full() or (self.batch_queue and not scheduled):
            outputs += self._process_step(*self.batch_queue.pop())
        return outputs

    def _process_step(self, out: SchedulerOutput,
                      model_output: Callable[[], ModelRunnerOutput]) -> list[RequestOutput]:
        """Update the scheduler with one step's sampled tokens (`model_output()` returns them, or raises if the
        forward failed), then stop strings and the incremental outputs."""
        sched = self.scheduler
        try:
            sampled = model_output().by_request()
            finished = {r.request_id for r in sched.update_from_output(out, sampled)}
        except Exception as exc:  # noqa: BLE001 (whatever failed, the other requests must not be lost)
            self._record(out)
            return self._abort_step(out, exc)
        self._record(out)
        outputs = []
        for rid in sampled:
            det = self._detok.get(rid)
            if det is None:
                continue  # (async) finished or aborted while this step was in flight: its token was dropped
            req = det.request
            try:
                outputs.append(self._process_output(req, rid in finished))
            except Exception as exc:  # noqa: BLE001
                outputs.append(self._fail_request(req, exc))
        return outputs

    def _process_output(self, req: Request, finished: bool) -> RequestOutput:
        """Stop strings (the detokenizer sees the text), then the incremental output."""
        rid = req.request_id
        if req.error is not None:  # its stop check failed and the scheduler aborted it
            logger.error("request %r aborted: %s", rid, req.error)
            return self._make_output(req)
        stop = self._detok[rid].update()
        if stop is not None:
            req.stop_reason = stop
            if finished:
                req.status = RequestStatus.FINISHED_STOPPED
            else:
                self.scheduler.finish_requests([rid], RequestStatus.FINISHED_STOPPED)
        return self._make_output(req)

    def _fail_request(self, req: Request, exc: BaseException, what: str = "request") -> RequestOutput:
        """Finish `req` alone as aborted, with the error on its output; its KV blocks go back to the pool."""
        logger.error("%s %r failed; aborting it", what, req.request_id, exc_info=exc)
        req.error = req.error or f"{what} failed: {type(exc).__name__}: {exc}"
        if req.is_finished():  # (already finished by this step's stop check: its blocks are freed)
            req.status = RequestStatus.FINISHED_ABORTED
        else:
            self.scheduler.finish_requests([req.request_id], RequestStatus.FINISHED_ABORTED)
        try:
            return self._make_output(req)
        except Exception:  # noqa: BLE001 (the detokenizer itself may be what failed: report the tokens without text)
            return self._make_output(req, text="")

    def _abort_step(self, out, exc: BaseException) -> list[RequestOutput]:
        """The forward or the batched sampling failed: no request of this step can be trusted to have its KV and
        its token, so each one is aborted with the error (and a swap-preempted one, whose copy may not have run).
        Requests that were not in the step keep running; the next schedule() tells the runner who left."""
        logger.error("step failed; aborting its %d request(s)", len(out.num_scheduled_tokens), exc_info=exc)
        ids = list(out.num_scheduled_tokens) + (out.preempted_req_ids if out.blocks_to_swap_out else [])
        # (from _detok, not the scheduler: update_from_output may have finished some before it failed)
        reqs = [self._detok[rid].request for rid in dict.fromkeys(ids) if rid in self._detok]
        return [self._fail_request(req, exc, "step") for req in reqs]

    def _record(self, out) -> None:
        sched = self.scheduler
        running = [r.request_id for r in sched.running]
        present = [*out.num_scheduled_tokens, *running]
        if sched.config.batching == "static":
            # a request keeps the batch it was first seen in: with async scheduling the next batch may already have
            # formed (schedule() of step N+1 ran) when step N is recorded
            seen = self._static_batch
            self._static_batch = batch_ids = {rid: seen.get(rid, sched.static_batch_id) for rid in present}
        else:
            batch_ids = dict.fromkeys(present)
        self.step_stats.append(StepStats(
            time=time.monotonic(),
            num_scheduled_tokens=out.total_num_scheduled_tokens,
            num_prefill_tokens=out.num_prefill_tokens,
            num_decode_tokens=out.num_decode_tokens,
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            kv_blocks_used=sched.kv_cache_manager.block_pool.num_used_blocks,
            num_preempted=len(out.preempted_req_ids),
            scheduled_req_ids=list(out.num_scheduled_tokens),
            running_req_ids=running,
            prefill_req_ids=[rid for rid, prefill in out.is_prefill.items() if prefill],
            batch_ids=dict(batch_ids),
        ))

    def _make_output(self, req: Request, text: str | None = None) -> RequestOutput:
        rid = req.request_id
        sent = self._sent.get(rid, 0)
        new_ids = req.output_token_ids[sent:]
        finished = req.is_finished()
        if text is None:
            text = self._detok[rid].take_delta(finished)
        self._sent[rid] = req.num_output_tokens
        completion = CompletionOutput(0, text, new_ids, req.get_finished_reason(), req.stop_reason, req.error)
        output = RequestOutput(rid, self._prompts.get(rid), req.prompt_token_ids, [completion], finished)
        if finished:
            output.metrics = request_metrics(req)
            self.finished_requests.append(req)
            for d in (self._detok, self._prompts, self._sent):
                d.pop(rid, None)
        return output


def request_metrics(req: Request) -> dict:
    """Per-request record for the perf suite (times are time.monotonic() seconds)."""
    return {
        "request_id": req.request_id,
        "prompt_len": req.num_prompt_tokens,
        "output_len": req.num_output_tokens,
        "arrival_time": req.arrival_time,
        "first_scheduled_time": req.first_scheduled_time,
        "first_token_time": req.first_token_time,
        "token_times": list(req.token_times),
        "finish_time": req.finish_time,
        "num_preemptions": req.num_preemptions,
        "num_recomputed_tokens": req.num_recomputed_tokens,
        "num_cached_tokens": max(req.num_cached_tokens, 0),
        "finish_reason": req.get_finished_reason(),
        "error": req.error,
    }
