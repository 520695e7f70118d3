"""SimBackend: what LLMEngine needs in place of a device, a model and a runner when `device="sim:<gpu>"`.

The engine keeps its real scheduler, KV cache manager, block pool, processor and output processor; this supplies
the model's bookkeeping config and tokenizer (no weights), the KV pool size, the virtual clock, the simulated
runner and the label that reports name the run by.

KV pool, as vLLM sizes it on a real GPU (refengine/kv_sizing.py draws the budget):
    blocks = (memory x gpu_memory_utilization - weight bytes - ACTIVATION_RESERVE_BYTES)
             // (KV bytes per token x block_size)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from refengine.engine_setup import EngineParts
from refengine.model import ModelConfig
from refengine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from refengine.sim.clock import VirtualClock
from refengine.sim.cost_model import COST_MODEL_VERSION, CostModel
from refengine.sim.model_shape import ModelShape
from refengine.sim.device import parse_sim_device
from refengine.sim.gpus import GpuSpec
from refengine.sim.presets import sim_model
from refengine.sim.runner import SimBatchQueue, SimModelRunner, sim_token_id
from refengine.tokenizer import Tokenizer

GiB = 2**30
# The peak activations of vLLM's profiling forward (max_num_batched_tokens tokens) plus the memory torch does not
# allocate (CUDA context, cuBLAS workspaces). An estimate for 7-8B models at the default 8192-token budget, not
# measured here: it only moves the pool by ~1.5 GiB, a few percent of an 80 GiB GPU's KV cache.
ACTIVATION_RESERVE_BYTES = int(1.5 * GiB)
SIM_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "fp8": "fp8"}
# vLLM's kv_cache_dtype="auto" keeps the KV cache in the activation dtype, bf16, also for fp8 weights
KV_CACHE_DTYPE = "bfloat16"
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def sim_dtype(dtype: object) -> str:
    if dtype is None:
        return "bfloat16"
    name = str(dtype).removeprefix("torch.")
    if name == "float8_e4m3fn":
        return "fp8"
    if name not in SIM_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(SIM_DTYPES)} on a simulated GPU, got {dtype!r}")
    return SIM_DTYPES[name]


def num_sim_blocks(
    gpu: GpuSpec, shape: ModelShape, dtype: str, block_size: int, gpu_memory_utilization: float, tp: int = 1
) -> int:
    """The KV pool of the module docstring's formula, per GPU of the tensor-parallel group (each GPU holds its
    share of every block: its KV heads); ValueError naming the knob when it holds no block."""
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


@dataclass
class SimBackend:
    gpu: GpuSpec
    dtype: str
    model_config: ModelConfig
    shape: ModelShape
    tokenizer: Tokenizer
    clock: VirtualClock
    tensor_parallel_size: int = 1

    @classmethod
    def create(cls, device: str, model: str, dtype: object, tensor_parallel_size: int = 1) -> SimBackend:
        gpu = parse_sim_device(device)
        name = sim_dtype(dtype)
        mc, shape, tokenizer = sim_model(model)
        shape.check_tp(tensor_parallel_size)
        return cls(gpu, name, mc, shape, tokenizer, VirtualClock(), tensor_parallel_size)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.dtype]

    @property
    def device_label(self) -> str:
        """What reports put in titles and rows, e.g. "simulated H200 (cost model sim-2 (...), bfloat16)", and
        "simulated 4x H200 (...)" for a tensor-parallel group."""
        gpus = f"{self.tensor_parallel_size}x {self.gpu.name}" if self.tensor_parallel_size > 1 else self.gpu.name
        return f"simulated {gpus} (cost model {COST_MODEL_VERSION}, {self.dtype})"

    def parts(self) -> EngineParts:
        """LLMEngine's parts: the scheduler's data lives on the host, and there is no model."""
        return torch.device("cpu"), self.torch_dtype, None, "sim", self.model_config, self.tokenizer

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        return num_sim_blocks(
            self.gpu, self.shape, self.dtype, block_size, gpu_memory_utilization, self.tensor_parallel_size
        )

    def make_runner(self, async_scheduling: bool) -> SimModelRunner:
        cost = CostModel(
            self.gpu,
            self.shape,
            self.dtype,
            async_scheduling=async_scheduling,
            tensor_parallel_size=self.tensor_parallel_size,
        )
        mc = self.model_config
        return SimModelRunner(cost, self.clock, sim_token_id(mc.eos_token_ids, mc.vocab_size))

    @staticmethod
    def batch_queue(execute_model: Callable[[SchedulerOutput], ModelRunnerOutput]) -> SimBatchQueue:
        return SimBatchQueue(execute_model)
