"""Regenerate refengine/sim/data/ from NVIDIA's aiconfigurator-core wheel (Apache-2.0).

The simulated GPU times its kernels from vLLM latencies that aiconfigurator-core measured on real GPUs. The package
installs to 114 MB (plus pyarrow and scipy), so the repo commits a compact extract instead of depending on it: per
GPU one compressed .npz with the bf16 / fp8 GEMM grid and the FlashAttention decode and prefill tables for head_dim
64 and 128, plus the ten silicon rows the serving-level validation replays. Run it after a version bump:

    pip install aiconfigurator-core==0.12.0     # or: pip install -e '.[sim-extract]'
    python ci/extract_sim_tables.py
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

PACKAGE_VERSION = "0.12.0"
OUT_DIR = Path(__file__).resolve().parent.parent / "refengine" / "sim" / "data"
# (our name, aiconfigurator system folder, vLLM version its tables were measured with)
SYSTEMS = [("h100", "h100_sxm", "0.24.0"), ("h200", "h200_sxm", "0.24.0"), ("a100", "a100_sxm", "0.14.0")]
# the per-tensor-scaled kernels: nvidia's FP8 checkpoints are per-tensor, and bf16 goes through F.linear
GEMM_KERNELS = {"bfloat16": ("torch.nn.functional.linear", "vllm_default"), "fp8": ("CutlassFP8ScaledMMLinearKernel",)}
HEAD_DIMS = (64, 128)  # the head sizes of the presets (Qwen2.5-0.5B: 64; the rest: 128)
SILICON_MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"
ATTN_COLUMNS = ["num_heads", "num_key_value_heads", "head_dim", "batch_size", "isl", "step", "latency"]


def _systems_dir() -> Path:
    import aiconfigurator_core

    found = importlib.metadata.version("aiconfigurator-core")
    if found != PACKAGE_VERSION:
        sys.exit(f"aiconfigurator-core {found} installed; this extract is pinned to {PACKAGE_VERSION}")
    return Path(aiconfigurator_core.__file__).parent / "systems"


def _gemm_grid(df: pd.DataFrame, dtype: str) -> dict[str, np.ndarray]:
    rows = df[(df.gemm_dtype == dtype) & df.kernel_source.isin(GEMM_KERNELS[dtype])]
    m, n, k = (np.sort(rows[c].unique()) for c in ("m", "n", "k"))
    lat = np.full((len(m), len(n), len(k)), np.nan, dtype=np.float32)  # ms; NaN = not measured
    lat[np.searchsorted(m, rows.m), np.searchsorted(n, rows.n), np.searchsorted(k, rows.k)] = rows.latency
    return {f"gemm_{dtype}_m": m, f"gemm_{dtype}_n": n, f"gemm_{dtype}_k": k, f"gemm_{dtype}_ms": lat}


def _attention(df: pd.DataFrame, prefix: str) -> dict[str, np.ndarray]:
    if "window_size" in df:
        df = df[df.window_size == 0]  # full attention only
    out: dict[str, np.ndarray] = {}
    for kv_dtype in ("bfloat16", "fp8"):
        rows = df[(df.kv_cache_dtype == kv_dtype) & df.head_dim.isin(HEAD_DIMS)]
        if rows.empty:
            continue
        table = rows[ATTN_COLUMNS].to_numpy(dtype=np.float64)
        out[f"{prefix}_{kv_dtype}"] = table.astype(np.float32)
    return out


def _allreduce(comm: Path, vllm_version: str) -> dict[str, np.ndarray]:
    """vLLM's tensor_model_parallel_all_reduce (bf16) at 2 / 4 / 8 GPUs, in CUDA-graph and eager mode, over message
    sizes in elements; and NCCL's all-gather (half) for the logits gather of a vocabulary-parallel lm_head."""
    out: dict[str, np.ndarray] = {}
    ar = pd.read_parquet(comm / "vllm" / vllm_version / "custom_allreduce_perf.parquet")
    gpus = np.sort(ar.num_gpus.unique())
    sizes = np.sort(ar.message_size.unique())
    for mode in ("graph", "eager"):
        rows = ar[ar.kernel_source == f"vLLM_custom_{mode}"]
        lat = np.full((len(gpus), len(sizes)), np.nan, dtype=np.float32)
        lat[np.searchsorted(gpus, rows.num_gpus), np.searchsorted(sizes, rows.message_size)] = rows.latency
        out[f"allreduce_{mode}_ms"] = lat
    out["allreduce_gpus"], out["allreduce_elements"] = gpus, sizes
    nccl_dir = max((comm / "nccl").iterdir(), key=lambda p: tuple(int(x) for x in p.name.split(".")))
    ag = pd.read_parquet(nccl_dir / "nccl_perf.parquet")
    ag = ag[(ag.op_name == "all_gather") & (ag.nccl_dtype == "half")]
    ag_gpus, ag_sizes = np.sort(ag.num_gpus.unique()), np.sort(ag.message_size.unique())
    lat = np.full((len(ag_gpus), len(ag_sizes)), np.nan, dtype=np.float32)
    lat[np.searchsorted(ag_gpus, ag.num_gpus), np.searchsorted(ag_sizes, ag.message_size)] = ag.latency
    out.update(allgather_gpus=ag_gpus, allgather_elements=ag_sizes, allgather_ms=lat)
    out["nccl_version"] = np.array(nccl_dir.name)
    return out


def extract_system(systems: Path, folder: str, vllm_version: str) -> dict[str, np.ndarray]:
    base = systems / "data" / folder
    arrays: dict[str, np.ndarray] = {}
    gemm = pd.read_parquet(base / "gemm" / "vllm" / vllm_version / "gemm_perf.parquet")
    for dtype in GEMM_KERNELS:
        if (gemm.gemm_dtype == dtype).any():
            arrays.update(_gemm_grid(gemm, dtype))
    attn_dir = base / "attention" / "vllm" / vllm_version
    arrays.update(_attention(pd.read_parquet(attn_dir / "generation_attention_perf.parquet"), "decode"))
    arrays.update(_attention(pd.read_parquet(attn_dir / "context_attention_perf.parquet"), "prefill"))
    arrays.update(_allreduce(base / "comm", vllm_version))
    return arrays


def extract_silicon(systems: Path) -> pd.DataFrame:
    df = pd.read_csv(systems / "silicon_sample.csv")
    keep = (df.model_path == SILICON_MODEL) & (df.system == "h200_sxm") & (df.backend == "vllm")
    keep &= (df.tp_size == 1) & (df["mode"] == "agg")
    cols = [
        "model_path",
        "system",
        "backend",
        "backend_version",
        "precision",
        "isl",
        "osl",
        "batch_size",
        "silicon_ttft_ms",
        "silicon_tpot_ms",
    ]
    return df.loc[keep, cols].sort_values(["isl", "osl", "batch_size"])


def main() -> None:
    systems = _systems_dir()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, folder, vllm_version in SYSTEMS:
        arrays = extract_system(systems, folder, vllm_version)
        arrays["vllm_version"] = np.array(vllm_version)
        np.savez_compressed(OUT_DIR / f"{name}.npz", **arrays)
    extract_silicon(systems).to_csv(OUT_DIR / "silicon_llama31_8b_fp8_h200.csv", index=False)
    for name, folder, _ in SYSTEMS:
        shutil.copyfile(systems / f"{folder}.yaml", OUT_DIR / f"{name}_system.yaml")
    print(f"wrote {sorted(p.name for p in OUT_DIR.iterdir())}")


if __name__ == "__main__":
    main()
