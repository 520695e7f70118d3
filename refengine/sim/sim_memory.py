"""The simulated GPU's memory: the dtypes it runs in, and the KV pool left beside the weights (`SimDevice`,
refengine/sim/sim_device.py, sizes the engine's pool with it; perf's planner names dtypes with `sim_dtype`).

KV pool, as vLLM sizes it on a real GPU (refengine/kv_cache/kv_sizing.py draws the budget):
    blocks = (memory x gpu_memory_utilization - weight bytes - ACTIVATION_RESERVE_BYTES)
             // (KV bytes per token x block_size)

Imports neither torch nor numpy: perf plans a run with `sim_dtype` before either is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from refengine.sim.gpus import GpuSpec
    from refengine.sim.model_shape import ModelShape

GiB = 2**30
# The peak activations of vLLM's profiling forward (max_num_batched_tokens tokens) plus the memory torch does not
# allocate (CUDA context, cuBLAS workspaces). An estimate for 7-8B models at the default 8192-token budget, not a
# measurement: the whole reserve is a few percent of an 80 GiB GPU's KV cache, so an error in it moves little.
ACTIVATION_RESERVE_BYTES = int(1.5 * GiB)
SIM_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "fp8": "fp8"}


def sim_dtype(dtype: object) -> str:
    if dtype is None:
        return "bfloat16"
    name = str(dtype).removeprefix("torch.")
    if name == "float8_e4m3fn":
        return "fp8"
    if name not in SIM_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(SIM_DTYPES)} on a simulated GPU, got {dtype!r}")
    return SIM_DTYPES[name]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a sim_dtype() name (what `engine.dtype` reads on a simulated GPU)."""
    import torch

    return {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[name]


def num_sim_blocks(
    gpu: GpuSpec, shape: ModelShape, dtype: str, block_size: int, gpu_memory_utilization: float, tp: int = 1
) -> int:
    """The KV pool of the module docstring's formula, per GPU of the tensor-parallel group (each GPU holds its
    share of every block: its KV heads); ValueError naming the knob when it holds no block."""
    from refengine.sim.model_shape import KV_CACHE_DTYPE

    weights = shape.weight_bytes(dtype, tp)
    budget = int(gpu.memory_bytes * gpu_memory_utilization) - weights - ACTIVATION_RESERVE_BYTES
    per_block = shape.kv_bytes_per_token(KV_CACHE_DTYPE, tp) * block_size
    if budget < per_block:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization}: {gpu.name} x {gpu_memory_utilization} "
            f"leaves {budget / GiB:.2f} GiB after the weights ({weights / GiB:.2f} GiB per GPU at "
            f"tensor_parallel_size={tp}) and the activation reserve: no KV block fits"
        )
    return budget // per_block
