"""The engine's Device (`engine.platform`, vLLM's name for the device-specific layer), chosen once where the engine
is built: `make_device` reads `cfg.device` and returns a `LocalDevice` (cpu, cuda; refengine/worker/device.py) or,
on `device="sim:<gpu>"`, a `SimDevice` (refengine/sim/sim_device.py). After this one choice every difference is the
Device's to answer (its clock, runner, batch queue, pacer, KV sizing): the engine and the worker never ask which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from refengine.sim.sim_device import DeviceSpec, SimDevice
from refengine.worker.device import Device, LocalDevice

if TYPE_CHECKING:
    import torch

    from refengine.config import EngineConfig


def make_device(cfg: EngineConfig, model_impl: torch.nn.Module | None = None) -> Device:
    """The Device of `cfg.device`: "sim:<gpu>" is a simulated GPU (it has no weights, so `model_impl` is not
    used there), anything else a local device that loads the model or takes `model_impl`."""
    if isinstance(cfg.device, str) and DeviceSpec.parse(cfg.device).simulated:
        return SimDevice.create(cfg.device, cfg.model, cfg.dtype, cfg.tensor_parallel_size)
    return LocalDevice.create(cfg, model_impl)
