"""The Device seam: what LLMEngine runs on, chosen once where the engine is built (refengine/engine/platform.py).

A Device supplies all that differs between a real device and a simulated GPU: the engine's clock, the label that
reports name the run by, the model parts (torch device, dtype, weights, attention backend, ModelConfig, tokenizer),
how many KV blocks fit when num_gpu_blocks is not given, the memory check before anything is allocated, the model
runner, the batch queue of async scheduling, the pacer that serves it in real time (none on a real device), and,
at the end, the release of what the engine held on the device.
`LocalDevice` is the CPU or a CUDA GPU; `SimDevice` (refengine/sim/sim_device.py), a simulated GPU, implements the
same protocols beside it. This module knows nothing of the simulation: `make_device` (refengine/engine/platform.py)
picks one of the two, once, from `cfg.device`. The engine keeps its Device as `engine.platform` (vLLM's name for the
device-specific layer); nothing outside the device modules asks which kind it has: a caller that must tell them
apart reads `platform.simulated`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from refengine.clock import WALL_CLOCK, WallClock
from refengine.worker.batch_queue import BatchQueue
from refengine.worker.worker import (
    EngineParts,
    check_engine_memory,
    empty_runner,
    kv_budget_knob,
    load_on_device,
    make_model_runner,
    return_device_memory,
    sized_num_blocks,
    warm_up_attention,
)

if TYPE_CHECKING:
    import torch

    from refengine.config import EngineConfig
    from refengine.outputs import RequestOutput
    from refengine.scheduler.scheduler_output import ModelRunnerOutput, SchedulerOutput
    from refengine.worker.model_runner import ModelRunner, Sampler

ExecuteModel = Callable[["SchedulerOutput"], "ModelRunnerOutput"]
EngineStep = Callable[[], "list[RequestOutput]"]


class Clock(Protocol):
    """The engine's time (refengine/clock.py): wall time on a real device, virtual on a simulated one."""

    @property
    def simulated(self) -> bool: ...
    def now(self) -> float: ...
    def sleep_until(self, t: float) -> None: ...


class Runner(Protocol):
    """A model runner: one forward (or its simulation) + sampling per SchedulerOutput."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


class StepQueue(Protocol):
    """The steps launched and not yet collected under async scheduling (refengine/worker/batch_queue.py's interface)."""

    def submit(self, out: SchedulerOutput) -> None: ...
    def full(self) -> bool: ...
    def oldest(self) -> SchedulerOutput: ...
    def collect(self, out: SchedulerOutput) -> ModelRunnerOutput: ...
    def holds(self, request_id: str) -> bool: ...
    def __len__(self) -> int: ...
    def shutdown(self) -> None: ...


class Pacer(Protocol):
    """Steps a served engine in real time, or at a reported time scale (refengine/sim/pacing.py's StepPacer)."""

    loop_lag: Callable[[], float] | None  # the server's lag in writing a step's outputs, counted as host work
    late: bool  # the last step's outputs came out after they were due

    @property
    def scale(self) -> float: ...
    def now(self) -> float: ...
    def reading(self) -> tuple[float, float, float]: ...
    def idle(self) -> None: ...
    def step(self) -> list[RequestOutput]: ...


class Device(Protocol):
    @property
    def simulated(self) -> bool: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def label(self) -> str: ...
    @property
    def parts(self) -> EngineParts: ...
    def num_gpu_blocks(self, cfg: EngineConfig, *, max_model_len: int) -> int:
        """KV blocks that fit in the device's memory (asked only when num_gpu_blocks is not given)."""
        ...

    def check_memory(self, cfg: EngineConfig, *, num_rows: int, kv_given: bool) -> None:
        """ValueError naming the knob when the engine's buffers for `cfg` (KV pool resolved) will not fit."""
        ...

    def make_runner(self, cfg: EngineConfig, *, num_rows: int, sampler: Sampler) -> Runner: ...
    def make_batch_queue(self, execute_model: ExecuteModel) -> StepQueue: ...
    def warm_up(self, block_size: int, max_model_len: int) -> None: ...
    def make_pacer(self, step: EngineStep, time_scale: float | None = None) -> Pacer | None: ...
    def release(self, runner: Runner) -> None:
        """The engine shuts down: empty `runner` in place (its device buffers) and drop the model from `parts`."""
        ...

    def return_memory(self) -> None:
        """After the engine has dropped its references too: hand what they held back to the device."""
        ...


@dataclass
class LocalDevice:
    """The CPU or a CUDA GPU: real weights, a real forward, the wall clock."""

    parts: EngineParts
    simulated = False
    clock: WallClock = WALL_CLOCK

    @classmethod
    def create(cls, cfg: EngineConfig, model_impl: torch.nn.Module | None = None) -> LocalDevice:
        """Load the model (or take `model_impl`) on `cfg.device`."""
        if cfg.tensor_parallel_size > 1:
            raise ValueError(
                f"tensor_parallel_size={cfg.tensor_parallel_size}: refengine's forward runs on one device; "
                "tensor parallelism is simulated only (device='sim:<gpu>')"
            )
        return cls(load_on_device(cfg, model_impl))

    @property
    def label(self) -> str:
        return str(self.parts[0])

    def num_gpu_blocks(self, cfg: EngineConfig, *, max_model_len: int) -> int:
        device, dtype, model, _, mc, _ = self.parts
        assert model is not None, "a real device always has a model (EngineParts)"
        return sized_num_blocks(model, mc, cfg, device=device, dtype=dtype, max_model_len=max_model_len)

    def check_memory(self, cfg: EngineConfig, *, num_rows: int, kv_given: bool) -> None:
        device, dtype, _, _, mc, _ = self.parts
        kv_field = "num_gpu_blocks" if kv_given else kv_budget_knob(cfg, device)
        check_engine_memory(mc, cfg.scheduler, num_rows=num_rows, kv_field=kv_field, device=device, dtype=dtype)

    def make_runner(self, cfg: EngineConfig, *, num_rows: int, sampler: Sampler) -> ModelRunner:
        return make_model_runner(self.parts, cfg, num_rows=num_rows, sampler=sampler)

    def make_batch_queue(self, execute_model: ExecuteModel) -> BatchQueue:
        return BatchQueue(execute_model)

    def warm_up(self, block_size: int, max_model_len: int) -> None:
        warm_up_attention(self.parts, block_size, max_model_len)

    def make_pacer(self, step: EngineStep, time_scale: float | None = None) -> None:
        """A real device needs no pacing: its steps take the time they take."""
        return None

    def release(self, runner: Runner) -> None:
        empty_runner(runner)
        device, dtype, _, backend, mc, tokenizer = self.parts
        self.parts = (device, dtype, None, backend, mc, tokenizer)

    def return_memory(self) -> None:
        return_device_memory(self.parts[0])
