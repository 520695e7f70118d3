"""aiconfigurator 0.12.0's aggregated (static) estimate of every measured row: runs in .venv-aiconfigurator.

    .venv-aiconfigurator/bin/python ci/peer_sims/aiconfigurator_rows.py PART_CSV [--limit N]

Each fixed-length row becomes one `cli_estimate(mode="agg", backend_name="vllm", ...)` call, as NVIDIA's own
tools/accuracy_tracking/run_silicon.py calls it on these rows: isl, osl, batch_size = the row's client concurrency,
tp_size, gemm_quant_mode="fp8" for the fp8 rows (the bf16 rows pass none: aiconfigurator's default), and for the
FP8 checkpoint an fp8 KV cache (MODEL_PATHS says why). The measured vLLM version is asked for first; the database
the wheel ships has no 0.12.0 for H100 / H200, so it falls back to the newest it has (run_silicon's rule), and `how`
names the version used. A batch whose KV cache it finds too big for the GPUs (it has no queue) is `unsupported`.
These rows are aiconfigurator's own silicon sample, the data it is checked against: its errors here are in-sample.

Nothing is downloaded: the two checkpoints whose config.json the wheel does not ship are given the shipped config of
the same architecture (MODEL_PATHS), and `how` says so.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fixed_closed_loop, prediction, runner_start, write_part  # noqa: E402

SIMULATOR = "aiconfigurator"
PINNED = "0.12.0"
GPUS = {"h100": "h100_sxm", "h200": "h200_sxm"}
# the measured checkpoint -> (the model_configs/ entry the wheel ships, kvcache_quant_mode, why they stand for it).
# NVIDIA's FP8 checkpoint's own quant config is not shipped; that of its 70B sibling is (quant_algo FP8,
# kv_cache_quant_algo FP8), and aiconfigurator would read the 8B's the same way online: so an fp8 KV cache there.
MODEL_PATHS: dict[str, tuple[str, str | None, str]] = {
    "nvidia/Llama-3.1-8B-Instruct-FP8": (
        "meta-llama/Meta-Llama-3.1-8B",
        "fp8",
        "config Meta-Llama-3.1-8B (same shape), kv fp8 (ModelOpt FP8 checkpoints' quant config)",
    ),
    "meta-llama/Llama-3.1-70B": ("meta-llama/Meta-Llama-3.1-70B", None, "config Meta-Llama-3.1-70B (same model)"),
    "Qwen/Qwen3-32B": ("Qwen/Qwen3-32B", None, "config Qwen3-32B"),
}
# cli_estimate's refusals of a version the database lacks: 0.12.0 raises the first, older wheels the second
MISSING_VERSION = ("old-style raw version query", "Failed to load perf database")


def _estimate(kwargs: dict[str, Any]) -> Any:
    from aiconfigurator.cli.api import cli_estimate

    with redirect_stdout(io.StringIO()):  # it prints its tables
        return cli_estimate(**kwargs)


def _estimate_with_fallback(kwargs: dict[str, Any], measured: str) -> tuple[Any, str]:
    """The estimate at the measured version, else at the newest in the database; and a phrase saying which."""
    if measured:
        try:
            result = _estimate({**kwargs, "backend_version": measured})
            return result, f"vllm {result.backend_version}"
        except ValueError as e:
            if not any(marker in str(e) for marker in MISSING_VERSION):
                raise
    result = _estimate({**kwargs, "backend_version": None})
    why = f"{measured} not in its database" if measured else "version not measured"
    return result, f"vllm {result.backend_version} (newest: {why})"


def predict(row: dict[str, str], version: str) -> dict[str, str]:
    unfit = fixed_closed_loop(row)
    if unfit is None and row["model_path"] not in MODEL_PATHS:
        unfit = f"no shipped config stands for {row['model_path']}"
    if unfit is None and row["gpu"] not in GPUS:
        unfit = f"gpu={row['gpu']}: no system mapped"
    if unfit is not None:
        return prediction(row["id"], SIMULATOR, version, "unsupported", "not run", error=unfit)
    model_path, kvcache, model_how = MODEL_PATHS[row["model_path"]]
    gemm = "fp8" if row["dtype"] == "fp8" else None
    kwargs: dict[str, Any] = dict(
        model_path=model_path,
        system_name=GPUS[row["gpu"]],
        mode="agg",
        backend_name="vllm",
        isl=int(row["isl"]),
        osl=int(row["osl"]),
        batch_size=int(row["concurrency"]),
        tp_size=int(row["tensor_parallel_size"]),
        gemm_quant_mode=gemm,
        kvcache_quant_mode=kvcache,
    )
    tp = row["tensor_parallel_size"]
    base = f"agg, {GPUS[row['gpu']]}, batch_size=concurrency, tp {tp}, gemm {gemm or 'bf16'}; {model_how}"
    try:
        result, version_how = _estimate_with_fallback(kwargs, row["engine_version"])
    except RuntimeError as e:
        if not str(e).startswith("OOM"):
            return prediction(row["id"], SIMULATOR, version, "error", base, error=f"{type(e).__name__}: {e}")
        # its static batch holds all `concurrency` requests' KV at once; vLLM admits what fits and queues the rest
        why = f"{str(e).split('.')[0]}: the static batch must hold every client's KV cache (vLLM queues the rest)"
        return prediction(row["id"], SIMULATOR, version, "unsupported", base, error=why)
    except Exception as e:  # the peer's own failure is the row's result, not ours
        return prediction(row["id"], SIMULATOR, version, "error", base, error=f"{type(e).__name__}: {e}")
    return prediction(
        row["id"],
        SIMULATOR,
        version,
        "ok",
        f"{base}; {version_how}",
        ttft_ms=float(result.ttft),
        tpot_ms=float(result.tpot),
        output_throughput=float(result.tokens_per_second),
    )


def main() -> int:
    part, version, rows = runner_start(__doc__ or "", SIMULATOR, PINNED)
    logging.disable(logging.INFO)  # per-query INFO lines; its warnings still reach stderr (the run's log)
    start, out = time.monotonic(), []
    for i, row in enumerate(rows, 1):
        out.append(predict(row, version))
        if i % 20 == 0 or i == len(rows):
            print(f"  aiconfigurator: {i}/{len(rows)} rows, {time.monotonic() - start:.0f}s", flush=True)
    write_part(part, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
