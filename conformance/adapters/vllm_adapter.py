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
Not supported by vLLM V1 (`VLLMAdapter.supports(knobs)` says why; the constructor raises VLLMUnsupported, a
NotImplementedError): batching other than "continuous", preemption_mode="swap", priority_preemption=True, and
max_num_batched_tokens < max_num_seqs (refused by vLLM's SchedulerConfig). vLLM's config also refuses chunked
prefill off with max_num_batched_tokens < max_model_len (its engine would reject longer prompts at the API); the
adapter validates with chunked prefill on and then switches it off, so the scheduler runs on any budget as ours does.

Outputs may be fed one step late (async scheduling): update() feeds the oldest schedule() not fed yet.
Step views: preempted ids come in preemption order (recorded by a one-method subclass; SchedulerOutput only has a
set), new_req_ids in scheduling order (first-time and resumed together), block ids shifted as above.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import deque

from conformance.adapters import ReqView, StepView

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # must be set before vllm is first imported

try:
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "conformance.adapters.vllm_adapter needs vLLM (tested with vllm==0.33.0 on the CPU torch 2.13.0), which is "
        "not a cbbench dependency: build its own environment with `bash ci/setup_vllm_env.sh` and run the suite "
        f"with .venv-vllm/bin/pytest. Import failed: {e}"
    ) from e


logging.getLogger("vllm").setLevel(logging.ERROR)  # its config warnings are about serving, not about this use


class VLLMUnsupported(NotImplementedError):
    """A knob value that vLLM's V1 scheduler has no counterpart for."""


# Our knobs and their defaults (refengine.config.SchedulerConfig); kept here so that this adapter does not depend on
# refengine.
_DEFAULTS = dict(
    max_num_batched_tokens=8192, max_num_seqs=256, block_size=16, num_gpu_blocks=4096, num_cpu_blocks=0,
    enable_chunked_prefill=True, long_prefill_token_threshold=0, enable_prefix_caching=True,
    preemption_mode="recompute", policy="fcfs", batching="continuous", priority_preemption=False,
    max_model_len=1 << 30, async_scheduling=False,
)

_STATUS = {
    RequestStatus.WAITING: "waiting",
    RequestStatus.RUNNING: "running",
    RequestStatus.PREEMPTED: "preempted",
}

_HASH_FN = None
_MODEL_DIRS: dict[int, str] = {}


def _model_dir(max_model_len: int) -> str:
    """A config-only Qwen2 folder (no weights, no tokenizer): all ModelConfig needs to derive the model's shape."""
    if max_model_len not in _MODEL_DIRS:
        d = tempfile.mkdtemp(prefix="cbbench-vllm-model-")
        cfg = {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
            "vocab_size": 1024, "max_position_embeddings": max_model_len, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": True,
            "bos_token_id": 1, "eos_token_id": 2,
        }
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        _MODEL_DIRS[max_model_len] = d
    return _MODEL_DIRS[max_model_len]


def _hash_fn():
    global _HASH_FN
    if _HASH_FN is None:
        _HASH_FN = get_hash_fn_by_name("sha256")  # vLLM's default prefix_caching_hash_algo
        init_none_hash(_HASH_FN)
    return _HASH_FN


class _PreemptionLog:
    """Mixed into vLLM's Scheduler / AsyncScheduler, changing nothing but remembering the order in which it
    preempted (SchedulerOutput's preempted_req_ids is a set)."""

    def _preempt_request(self, request, timestamp, drop_stale_output=False):
        self.preemption_log.append(request.request_id)
        super()._preempt_request(request, timestamp, drop_stale_output)


class _RecordingScheduler(_PreemptionLog, Scheduler):
    pass


class _RecordingAsyncScheduler(_PreemptionLog, AsyncScheduler):
    pass


def unsupported_reason(knobs: dict) -> str | None:
    """Why vLLM's V1 scheduler cannot run this configuration of our knobs, or None if it can."""
    k = {**_DEFAULTS, **knobs}
    if k["batching"] != "continuous":
        return f"vLLM V1 has only continuous batching, not batching={k['batching']!r}"
    if k["preemption_mode"] != "recompute":
        return f"vLLM V1 preempts only by recompute (no host pool), not preemption_mode={k['preemption_mode']!r}"
    if k["priority_preemption"]:
        return "vLLM V1 never preempts to admit a waiting request (priority_preemption=True)"
    # vLLM's SchedulerConfig validation (refengine accepts these)
    if k["max_num_batched_tokens"] < k["max_num_seqs"]:
        return (f"vLLM requires max_num_batched_tokens ({k['max_num_batched_tokens']}) >= max_num_seqs "
                f"({k['max_num_seqs']})")
    if k["long_prefill_token_threshold"] > k["max_model_len"]:
        return "vLLM requires long_prefill_token_threshold <= max_model_len"
    return None


def build_vllm_scheduler(**knobs) -> Scheduler:
    """vLLM's V1 Scheduler for our knobs, on the CPU, with no model. Unknown or unsupported knobs raise."""
    unknown = set(knobs) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown scheduler option(s): {sorted(unknown)}")
    k = {**_DEFAULTS, **knobs}
    if k["policy"] not in ("fcfs", "priority"):
        raise ValueError(f"policy must be 'fcfs' or 'priority', got {k['policy']!r}")
    reason = unsupported_reason(k)
    if reason is not None:
        raise VLLMUnsupported(reason)

    mml = int(k["max_model_len"])
    budget = int(k["max_num_batched_tokens"])
    model_config = ModelConfig(model=_model_dir(mml), skip_tokenizer_init=True, dtype="float32",
                               max_model_len=mml, seed=0)
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=int(k["max_num_seqs"]),
        # Validated as on, then set: vLLM's config refuses chunked prefill off with a budget below max_model_len,
        # because its engine would then have to reject longer prompts at the API. We run the scheduler alone (as
        # refengine's knobs allow any budget); a prompt that can never fit the budget just blocks admission there.
        enable_chunked_prefill=True,
        long_prefill_token_threshold=int(k["long_prefill_token_threshold"]),
        policy=k["policy"],
        max_model_len=mml,  # InitVar: only SchedulerConfig's own validation reads it
        is_encoder_decoder=False,
    )
    scheduler_config.enable_chunked_prefill = bool(k["enable_chunked_prefill"])
    scheduler_config.async_scheduling = bool(k["async_scheduling"])  # what vLLM's engine core reads to pick the class
    cache_config = CacheConfig(block_size=int(k["block_size"]), enable_prefix_caching=bool(k["enable_prefix_caching"]))
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    num_blocks = int(k["num_gpu_blocks"]) + 1  # + vLLM's null block (block 0, never handed out)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], FullAttentionSpec(
            block_size=int(k["block_size"]), num_kv_heads=1, head_size=1, dtype=torch.float32))],
    )
    cache_config.num_gpu_blocks = num_blocks
    cls = _RecordingAsyncScheduler if k["async_scheduling"] else _RecordingScheduler
    sched = cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=int(k["block_size"]),
        log_stats=False,
    )
    sched.preemption_log = []
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == k["num_gpu_blocks"]
    return sched


class VLLMAdapter:
    name = "vllm"

    @classmethod
    def supports(cls, knobs: dict) -> str | None:
        return unsupported_reason(knobs)

    def __init__(self, eos_token_id: int | None = None, **knobs) -> None:
        self.sched = build_vllm_scheduler(**knobs)
        k = {**_DEFAULTS, **knobs}
        self.knobs = k
        self.block_size = int(k["block_size"])
        self.num_gpu_blocks = int(k["num_gpu_blocks"])
        self.num_cpu_blocks = 0  # V1 has no host pool
        self.eos_token_id = eos_token_id
        self._block_hasher = (get_request_block_hasher(self.block_size, _hash_fn())
                              if k["enable_prefix_caching"] else None)
        self._all: dict[str, Request] = {}
        self._in_flight: deque = deque()  # scheduled, output not fed yet (async: up to two)

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(self, request_id, prompt_token_ids, *, max_tokens, priority=0, arrival_time=0.0,
                    min_tokens=0, ignore_eos=False, stop_token_ids=None) -> None:
        if request_id in self._all:
            raise ValueError(f"request_id {request_id!r} is already in use")
        sp = SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, temperature=0.0, ignore_eos=ignore_eos,
                            stop_token_ids=list(stop_token_ids or []))
        # what the engine's input processor does: the model's EOS becomes the request's (unless ignore_eos)
        sp.update_from_generation_config({}, self.eos_token_id)
        req = Request(request_id, list(prompt_token_ids), sp, None, arrival_time=arrival_time, priority=priority,
                      block_hasher=self._block_hasher)
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
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=rows)
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
            status=_STATUS.get(r.status, "finished" if finished else str(r.status).lower()),
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
            f"{in_use} blocks in use + {pool.get_num_free_blocks()} free != {self.num_gpu_blocks}")
