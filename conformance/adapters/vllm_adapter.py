"""vLLM's own V1 scheduler (`vllm.v1.core.sched.scheduler.Scheduler`) through the SchedulerAdapter surface.

Runs on the CPU with no model and no GPU: the scheduler is built from a `VllmConfig` whose `ModelConfig` reads a
config-only model folder (a small Qwen2 `config.json` written to a temp dir at run time), `DeviceConfig("cpu")`,
and a `KVCacheConfig` with one full-attention group. Only the scheduler and its KV cache manager run; the forward
pass is replaced by whatever the caller feeds to `update()`.

vLLM is not a dependency of cbbench: it lives in its own environment (ci/setup_vllm_env.sh builds .venv-vllm).
Importing this module without vLLM raises ImportError with a message saying so; the suite skips then.

Knob mapping (our name -> vLLM):
  max_num_batched_tokens, max_num_seqs, enable_chunked_prefill, long_prefill_token_threshold, policy
                                   -> SchedulerConfig
  block_size, enable_prefix_caching -> CacheConfig (and the FullAttentionSpec's block size)
  num_gpu_blocks                   -> KVCacheConfig.num_blocks = num_gpu_blocks + 1: vLLM's BlockPool takes block 0
                                      as its "null block", so N + 1 blocks give N usable ones, as ours. Block ids are
                                      reported shifted down by one (vLLM's 1..N -> our 0..N-1).
  max_model_len                    -> ModelConfig.max_model_len (and the config.json's max_position_embeddings)
  num_cpu_blocks                   -> ignored (V1 has no host pool; swap is refused below)
  async_scheduling                 -> SchedulerConfig.async_scheduling, and the scheduler class is vLLM's AsyncScheduler
Not supported by vLLM V1 (`VLLMAdapter.supports(knobs)` says why; the constructor raises vllm_build.VLLMUnsupported, a
NotImplementedError): batching other than "continuous", preemption_mode="swap", priority_preemption=True, and
max_num_batched_tokens < max_num_seqs (refused by vLLM's SchedulerConfig). vLLM's config also refuses chunked
prefill off with max_num_batched_tokens < max_model_len (its engine would reject longer prompts at the API); the
adapter validates with chunked prefill on and then switches it off, so the scheduler runs on any budget as ours does.

Outputs may be fed one step late (async scheduling): update() feeds the oldest schedule() not fed yet.
Step views: preempted ids come in preemption order (recorded by a one-method subclass; SchedulerOutput only has a
set), new_req_ids in scheduling order (first-time and resumed together), block ids shifted as above.
"""

from __future__ import annotations

from collections import deque

from conformance.adapters import ReqView, StepView
from conformance.adapters.vllm_build import (
    KNOB_DEFAULTS,
    STATUS_NAMES,
    ModelRunnerOutput,
    Request,
    RequestStatus,
    SamplingParams,
    build_vllm_scheduler,
    get_request_block_hasher,
    prefix_hash_fn,
    unsupported_reason,
)


class VLLMAdapter:
    name = "vllm"
    # behaviours whose named example must fail on vLLM (conformance.adapters.expect_known_difference)
    known_differences = {
        "eos_before_min_tokens": (
            "vLLM's difference: its check_stop ends a request on an EOS fed before min_tokens ('stop' at output 1 of "
            "min_tokens=3), trusting its sampler to have masked EOS; docs/scheduling.md (refengine) ends no request "
            "before min_tokens. Unreachable with a masking sampler"
        )
    }

    # invariants the adapter cannot check here, with why (the state machine does not count them as checked)
    unchecked = {
        "cached_tokens": (
            "the adapter's gap: the adapter does not report vLLM's Request.num_cached_tokens (the invariant is written "
            "after it and checked on refengine)"
        )
    }

    @classmethod
    def supports(cls, knobs: dict) -> str | None:
        return unsupported_reason(knobs)

    def __init__(self, eos_token_id: int | None = None, **knobs) -> None:
        self.sched = build_vllm_scheduler(**knobs)
        k = {**KNOB_DEFAULTS, **knobs}
        self.knobs = k
        self.block_size = int(k["block_size"])
        self.num_gpu_blocks = int(k["num_gpu_blocks"])
        self.num_cpu_blocks = 0  # V1 has no host pool
        self.eos_token_id = eos_token_id
        self._block_hasher = (
            get_request_block_hasher(self.block_size, prefix_hash_fn()) if k["enable_prefix_caching"] else None
        )
        self._all: dict[str, Request] = {}
        self._in_flight: deque = deque()  # scheduled, output not fed yet (async: up to two)

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id,
        prompt_token_ids,
        *,
        max_tokens,
        priority=0,
        arrival_time=0.0,
        min_tokens=0,
        ignore_eos=False,
        stop_token_ids=None,
    ) -> None:
        if request_id in self._all:
            raise ValueError(f"request_id {request_id!r} is already in use")
        sp = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            temperature=0.0,
            ignore_eos=ignore_eos,
            stop_token_ids=list(stop_token_ids or []),
        )
        # what the engine's input processor does: the model's EOS becomes the request's (unless ignore_eos)
        sp.update_from_generation_config({}, self.eos_token_id)
        req = Request(
            request_id,
            list(prompt_token_ids),
            sp,
            None,
            arrival_time=arrival_time,
            priority=priority,
            block_hasher=self._block_hasher,
        )
        self._all[request_id] = req
        self.sched.add_request(req)

    def abort(self, request_ids):
        self.sched.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    # ---- steps ----------------------------------------------------------------------------------------------
    def schedule(self) -> StepView:
        waiting_before = {r.request_id for r in self._waiting_reqs()}
        self.sched.preemption_log = []
        out = self.sched.schedule()
        self._in_flight.append(out)
        preempted = list(self.sched.preemption_log)
        assert set(preempted) == set(out.preempted_req_ids), (preempted, out.preempted_req_ids)
        return StepView(
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            preempted_req_ids=preempted,
            new_req_ids=[rid for rid in out.num_scheduled_tokens if rid in waiting_before],
        )

    def update(self, sampled):
        """Feed the sampled tokens of the oldest schedule() not fed yet as a ModelRunnerOutput (one row per
        scheduled request, in scheduling order; a partial prefill's row is empty, as vLLM's model runner returns
        it: the caller leaves partial prefills out of `sampled`)."""
        out = self._in_flight.popleft()
        req_ids = list(out.num_scheduled_tokens)
        rows = [[int(t) for t in sampled.get(rid, [])] for rid in req_ids]
        mro = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=rows
        )
        before = {rid for rid in req_ids if not self._all[rid].is_finished()}
        self.sched.update_from_output(out, mro)
        return [rid for rid in req_ids if rid in before and self._all[rid].is_finished()]

    # ---- views ----------------------------------------------------------------------------------------------
    def _waiting_reqs(self) -> list[Request]:
        return list(self.sched.kv_holding_waiting) + list(self.sched.waiting)

    def _view(self, r: Request) -> ReqView:
        finished = r.is_finished()
        if finished or r.request_id not in self.sched.requests:
            block_ids = []
        else:
            # vLLM's ids 1..N (0 is the null block) -> ours 0..N-1
            block_ids = [b - 1 for b in self.sched.kv_cache_manager.get_block_ids(r.request_id)[0]]
        reason = r.get_finished_reason()
        return ReqView(
            request_id=r.request_id,
            status=STATUS_NAMES.get(r.status, "finished" if finished else str(r.status).lower()),
            num_prompt_tokens=r.num_prompt_tokens,
            num_output_tokens=r.num_output_tokens,
            num_computed_tokens=r.num_computed_tokens,
            priority=r.priority,
            arrival_time=r.arrival_time,
            block_ids=block_ids,
            num_preemptions=r.num_preemptions,
            finish_reason=None if reason is None else str(reason),
            num_output_placeholders=0 if finished else r.num_output_placeholders,
            max_tokens=r.max_tokens,
        )

    def running(self):
        return [self._view(r) for r in self.sched.running]

    def waiting(self):
        return [self._view(r) for r in self._waiting_reqs()]

    def request(self, request_id):
        return self._view(self._all[request_id])

    def num_free_blocks(self):
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def block_ref_counts(self):
        pool = self.sched.kv_cache_manager.block_pool
        return {b.block_id - 1: b.ref_cnt for b in pool.blocks if not b.is_null}

    def check_invariants(self):
        """vLLM has no self-check method; assert the few facts its own code asserts or relies on."""
        s = self.sched
        pool = s.kv_cache_manager.block_pool
        assert len(s.running) <= s.max_num_running_reqs, f"{len(s.running)} running > max_num_seqs"
        assert all(r.status == RequestStatus.RUNNING for r in s.running), s.running
        assert all(b.ref_cnt >= 0 for b in pool.blocks if not b.is_null), "negative ref count"
        in_use = sum(1 for b in pool.blocks if not b.is_null and b.ref_cnt > 0)
        assert in_use + pool.get_num_free_blocks() == self.num_gpu_blocks, (
            f"{in_use} blocks in use + {pool.get_num_free_blocks()} free != {self.num_gpu_blocks}"
        )
