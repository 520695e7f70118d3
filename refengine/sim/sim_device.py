"""`device="sim:<gpu>"`: parsing the device string of a simulated GPU, and `SimDevice`, the engine's Device there.

SimDevice is the simulated side of refengine/worker/device.py's seam: the engine keeps its real scheduler, KV cache
manager, block pool, processor and output processor; this supplies the model's bookkeeping config and tokenizer
(no weights), the KV pool size (refengine/sim/sim_memory.py's formula), the virtual clock, the simulated runner and
its thread-less batch queue, the pacer that serves it in real time, and the label that reports name the run by.

`DeviceSpec` is the one reading of a device string: what it names (the CPU, a CUDA device, a simulated GPU) and
what differs for it, asked without building an engine. perf's planner reads it before torch or numpy is needed
(perf/tests/test_cli_fast.py), so SimDevice imports the simulation's heavy parts (cost model, runner, presets)
where it first uses them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from refengine.clock import VirtualClock
from refengine.sim.gpus import GPUS, GpuSpec, get_gpu
from refengine.sim.pacing import StepPacer
from refengine.sim.sim_memory import num_sim_blocks, sim_dtype, torch_dtype

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from refengine.config import EngineConfig
    from refengine.models.model_config import ModelConfig
    from refengine.outputs import RequestOutput
    from refengine.scheduler.scheduler_output import ModelRunnerOutput, SchedulerOutput
    from refengine.sim.model_shape import ModelShape
    from refengine.sim.runner import SimBatchQueue, SimModelRunner
    from refengine.tokenizer import Tokenizer
    from refengine.worker.model_runner import Sampler
    from refengine.worker.worker import EngineParts

SIM_PREFIX = "sim:"
_LOCAL = re.compile(r"(cpu|cuda)(:\d+)?")


@dataclass(frozen=True)
class DeviceSpec:
    """What a device string names, read without building an engine or importing torch: the CPU, a CUDA device, a
    simulated GPU ("sim:h200", any case), or ("other") a string only torch can judge. The engine's `make_device`
    and perf's planner both ask it, so that one place knows how device strings are spelled."""

    name: str  # as given
    kind: str  # "cpu" | "cuda" | "sim" | "other"
    gpu: GpuSpec | None = None  # the simulated GPU's spec

    @classmethod
    def parse(cls, device: str) -> DeviceSpec:
        """ValueError naming `device` and the known GPUs for a "sim:" name that is not one of them."""
        text = device.strip().lower()
        if is_sim_device(text):
            key = {g.lower(): g for g in GPUS}.get(text[len(SIM_PREFIX) :])
            if key is None:
                raise ValueError(f"device {device!r} is not a simulated GPU; known: {', '.join(known_sim_devices())}")
            return cls(device, "sim", get_gpu(key))
        local = _LOCAL.fullmatch(text)
        return cls(device, local.group(1) if local else "other")

    @classmethod
    def checked(cls, device: str) -> DeviceSpec:
        """`parse`, refusing a string that is neither cpu, cuda[:N] nor a simulated GPU (the command line's rule)."""
        spec = cls.parse(device)
        if spec.kind == "other" or (spec.kind == "cpu" and ":" in device):
            raise ValueError(
                f"device must be cpu, cuda, cuda:N or a simulated GPU ({', '.join(known_sim_devices())}), "
                f"got {device!r}"
            )
        return spec

    @property
    def simulated(self) -> bool:
        """A cost model stands in for the forward: no weights, a virtual clock, times in simulated GPU seconds."""
        return self.kind == "sim"

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def tensor_parallel_ok(self) -> bool:
        """Whether the device takes tensor_parallel_size > 1: refengine's own forward runs on one device."""
        return self.simulated

    @property
    def label(self) -> str:
        """ "simulated H200" for a simulated GPU, else the device as given."""
        return f"simulated {self.gpu.name.upper()}" if self.gpu is not None else self.name


def is_sim_device(device: object) -> bool:
    """A "sim:" name, known GPU or not (`DeviceSpec.parse` tells which)."""
    return isinstance(device, str) and device.strip().lower().startswith(SIM_PREFIX)


def known_sim_devices() -> list[str]:
    return [SIM_PREFIX + g.lower() for g in GPUS]


def parse_sim_device(device: str) -> GpuSpec:
    """ "sim:h200" (any case) -> the H200's spec; ValueError naming `device` and the known GPUs for anything else."""
    gpu = DeviceSpec.parse(device).gpu
    if gpu is None:
        raise ValueError(f"device {device!r} is not a simulated GPU; known: {', '.join(known_sim_devices())}")
    return gpu


# A test hook, not a knob: every simulated step takes this factor times the cost model's time, so a gate test can
# plant a slowdown in a run the gate script makes in another process (perf/tests/test_gpu_gate.py). It is read
# from the environment alone and warned about when set, so no real run carries it unseen.
PLANTED_SLOWDOWN_ENV = "CBBENCH_SIM_PLANTED_SLOWDOWN"


def planted_slowdown() -> float:
    """The factor of PLANTED_SLOWDOWN_ENV (1.0 when unset); ValueError naming it for anything but a number > 0."""
    raw = os.environ.get(PLANTED_SLOWDOWN_ENV)
    if raw is None:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        factor = float("nan")
    if not factor > 0 or factor == float("inf"):
        raise ValueError(f"{PLANTED_SLOWDOWN_ENV}={raw!r}: a factor > 0 (a test hook; unset it for real runs)")
    logger.warning("simulated steps take %s x the cost model's time (%s is set: a test hook)", factor, raw)
    return factor


@dataclass
class SimDevice:
    gpu: GpuSpec
    dtype: str  # a sim_dtype() name: "bfloat16" or "fp8"
    model_config: ModelConfig
    shape: ModelShape
    tokenizer: Tokenizer
    clock: VirtualClock
    tensor_parallel_size: int = 1  # the GPUs of the tensor-parallel group (refengine/sim/model_shape.py)
    simulated = True

    @classmethod
    def create(cls, device: str, model: str, dtype: object, tensor_parallel_size: int = 1) -> SimDevice:
        from refengine.sim.sim_models import sim_model

        gpu = parse_sim_device(device)
        name = sim_dtype(dtype)
        mc, shape, tokenizer = sim_model(model)
        shape.check_tp(tensor_parallel_size)
        return cls(gpu, name, mc, shape, tokenizer, VirtualClock(), tensor_parallel_size)

    @property
    def label(self) -> str:
        """What reports put in titles and rows, e.g. "simulated h200 (cost model sim-2 (...), bfloat16)", and
        "simulated 4x h200 (...)" for a tensor-parallel group."""
        from refengine.sim.cost_model import COST_MODEL_VERSION

        tp = self.tensor_parallel_size
        gpus = f"{tp}x {self.gpu.name}" if tp > 1 else self.gpu.name
        return f"simulated {gpus} (cost model {COST_MODEL_VERSION}, {self.dtype})"

    @property
    def parts(self) -> EngineParts:
        """LLMEngine's parts: the scheduler's data lives on the host, and there is no model."""
        import torch

        return torch.device("cpu"), torch_dtype(self.dtype), None, "sim", self.model_config, self.tokenizer

    def num_gpu_blocks(self, cfg: EngineConfig, *, max_model_len: int) -> int:
        """The KV pool of the simulated GPU's memory (vLLM's formula has no context length in it)."""
        return num_sim_blocks(
            self.gpu,
            self.shape,
            self.dtype,
            cfg.scheduler.block_size,
            cfg.gpu_memory_utilization,
            self.tensor_parallel_size,
        )

    def check_memory(self, cfg: EngineConfig, *, num_rows: int, kv_given: bool) -> None:
        """Nothing to check: a simulated GPU allocates nothing."""

    def make_runner(self, cfg: EngineConfig, *, num_rows: int, sampler: Sampler) -> SimModelRunner:
        """The simulated runner; it samples a fixed token for every row, so `sampler` and `num_rows` do not apply."""
        from refengine.sim.cost_model import CostModel
        from refengine.sim.runner import SimModelRunner, sim_token_id

        cost = CostModel(
            self.gpu,
            self.shape,
            self.dtype,
            async_scheduling=bool(cfg.scheduler.async_scheduling),
            tensor_parallel_size=self.tensor_parallel_size,
        )
        mc = self.model_config
        runner = SimModelRunner(cost, self.clock, sim_token_id(mc.eos_token_ids, mc.vocab_size))
        runner.step_time_scale = planted_slowdown()
        return runner

    def make_batch_queue(self, execute_model: Callable[[SchedulerOutput], ModelRunnerOutput]) -> SimBatchQueue:
        from refengine.sim.runner import SimBatchQueue

        return SimBatchQueue(execute_model)

    def warm_up(self, block_size: int, max_model_len: int) -> None:
        """Nothing to compile: no kernel runs."""

    def release(self, runner: object) -> None:
        """Nothing to release: a simulated GPU holds no memory."""

    def return_memory(self) -> None:
        """Nothing to return (see release)."""

    def make_pacer(self, step: Callable[[], list[RequestOutput]], time_scale: float | None = None) -> StepPacer:
        """Served, a simulated GPU runs in real time, or at `time_scale` simulated seconds per wall second (None:
        as fast as the host keeps up with, at most real time; refengine/sim/pacing.py)."""
        return StepPacer(self.clock, step, time_scale=time_scale)
