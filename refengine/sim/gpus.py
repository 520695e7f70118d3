"""The simulated GPUs: memory, HBM bandwidth and tensor-core peaks; a GPU's name also names its tables
(data/<name>.npz).

Every number is the one NVIDIA's aiconfigurator-core 0.12.0 uses for the GPU (its systems/<gpu>.yaml, copied beside
the tables as data/<gpu>_system.yaml); the data sheets give the same figures (the H200's "141 GB" is read as GiB
there, as here).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float  # dense tensor-core peak
    fp8_flops: float  # 0.0 where the GPU has no fp8 tensor cores


GPUS: dict[str, GpuSpec] = {
    # H100 SXM5 80GB: 3.35 TB/s HBM3, 989 TFLOPS bf16, 1979 TFLOPS fp8 (data/h100_system.yaml)
    "h100": GpuSpec("h100", 80 * 2**30, 3.35e12, 989e12, 1978e12),
    # H200 SXM 141GB: 4.8 TB/s HBM3e, same compute as H100 (data/h200_system.yaml)
    "h200": GpuSpec("h200", 141 * 2**30, 4.8e12, 989e12, 1978e12),
    # A100 SXM4 80GB: 2.039 TB/s HBM2e, 312 TFLOPS bf16, no fp8 (data/a100_system.yaml)
    "a100": GpuSpec("a100", 80 * 2**30, 2.039e12, 312e12, 0.0),
}


def get_gpu(name: str) -> GpuSpec:
    """The spec of a simulated GPU by its short name ("h100", "sim:h100" also accepted)."""
    key = name.lower().removeprefix("sim:")
    if key not in GPUS:
        raise ValueError(f"gpu: unknown simulated GPU {name!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]
