"""`device="sim:<gpu>"`: parsing the device string of a simulated GPU."""
from __future__ import annotations

from refengine.sim.gpus import GPUS, GpuSpec, get_gpu

SIM_PREFIX = "sim:"


def is_sim_device(device: object) -> bool:
    return isinstance(device, str) and device.strip().lower().startswith(SIM_PREFIX)


def parse_sim_device(device: str) -> GpuSpec:
    """"sim:h200" -> the H200's spec; ValueError naming `device` and the known GPUs for anything else."""
    name = device.strip().lower()[len(SIM_PREFIX):] if is_sim_device(device) else ""
    if name not in GPUS:
        known = ", ".join(SIM_PREFIX + g for g in GPUS)
        raise ValueError(f"device {device!r} is not a simulated GPU; known: {known}")
    return get_gpu(name)
