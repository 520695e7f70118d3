"""How many KV blocks an engine gets when num_gpu_blocks is not given: vLLM's gpu_worker.determine_available_memory.

On CUDA:
  1. free the memory of engines that are gone: gc.collect() + torch.cuda.empty_cache(), so that blocks the caching
     allocator still holds go back to the driver (without this, a second engine in one process saw the first one's
     cached memory as used and got 1 block);
  2. snapshot (mem_get_info, allocated, reserved), reset the peak statistics;
  3. profile_run: one forward at max_num_batched_tokens dummy tokens spread over min(max_num_seqs, tokens)
     sequences, plus logits for each and the sampler's sort, as vLLM's profile_run / _dummy_sampler_run;
  4. peak = torch.cuda.max_memory_allocated(); empty_cache(); snapshot again;
  5. KV budget = total * gpu_memory_utilization - (weights + peak activation increase + non-torch increase).

The budget is per engine, as vLLM's gpu_memory_utilization is per instance: memory others hold (other processes,
an engine of this process still alive) is not subtracted, but, as vLLM checks at start, it must leave
total * gpu_memory_utilization free. "Free" is the driver's free memory plus what this process's caching allocator
holds without using (reserved - allocated: blocks empty_cache could not hand back, a segment split by a live
tensor): the allocator serves the KV cache from those first, so counting them as used would refuse a second engine
its share of memory the first one left behind. A live engine's CUDA-graph pool is reserved and unused too, and
counted as free the same way: beside a live engine with graphs, size the second one with num_gpu_blocks.
The arithmetic is `kv_cache_budget` / `num_blocks_for_budget` (pure, tested on the CPU with mocked snapshots);
`profile_kv_budget` does the measuring, through `probe_memory` (one place to fake the device in a test).

    |<---------------------------- total ----------------------------->|
    |<----------- total * gpu_memory_utilization ------------>|        |
    | weights | peak activations | non-torch growth | KV cache |        |
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, cast

import torch

# (checks.py's, so that the configs, and the CLI that reads them, import without torch)
from refengine.checks import check_gpu_memory_utilization
from refengine.limits import cdiv

GiB = 2**30
# the CPU cache is reserved up front (calloc: pages become resident as blocks are written, model_runner._zeros);
# 1 GiB holds 262k tokens of tiny-qwen2
DEFAULT_CPU_KV_GB = 1.0


@dataclass(frozen=True)
class MemorySnapshot:
    """Device memory in bytes at one moment."""

    total: int
    free: int
    torch_allocated: int  # live tensors of this process's caching allocator
    torch_reserved: int  # what the allocator holds from the driver (live + cached)

    @property
    def non_torch(self) -> int:
        """Used, but not through torch's allocator: CUDA context, cuBLAS/NCCL buffers, other processes."""
        return max(0, self.total - self.free - self.torch_reserved)

    @property
    def usable(self) -> int:
        """What this process can still allocate: the driver's free memory plus the allocator's cached, unused
        blocks (reserved - allocated), which it hands out before it asks the driver for more."""
        return self.free + max(0, self.torch_reserved - self.torch_allocated)


@dataclass(frozen=True)
class KVBudget:
    requested: int  # total * gpu_memory_utilization
    weights: int
    torch_peak_increase: int  # activations of the profiling forward, above what was live before it
    non_torch_increase: int
    available: int  # for the KV cache: requested - the three above


def kv_cache_budget(
    before: MemorySnapshot, after: MemorySnapshot, torch_peak: int, weights: int, gpu_memory_utilization: float
) -> KVBudget:
    """vLLM's formula. `before`: after the weights are loaded and the cache emptied; `torch_peak`: the allocator's
    peak during the profiling forward; `after`: after it, cache emptied again."""
    check_gpu_memory_utilization(gpu_memory_utilization)
    requested = int(before.total * gpu_memory_utilization)
    # vLLM checks free memory >= requested before it loads the weights; here they are loaded: count them as free
    if before.usable + weights < requested:
        used = before.total - before.usable - weights
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} asks for {requested / GiB:.2f} GiB of the device's "
            f"{before.total / GiB:.2f} GiB, but {used / GiB:.2f} GiB are already used by others (another engine or "
            f"process): lower gpu_memory_utilization, free that memory, or set num_gpu_blocks / kv_cache_memory_gb"
        )
    torch_peak_increase = max(0, torch_peak - before.torch_allocated)
    non_torch_increase = max(0, after.non_torch - before.non_torch)
    available = requested - weights - torch_peak_increase - non_torch_increase
    return KVBudget(requested, weights, torch_peak_increase, non_torch_increase, available)


def num_blocks_for_budget(
    available: int,
    bytes_per_block: int,
    block_size: int,
    max_model_len: int,
    gpu_memory_utilization: float | None = None,
) -> int:
    """KV blocks that fit `available` bytes; ValueError when they cannot hold one request of max_model_len tokens
    (vLLM's check_enough_kv_cache_memory)."""
    num_blocks = max(0, available) // bytes_per_block
    need = cdiv(max_model_len, block_size)
    if num_blocks < need:
        knob = f"raise gpu_memory_utilization (now {gpu_memory_utilization}), " if gpu_memory_utilization else ""
        raise ValueError(
            f"the KV cache budget ({max(0, available) / GiB:.2f} GiB, {num_blocks} blocks of {block_size} tokens) "
            f"cannot hold one request of max_model_len={max_model_len} tokens ({need} blocks, "
            f"{need * bytes_per_block / GiB:.2f} GiB); the estimated maximum model length is "
            f"{num_blocks * block_size}: {knob}lower max_model_len, or set num_gpu_blocks / kv_cache_memory_gb"
        )
    return int(num_blocks)


def probe_memory(device: torch.device) -> MemorySnapshot:
    """The device's memory now, as the driver and this process's caching allocator see it (no collection)."""
    free, total = torch.cuda.mem_get_info(device)
    return MemorySnapshot(total, free, torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))


def usable_memory(device: torch.device) -> int:
    """Bytes this process can still allocate on `device` (MemorySnapshot.usable)."""
    return probe_memory(device).usable


def take_snapshot(device: torch.device) -> MemorySnapshot:
    gc.collect()  # engines gone but caught in reference cycles free their tensors now
    torch.cuda.empty_cache()
    return probe_memory(device)


def model_bytes(model: torch.nn.Module) -> int:
    """Parameters and buffers (a tied weight once)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


@torch.inference_mode()
def profile_run(
    model: torch.nn.Module,
    model_config: Any,
    *,
    device: torch.device,
    dtype: torch.dtype,
    num_tokens: int,
    num_seqs: int,
    block_size: int,
    max_model_len: int,
) -> None:
    """One forward over `num_tokens` dummy tokens (zeros) in min(num_seqs, num_tokens) prefill sequences, then
    logits for each sequence and the sampler's sort over them: the step that needs the most activation memory.

    The KV cache is a single block per layer, which every block table points at, and slot_mapping is all padding
    (-1), so nothing is written: only the activations are measured, not a real cache."""
    from refengine.layers.attention import AttentionMetadata

    num_seqs = max(1, min(num_seqs, num_tokens))
    num_tokens = min(num_tokens, num_seqs * max_model_len)
    lens = [num_tokens // num_seqs + (1 if i < num_tokens % num_seqs else 0) for i in range(num_seqs)]
    mc = model_config
    cache_shape = (1, block_size, mc.num_key_value_heads, mc.head_dim)
    kv_caches = [
        (torch.zeros(cache_shape, dtype=dtype, device=device), torch.zeros(cache_shape, dtype=dtype, device=device))
        for _ in range(mc.num_hidden_layers)
    ]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    meta: dict[str, Any] = dict(  # AttentionMetadata's fields, of mixed types
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_table=torch.zeros(num_seqs, cdiv(max(lens), block_size), dtype=torch.int32, device=device),
        max_query_len=max(lens),
        max_seq_len=max(lens),
    )
    names = {f.name for f in fields(AttentionMetadata)}
    host = {"query_start_loc_cpu": qsl, "seq_lens_cpu": lens}  # host copies, where the metadata carries them
    meta.update({k: v for k, v in host.items() if k in names})
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    input_ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    hidden = model(input_ids, positions, kv_caches, AttentionMetadata(**meta))  # [T, hidden]
    last = torch.tensor(qsl[1:], device=device) - 1
    # (a Module's attributes type as Tensor | Module: the model's interface says this one is a method)
    compute_logits = cast("Callable[[torch.Tensor], torch.Tensor]", model.compute_logits)
    logits = compute_logits(hidden[last])  # [S, vocab] float32
    logits.softmax(dim=-1).sort(dim=-1, descending=True)  # top-k / top-p sampling sorts the probabilities
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_kv_budget(
    model: torch.nn.Module,
    model_config: Any,
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    max_model_len: int,
    gpu_memory_utilization: float,
) -> KVBudget:
    """Measure (steps 1-4 of the module docstring) and apply `kv_cache_budget`."""
    before = take_snapshot(device)
    torch.cuda.reset_peak_memory_stats(device)
    profile_run(
        model,
        model_config,
        device=device,
        dtype=dtype,
        num_tokens=max_num_batched_tokens,
        num_seqs=max_num_seqs,
        block_size=block_size,
        max_model_len=max_model_len,
    )
    peak = torch.cuda.max_memory_allocated(device)
    after = take_snapshot(device)
    return kv_cache_budget(before, after, peak, model_bytes(model), gpu_memory_utilization)


def default_num_gpu_blocks(
    model: torch.nn.Module,
    model_config: Any,
    *,
    device: torch.device,
    dtype: torch.dtype,
    bytes_per_block: int,
    block_size: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    kv_cache_memory_gb: float | None,
    gpu_memory_utilization: float,
) -> int:
    """num_gpu_blocks when it is not given: from kv_cache_memory_gb if set, else profiled on CUDA, else 1 GiB."""
    if kv_cache_memory_gb is not None:
        return max(1, int(kv_cache_memory_gb * GiB // bytes_per_block))
    if device.type != "cuda":
        return max(1, int(DEFAULT_CPU_KV_GB * GiB // bytes_per_block))
    budget = profile_kv_budget(
        model,
        model_config,
        device=device,
        dtype=dtype,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    return num_blocks_for_budget(budget.available, bytes_per_block, block_size, max_model_len, gpu_memory_utilization)
