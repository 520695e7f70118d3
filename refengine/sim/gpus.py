"""Simulated GPUs: memory, HBM bandwidth and peak tensor throughput of the devices `device="sim:<gpu>"` names.

# placeholder: replaced by the measured-table model
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float  # dense
    fp8_flops: float  # dense


# datasheet figures (SXM parts); memory as the driver reports the device's total
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100", 81559 * MiB, 3.35e12, 989e12, 1979e12),
    "h200": GpuSpec("H200", 143771 * MiB, 4.8e12, 989e12, 1979e12),
    "a100": GpuSpec("A100", 81920 * MiB, 2.039e12, 312e12, 312e12),  # no fp8 units: fp8 runs at the bf16 rate
}


def get_gpu(name: str) -> GpuSpec:
    try:
        return GPUS[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown simulated gpu {name!r}; known: {', '.join(GPUS)}") from None
