"""`device="sim:<gpu>"`: parsing the device string of a simulated GPU."""

from __future__ import annotations

from refengine.sim.gpus import GPUS, GpuSpec, get_gpu

SIM_PREFIX = "sim:"


def is_sim_device(device: object) -> bool:
    return isinstance(device, str) and device.strip().lower().startswith(SIM_PREFIX)


def known_sim_devices() -> list[str]:
    return [SIM_PREFIX + g.lower() for g in GPUS]


def parse_sim_device(device: str) -> GpuSpec:
    """ "sim:h200" (any case) -> the H200's spec; ValueError naming `device` and the known GPUs for anything else."""
    name = device.strip().lower()[len(SIM_PREFIX) :] if is_sim_device(device) else ""
    key = {g.lower(): g for g in GPUS}.get(name)
    if key is None:
        raise ValueError(f"device {device!r} is not a simulated GPU; known: {', '.join(known_sim_devices())}")
    return get_gpu(key)
