"""What LLMEngine does once, before serving: load (or share) the model, size the KV cache, check memory.

Presets are pure functions of (name, seed, device, dtype, backend), so engines in one process share their weights
(inference only); a folder is read afresh each time. The KV cache is sized from memory (refengine/kv_sizing.py)
unless num_gpu_blocks is given, and every failure is told as the knob that caused it.
"""

from __future__ import annotations

import functools

import torch

from refengine.config import EngineConfig, SchedulerConfig
from refengine.kv_sizing import default_num_gpu_blocks
from refengine.limits import cdiv
from refengine.model import ModelConfig


def kv_bytes_per_block(mc: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * mc.num_hidden_layers * block_size * mc.num_key_value_heads * mc.head_dim * elem


@functools.lru_cache(maxsize=2)
def _preset_model(model: str, device: torch.device, dtype: torch.dtype, seed: int, backend: str):
    from refengine.loader import load_model

    return load_model(model, device=device, dtype=dtype, seed=seed, attention_backend=backend)


def _load_model_cached(model: str, device: torch.device, dtype: torch.dtype, seed: int, backend: str):
    """(model, ModelConfig): a preset's weights shared between engines, a folder's loaded afresh."""
    from refengine.loader import PRESETS, load_model

    if model in PRESETS:
        return _preset_model(model, device, dtype, seed, backend)
    return load_model(model, device=device, dtype=dtype, seed=seed, attention_backend=backend)


def sized_num_blocks(
    model: torch.nn.Module,
    mc: ModelConfig,
    cfg: EngineConfig,
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_model_len: int,
) -> int:
    """num_gpu_blocks from memory (kv_sizing.default_num_gpu_blocks), its failures told as the knob that caused
    them. `cfg.scheduler` holds the caller's knobs (its num_gpu_blocks is not read)."""
    sc = cfg.scheduler
    per_block = kv_bytes_per_block(mc, sc.block_size, dtype)
    if cfg.kv_cache_memory_gb is not None and cfg.kv_cache_memory_gb * 2**30 < per_block:
        raise ValueError(
            f"kv_cache_memory_gb={cfg.kv_cache_memory_gb} holds no KV block of {sc.block_size} tokens "
            f"({per_block} bytes)"
        )
    try:
        return default_num_gpu_blocks(
            model,
            mc,
            device=device,
            dtype=dtype,
            block_size=sc.block_size,
            bytes_per_block=per_block,
            max_model_len=max_model_len,
            kv_cache_memory_gb=cfg.kv_cache_memory_gb,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_num_batched_tokens=sc.max_num_batched_tokens,
            max_num_seqs=sc.max_num_seqs,
        )
    except torch.cuda.OutOfMemoryError as exc:  # the profiling forward of max_num_batched_tokens tokens
        raise ValueError(
            f"max_num_batched_tokens={sc.max_num_batched_tokens}: one step of that many tokens does "
            f"not fit in device memory ({exc}); lower it"
        ) from None


def check_engine_memory(
    mc: ModelConfig, sc: SchedulerConfig, *, num_rows: int, kv_field: str, device: torch.device, dtype: torch.dtype
) -> None:
    """Before anything is allocated: the KV caches and the input batch must fit in the memory free now."""
    from refengine.loader import check_memory

    per_block = kv_bytes_per_block(mc, sc.block_size, dtype)
    host = torch.device("cpu")
    batch_row = (sc.max_model_len + cdiv(sc.max_model_len, sc.block_size)) * 4  # int32 token ids + block table
    check_memory(
        device,
        [
            (kv_field, sc.num_gpu_blocks * per_block, device),
            ("num_cpu_blocks", sc.num_cpu_blocks * per_block, host),
            ("max_num_seqs", num_rows * batch_row, host),
        ],
    )
