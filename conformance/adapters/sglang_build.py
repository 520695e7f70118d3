"""Builds SGLang 0.5.23's `Scheduler` without its `__init__` (which loads a model, joins process groups and binds ZMQ
sockets): the configuration is published the way SGLang publishes it for a process (`runtime_context.publish` of a
`ServerArgs`), the memory pools and the radix cache are SGLang's own on the CPU, and the scheduler's own `init_*`
methods that need no model build its running state, chunked-prefill state, schedule policy, result processor and
the rest. What stands in for the model worker and the server's plumbing (`_Absent`, `_ModelRunner`) only answers
what the per-step code asks of them (no attention tile size, no SWA, no n-gram embedding, no metrics, no output
sockets); it computes nothing the scheduler decides on.

Pinned to one SGLang release: the attributes set here are the ones its per-step code reads in 0.5.23.
"""

from __future__ import annotations

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: F401  (imported for its side effects first)
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import SpawnRanks, get_context, get_schedule, publish, reset_context
from sglang.srt.server_args import ServerArgs

# SGLang's default gap (--priority-scheduling-preemption-threshold): a waiting request preempts a running one only
# when more urgent by more than this. Our draws use priorities 0..3, so the adapter takes SGLang's rule with a gap of
# 0 (strictly more urgent), the only gap at which it can act on them; the default is stated in the docs.
PRIORITY_GAP = 0


class _Absent:
    """A component the model-free scheduler does not have (metrics, output sockets, a grammar backend, a load
    publisher): every attribute it has not been given is None, every call returns None, and it is false."""

    def __init__(self, **given) -> None:
        self.__dict__.update(given)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _absent_call

    def __bool__(self) -> bool:
        return False


def _absent_call(*args, **kwargs):
    return None


class _ModelConfig:
    """The model facts the scheduler reads, for no model: no multimodal input, no reasoning markers, no special
    EOS; every other fact is None."""

    vocab_size = 1 << 20
    is_multimodal = False

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _PassThrough:
    """A per-step hook whose every method hands its first argument back unchanged (the DP-attention adapter's
    batch preparation, the n-gram embedding manager's prepare_for_forward: none applies to one CPU rank)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda first=None, *args, **kwargs: first


def server_args(k: dict) -> ServerArgs:
    budget = int(k["max_num_batched_tokens"])
    return ServerArgs(
        model_path="dummy",
        device="cpu",
        page_size=int(k["block_size"]),
        chunked_prefill_size=budget if k["enable_chunked_prefill"] else -1,
        max_prefill_tokens=budget,
        max_running_requests=int(k["max_num_seqs"]),
        disable_radix_cache=not k["enable_prefix_caching"],
        enable_mixed_chunk=k["batching"] == "continuous",
        schedule_policy="fcfs",
        enable_priority_scheduling=k["policy"] == "priority",
        schedule_low_priority_values_first=True,
        disable_priority_preemption=not k["priority_preemption"],
        priority_scheduling_preemption_threshold=PRIORITY_GAP,
        disable_overlap_schedule=True,
        radix_eviction_policy="lru",
    )


def context_len(k: dict) -> int:
    """The longest sequence a request row holds: the KV pool (no request can outgrow it) capped by max_model_len."""
    return min(int(k["max_model_len"]), int(k["num_gpu_blocks"]) * int(k["block_size"]) + 2)


def build_pools(k: dict):
    page = int(k["block_size"])
    size = int(k["num_gpu_blocks"]) * page
    req_pool = ReqToTokenPool(
        size=int(k["max_num_seqs"]) + 1, max_context_len=context_len(k), device="cpu", enable_memory_saver=False
    )
    # one layer, one head of 1 float: the scheduler never reads the KV values, only their slots
    kv = MHATokenToKVPool(
        size=size,
        page_size=page,
        dtype=torch.float32,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    if page == 1:
        alloc = TokenToKVPoolAllocator(size=size, dtype=torch.float32, device="cpu", kvcache=kv, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(
            size=size, page_size=page, dtype=torch.float32, device="cpu", kvcache=kv, need_sort=False
        )
    cache = UnifiedRadixCache(
        params=CacheInitParams(
            disable=not k["enable_prefix_caching"],
            req_to_token_pool=req_pool,
            token_to_kv_pool_allocator=alloc,
            page_size=page,
            eviction_policy="lru",
            chunked_prefill_size=int(k["max_num_batched_tokens"]) if k["enable_chunked_prefill"] else None,
            tree_components=(ComponentType.FULL,),  # full attention only: no SWA, no Mamba state
        )
    )
    return req_pool, alloc, cache


def build_scheduler(k: dict) -> Scheduler:
    args = server_args(k)
    reset_context()
    publish(args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    s = Scheduler.__new__(Scheduler)
    s.server_args = args
    req_pool, alloc, cache = build_pools(k)
    s.req_to_token_pool, s.token_to_kv_pool_allocator, s.tree_cache = req_pool, alloc, cache
    s.page_size = int(k["block_size"])
    s.max_running_requests = int(k["max_num_seqs"])
    s.max_prefill_tokens = int(k["max_num_batched_tokens"])
    s.max_total_num_tokens = int(k["num_gpu_blocks"]) * int(k["block_size"])
    s.max_req_len = context_len(k)
    s.max_req_input_len = context_len(k) - 1
    s.device = "cpu"
    _set_state(s, args)
    return s


def _set_state(s: Scheduler, args: ServerArgs) -> None:
    """The attributes the per-step code reads, as Scheduler.__init__ sets them for one CPU rank with no model, no
    speculative decoding, no disaggregation, no LoRA, no hierarchical cache; the scheduler's own init_* where they
    need no model."""
    from collections import deque

    from sglang.srt.beam_search.coordinator import BeamCoordinator
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.environ import envs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sched = get_schedule()
    # what init_model_worker does once the worker reported max_running_requests (one pipeline stage here)
    get_context().override(
        "scheduler.pp_max_micro_batch_size_default", pp_max_micro_batch_size=max(s.max_running_requests, 1)
    )
    s.schedule_policy = sched.schedule_policy
    s.enable_priority_scheduling = sched.enable_priority_scheduling
    s.abort_on_priority_when_disabled = False
    s.schedule_low_priority_values_first = sched.schedule_low_priority_values_first
    s.priority_scheduling_preemption_threshold = sched.priority_scheduling_preemption_threshold
    s.enable_overlap = False
    s.enable_overlap_mlx = False
    s.spec_algorithm = SpeculativeAlgorithm.from_string(None)
    for flag in (
        "enable_lora",
        "enable_hierarchical_cache",
        "enable_lmcache",
        "enable_hicache_storage",
        "enable_unified_cache_external_linker",
        "enable_hisparse",
        "enable_session_radix_cache",
        "enable_fpm",
        "is_hybrid_swa",
        "is_hybrid_ssm",
        "require_mlp_sync",
        "enable_pdmux",
    ):
        setattr(s, flag, False)
    s.is_generation = True
    s.disaggregation_mode = DisaggregationMode.NULL
    s.model_config = _ModelConfig()
    s.tp_worker = s.model_worker = _Absent(model_runner=_Absent(attn_backend=object(), prefill_aware_swa=False))
    s.draft_worker = None
    s.dllm_config = s.dllm_manager = None
    s.hisparse_coordinator = s.decode_offload_manager = None
    s.mm_receiver = s.lora_drainer = s.min_free_slots_delayer = s.dynamic_chunk_sizer = None
    s.truncation_align_size = None
    s.sliding_window_size = None
    s.max_queued_requests = None
    s.max_new_tokens_limit = envs.SGLANG_MAX_NEW_TOKENS_LIMIT.get()
    s.kv_shard_widening = 1
    s.processed_tokens_counter = 0
    s.future_map = None
    s.metrics_collector = None
    # metrics off; the counters the result processor adds to still count
    s.metrics_reporter = _Absent(
        enable_metrics=False,
        current_scheduler_metrics_enabled=False,
        is_stats_logging_rank=False,
        num_generated_tokens=0,
        forward_ct_decode=0,
        num_retracted_reqs=0,
        last_gen_throughput=0.0,
        spec_total_num_accept_tokens=0,
        spec_total_num_forward_ct=0,
        metrics_collector=None,
    )
    s.output_streamer = _Absent()
    s.grammar_manager = _Absent()
    s.load_inquirer = _Absent()
    s.load_publisher = _Absent()
    s.pool_stats_observer = _Absent()
    s.dp_attn_adapter = _PassThrough()
    s.ngram_embedding_manager = _PassThrough()
    s.send_abort_output = _absent_call  # to the tokenizer's socket
    s.scheduler_stage_metrics = None  # the stage-timing recorder of its event loop
    # chunked prefill (init_chunked_prefill, less its multimodal-with-transformers-backend case)
    s.chunked_prefill_size = sched.chunked_prefill_size if (sched.chunked_prefill_size or 0) > 0 else None
    s.prefill_decode_interval = 0
    s._prefill_decode_interval_remaining = 0
    s.prefill_decode_interval_min_bs = 0
    s.chunked_req = None
    s._pending_chunked_abort_req = None
    s.is_mixed_chunk = s.chunked_prefill_size is not None and sched.enable_mixed_chunk
    s.init_running_status()
    s.result_queue = deque()
    s.init_schedule_policy()
    s.beam_coordinator = BeamCoordinator(
        model_config=s.model_config,
        spec_algorithm=s.spec_algorithm,
        dllm_enabled=False,
        max_req_len=s.max_req_len,
        req_to_token_pool=s.req_to_token_pool,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        tree_cache=s.tree_cache,
        future_map=None,
    )
    s.init_batch_result_processor()
