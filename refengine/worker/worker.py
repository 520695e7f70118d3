"""A local device's set-up, before serving (refengine/worker/device.py's LocalDevice): load (or share) the model, size the
KV pool, check memory, make a runner; and EngineParts, what every Device hands the engine.

Presets are pure functions of (name, seed, device, dtype, backend), so engines in one process share their weights
(inference only) while one of them is alive, and a device's weights go with the last engine using them; a folder
is read afresh each time. `empty_runner` and `return_device_memory` are the other end of an engine's life: what it
allocated goes back to the device (LLMEngine.shutdown, or the engine's collection). The KV cache is sized from
memory (refengine/kv_cache/kv_sizing.py) unless num_gpu_blocks is given, and every failure is told as the knob
that caused it.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from refengine.config import EngineConfig, SchedulerConfig
from refengine.kv_cache.kv_sizing import default_num_gpu_blocks, usable_memory
from refengine.limits import cdiv
from refengine.models.decoder import CausalLM
from refengine.models.model_config import ModelConfig
from refengine.tokenizer import Tokenizer

if TYPE_CHECKING:  # (the runner imports the model)
    from refengine.worker.model_runner import ModelRunner, Sampler

# (device, dtype, model, attention_backend, model_config, tokenizer): what an engine runs on; the model is None on
# a simulated GPU, which has no weights
EngineParts = tuple[torch.device, torch.dtype, torch.nn.Module | None, str, ModelConfig, Tokenizer]


def kv_bytes_per_block(mc: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * mc.num_hidden_layers * block_size * mc.num_key_value_heads * mc.head_dim * elem


PresetKey = tuple[str, torch.device, torch.dtype, int, str]  # (preset, device, dtype, seed, attention backend)
# weights an engine of this process still uses: held weakly, so a device's weights go with the last engine on them
_LIVE_PRESETS: weakref.WeakValueDictionary[PresetKey, CausalLM] = weakref.WeakValueDictionary()
# host weights are also kept strongly, the newest few: engines made one after another (the CPU tests make
# hundreds) draw a preset's weights once; a device's never are, or a dropped engine would pin device memory
_HOST_PRESETS: collections.OrderedDict[PresetKey, CausalLM] = collections.OrderedDict()
HOST_PRESETS_KEPT = 2
# weights held for a caller that makes engines of one model one after another (`keep_preset_weights`)
_KEPT: dict[PresetKey, CausalLM] = {}
_keepers = 0


def _preset_model(
    model: str, device: torch.device, dtype: torch.dtype, seed: int, backend: str
) -> tuple[CausalLM, ModelConfig]:
    from refengine.models.loader import load_model

    key = (model, device, dtype, seed, backend)
    lm = _LIVE_PRESETS.get(key)
    if lm is None:
        lm, _ = load_model(model, device=device, dtype=dtype, seed=seed, attention_backend=backend)
        _LIVE_PRESETS[key] = lm
    if _keepers:
        _KEPT[key] = lm
    if device.type == "cpu":
        _HOST_PRESETS[key] = lm
        _HOST_PRESETS.move_to_end(key)
        while len(_HOST_PRESETS) > HOST_PRESETS_KEPT:
            _HOST_PRESETS.popitem(last=False)
    return lm, lm.config


@contextlib.contextmanager
def keep_preset_weights() -> Iterator[None]:
    """Inside: the preset weights engines load stay loaded between them, until the (outermost) block ends. For a
    caller that runs engine after engine on one model (`cbbench perf`'s configurations): drawing an 8B preset's
    weights again for each one costs most of a minute. At the end the device's are given back."""
    global _keepers
    _keepers += 1
    try:
        yield
    finally:
        _keepers -= 1
        if not _keepers:
            devices = {key[1] for key in _KEPT}
            _KEPT.clear()
            for device in devices:
                return_device_memory(device)


def shared_presets() -> list[PresetKey]:
    """The preset weights this process holds now (those of live engines, and the host's newest)."""
    return list(_LIVE_PRESETS.keys())


def _load_model_cached(
    model: str, device: torch.device, dtype: torch.dtype, seed: int, backend: str
) -> tuple[CausalLM, ModelConfig]:
    """(model, ModelConfig): a preset's weights shared between engines, a folder's loaded afresh."""
    from refengine.models.loader import load_model
    from refengine.models.presets import PRESETS

    if model in PRESETS:
        return _preset_model(model, device, dtype, seed, backend)
    return load_model(model, device=device, dtype=dtype, seed=seed, attention_backend=backend)


def load_on_device(cfg: EngineConfig, model_impl: torch.nn.Module | None) -> EngineParts:
    """The EngineParts of a real device: `model_impl` (for `cfg.model`'s config) or the loaded weights."""
    from refengine.layers.attention import default_backend_name, get_attention_backend
    from refengine.models.loader import check_attention_backend, resolve_device, resolve_dtype
    from refengine.models.presets import load_model_config, load_tokenizer

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    backend = cfg.attention_backend or default_backend_name(device)
    check_attention_backend(backend, device)
    module: torch.nn.Module
    if model_impl is None:
        module, model_config = _load_model_cached(cfg.model, device, dtype, cfg.seed, backend)
    else:
        module, model_config = model_impl, load_model_config(cfg.model)
    return device, dtype, module, get_attention_backend(backend).name, model_config, load_tokenizer(cfg.model)


def kv_budget_knob(cfg: EngineConfig, device: torch.device) -> str:
    """The knob that sizes a KV pool drawn from memory, which its errors name: kv_cache_memory_gb when given or off
    CUDA (the host's budget), else gpu_memory_utilization."""
    uses_budget = cfg.kv_cache_memory_gb is not None or device.type != "cuda"
    return "kv_cache_memory_gb" if uses_budget else "gpu_memory_utilization"


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


def _host_memory_total() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(device: torch.device, needs: list[tuple[str, int, torch.device]]) -> None:
    """The engine's up-front buffers, as (knob that sizes it, bytes, device), must fit: on CUDA in the memory this
    process can still allocate now (kv_sizing.usable_memory), on the host in its physical memory (not what is free this moment: pages are committed lazily, and a busy
    shared machine must not turn a good config into an error). Otherwise ValueError naming the knob, instead of a
    failed allocation or, on the host, a later OOM kill."""
    room = {"cpu": _host_memory_total()}
    if device.type == "cuda":
        room["cuda"] = usable_memory(device)  # the allocator's cached, unused blocks count: it reuses them first
    for name, nbytes, where in needs:
        left = room[where.type]
        if nbytes > left:
            what = "free on the device" if where.type == "cuda" else "left of the host's memory"
            raise ValueError(
                f"{name}: the engine would allocate {nbytes / 2**30:.2f} GiB on {where.type}, but only "
                f"{left / 2**30:.2f} GiB is {what}"
            )
        room[where.type] = left - nbytes


def check_engine_memory(
    mc: ModelConfig, sc: SchedulerConfig, *, num_rows: int, kv_field: str, device: torch.device, dtype: torch.dtype
) -> None:
    """Before anything is allocated: the KV caches and the input batch must fit in the memory free now."""
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


def make_model_runner(parts: EngineParts, cfg: EngineConfig, *, num_rows: int, sampler: Sampler) -> ModelRunner:
    """The runner of a real device, for `cfg` once its KV pool and max_model_len are resolved."""
    from refengine.worker.model_runner import ModelRunner

    device, dtype, model, _, mc, _ = parts
    assert model is not None, "a real device always has a model (EngineParts)"
    sc = cfg.scheduler
    return ModelRunner(
        model,
        mc,
        num_gpu_blocks=sc.num_gpu_blocks,
        num_cpu_blocks=sc.num_cpu_blocks,
        block_size=sc.block_size,
        max_num_seqs=num_rows,
        max_model_len=sc.max_model_len,
        device=device,
        dtype=dtype,
        seed=cfg.seed,
        max_num_batched_tokens=sc.max_num_batched_tokens,
        enforce_eager=cfg.enforce_eager,
        sampler=sampler,
    )


def warm_up_attention(parts: EngineParts, block_size: int, max_model_len: int) -> None:
    """Compile the Triton kernels now (attention and the decoder layer's fused kernels), not in a measured step
    (only they need it, only on CUDA)."""
    device, dtype, _, backend, mc, _ = parts
    if backend != "triton" or device.type != "cuda":
        return
    from cbbench.kernels.warmup import warmup_attention_kernels, warmup_layer_kernels

    warmup_attention_kernels(
        mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, block_size, dtype, max_model_len, device
    )
    warmup_layer_kernels(
        mc.hidden_size, mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, mc.intermediate_size, dtype, device
    )


def empty_runner(runner: object) -> None:
    """An engine shuts down: empty its runner's device buffers in place (the KV caches, the pinned host swap space,
    the CUDA graphs and their pool), so that a reference someone else keeps to the runner pins no device memory."""
    from refengine.worker.model_runner import ModelRunner

    if not isinstance(runner, ModelRunner):  # (a stand-in runner of a test or a benchmark: nothing of ours)
        return
    if runner.cuda_graphs is not None:
        runner.cuda_graphs.release()
    runner.kv_caches.clear()  # (the list the graphs share: cleared in place, not replaced)
    runner.host_caches.clear()


def return_device_memory(device: torch.device) -> None:
    """Once nothing holds an engine's tensors: on CUDA collect (a reference cycle may still hold one) and hand the
    caching allocator's unused blocks back to the driver, for other processes and the next engine's sizing."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
