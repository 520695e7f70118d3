"""vLLM's own V1 scheduler, built for our knobs on the CPU with no model (`build_vllm_scheduler`), and why a
configuration cannot run there (`unsupported_reason`); the guarded vLLM import lives here. The knob mapping and what
the adapter reports are described in vllm_adapter.py, which drives the scheduler this module builds.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

from conformance.adapters import ADAPTER_KNOB_DEFAULTS

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # must be set before vllm is first imported

try:  # everything vLLM that the adapter needs, so that one message says it is missing (vllm_adapter.py takes the
    # names marked F401 from here: imported there directly, ahead of this module by import order, vLLM's own
    # ImportError would come first)
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams  # noqa: F401
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: F401
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput  # noqa: F401
    from vllm.v1.request import Request, RequestStatus  # noqa: F401
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


# the knobs every adapter takes (conformance/adapters/__init__.py), with vLLM's room for any context length
KNOB_DEFAULTS = {**ADAPTER_KNOB_DEFAULTS, "max_model_len": 1 << 30}

STATUS_NAMES = {
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
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 1,
            "vocab_size": 1024,
            "max_position_embeddings": max_model_len,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "torch_dtype": "float32",
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        _MODEL_DIRS[max_model_len] = d
    return _MODEL_DIRS[max_model_len]


def prefix_hash_fn():
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
    """Why vLLM's V1 scheduler cannot run this configuration of our knobs, or None if it can. Each reason says what
    the suite therefore leaves unchecked on vLLM and whose the gap is (docs/conformance.md keeps the table)."""
    k = {**KNOB_DEFAULTS, **knobs}
    if k["batching"] != "continuous":
        return (
            f"vLLM's difference: V1 has only continuous batching, so batching={k['batching']!r} (and its invariants) "
            "has nothing to check there"
        )
    if k["preemption_mode"] != "recompute":
        return (
            f"vLLM's difference: V1 preempts only by recompute, so preemption_mode={k['preemption_mode']!r} (swap "
            "plans, host blocks) is unchecked there; its CPU KV offloading (kv_offloading_size, a KV connector) is "
            "a prefix-cache tier a re-admitted request may hit, not a preemption mode"
        )
    if k["priority_preemption"]:
        return (
            "vLLM's difference: under policy='priority' V1 preempts only for a running request's blocks, never to "
            "admit a waiting one, so priority_preemption=True is unchecked there"
        )
    # vLLM's SchedulerConfig validation (refengine accepts these)
    if k["max_num_batched_tokens"] < k["max_num_seqs"]:
        return (
            f"vLLM's difference: its SchedulerConfig refuses max_num_batched_tokens ({k['max_num_batched_tokens']}) "
            f"< max_num_seqs ({k['max_num_seqs']}), so a budget smaller than the batch is unchecked there"
        )
    if k["long_prefill_token_threshold"] > k["max_model_len"]:
        return "vLLM's difference: its SchedulerConfig refuses long_prefill_token_threshold > max_model_len"
    return None


def build_vllm_scheduler(**knobs) -> Scheduler:
    """vLLM's V1 Scheduler for our knobs, on the CPU, with no model. Unknown or unsupported knobs raise."""
    unknown = set(knobs) - set(KNOB_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown scheduler option(s): {sorted(unknown)}")
    k = {**KNOB_DEFAULTS, **knobs}
    if k["policy"] not in ("fcfs", "priority"):
        raise ValueError(f"policy must be 'fcfs' or 'priority', got {k['policy']!r}")
    reason = unsupported_reason(k)
    if reason is not None:
        raise VLLMUnsupported(reason)

    mml = int(k["max_model_len"])
    budget = int(k["max_num_batched_tokens"])
    model_config = ModelConfig(
        model=_model_dir(mml), skip_tokenizer_init=True, dtype="float32", max_model_len=mml, seed=0
    )
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
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )
    num_blocks = int(k["num_gpu_blocks"]) + 1  # + vLLM's null block (block 0, never handed out)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn"],
                FullAttentionSpec(block_size=int(k["block_size"]), num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
        ],
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
