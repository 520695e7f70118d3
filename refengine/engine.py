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
from refengine.kv_cache_manager import cdiv
from refengine.kv_sizing import default_num_gpu_blocks
from refengine.model_runner import ModelRunner
from refengine.output_processor import OutputProcessor, request_metrics  # noqa: F401  (re-exported)
from refengine.outputs import RequestOutput
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
        self._pending: list[RequestOutput] = []  # outputs of requests aborted between steps
        self.batch_queue = BatchQueue(self.model_runner.execute_model) if sc.async_scheduling else None
        self._shut_down = False
        # the newest stats_log_size steps and finished requests, for metrics; the caller may clear them
        self.step_stats: collections.deque[StepStats] = collections.deque(maxlen=cfg.stats_log_size)
        self._static_batch: dict[str, int] = {}  # static batching: the batch of each request in the last step
        self.finished_requests: collections.deque[Request] = collections.deque(maxlen=cfg.stats_log_size)
        self.output_processor = OutputProcessor(self.tokenizer, self.scheduler, self.finished_requests)

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
        if isinstance(request_id, str) and (request_id in self.scheduler.requests or request_id in self.output_processor
                                          or (self.batch_queue is not None and self.batch_queue.holds(request_id))):
            raise ValueError(f"request_id {request_id!r} is already in use")
        return self.processor.process(request_id, prompt, params, arrival_time, priority)

    def _queue(self, req: Request, prompt_text: str | None) -> None:
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
        detokenisation, output, or its own values failing its row or the sampler: refengine/step_isolation.py)
        finishes that request alone with finish_reason "abort" and `error` set; any other failure of the batched
        forward + sampling aborts the requests of this step the same way; the engine goes on."""
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
            runner_output = model_output()
            sampled = runner_output.by_request()
            finished = {r.request_id for r in sched.update_from_output(out, sampled)}
        except Exception as exc:  # noqa: BLE001 (whatever failed, the other requests must not be lost)
            self._record(out)
            return self._abort_step(out, exc)
        self._record(out)
        op = self.output_processor
        # requests whose own values failed their row or the sampler: they sampled nothing; abort them alone
        failed = [op.fail_request(op.request_of(rid), exc, "sampling")
                  for rid, exc in runner_output.failed.items() if rid in op and rid not in finished]
        return failed + op.process_outputs(sampled, finished)

    def _abort_step(self, out, exc: BaseException) -> list[RequestOutput]:
        """The forward or the batched sampling failed: no request of this step can be trusted to have its KV and
        its token, so each one is aborted with the error (and a swap-preempted one, whose copy may not have run).
        Requests that were not in the step keep running; the next schedule() tells the runner who left."""
        logger.error("step failed; aborting its %d request(s)", len(out.num_scheduled_tokens), exc_info=exc)
        ids = list(out.num_scheduled_tokens) + (out.preempted_req_ids if out.blocks_to_swap_out else [])
        # (from the output side, not the scheduler: update_from_output may have finished some before it failed)
        op = self.output_processor
        reqs = [op.request_of(rid) for rid in dict.fromkeys(ids) if rid in op]
        return [op.fail_request(req, exc, "step") for req in reqs]

    def _record(self, out) -> None:
        sched = self.scheduler
        running = [r.request_id for r in sched.running]
        if sched.config.batching == "static":
            # a request keeps the batch it was first seen in: with async scheduling the next batch may already have
            # formed (schedule() of step N+1 ran) when step N is recorded
            seen = self._static_batch
            self._static_batch = {rid: seen.get(rid, sched.static_batch_id)
                                  for rid in (*out.num_scheduled_tokens, *running)}
            batch_ids = dict(self._static_batch)
        else:
            batch_ids = dict.fromkeys(out.num_scheduled_tokens)
            batch_ids.update(dict.fromkeys(running))
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
            prefill_req_ids=[rid for rid, prefill in out.is_prefill.items() if prefill] if out.num_prefill_tokens else [],
            batch_ids=batch_ids,
        ))
