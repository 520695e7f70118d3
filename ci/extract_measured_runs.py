"""Regenerate the aiconfigurator rows of perf/sim/data/measured_runs.csv from NVIDIA's aiconfigurator-core wheel.

aiconfigurator-core 0.12.0 (Apache-2.0) ships `systems/silicon_sample.csv`: measured serving runs of vLLM, TensorRT-LLM
and SGLang at fixed input / output lengths and fixed client concurrency. Kept here: every vLLM run of a dense model
the simulator has a preset for (Llama-3.1-8B FP8, Llama-3.1-70B FP8, Qwen3-32B), aggregated serving (one engine,
no disaggregation), no pipeline or data parallelism, on an H100 or H200 (the GPUs with measured kernel tables).
Left out, and why: MoE models (MiniMax-M2.5, Qwen3-235B-A22B, gpt-oss-120b, Kimi-K2.5: the cost model has no
expert layers), B200 / B300 / GB200 (no kernel tables), TensorRT-LLM and SGLang (another scheduler), disaggregated
serving. Rows of other sources (published figures) live in the same CSV with their own `source`; this script keeps
them and replaces only its own.

    pip install aiconfigurator-core==0.12.0 && python ci/extract_measured_runs.py [--silicon PATH]
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import sys
from pathlib import Path

PACKAGE_VERSION = "0.12.0"
OUT = Path(__file__).resolve().parent.parent / "perf" / "sim" / "data" / "measured_runs.csv"
SOURCE_PREFIX = f"aiconfigurator-core {PACKAGE_VERSION} systems/silicon_sample.csv"
# the model paths of the source -> (the simulator's preset, weights dtype when the row's precision is empty)
MODELS = {
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "Qwen/Qwen3-32B": "qwen3-32b",
}
GPUS = {"h100_sxm": "h100", "h200_sxm": "h200"}
COLUMNS = [
    "id",
    "source",
    "engine",
    "engine_version",
    "model",
    "model_path",
    "gpu",
    "tensor_parallel_size",
    "dtype",
    "workload",
    "isl",
    "osl",
    "concurrency",
    "request_rate",
    "num_prompts",
    "stat",
    "ttft_ms",
    "tpot_ms",
    "output_throughput",
    "notes",
]


def _silicon_path(given: str | None) -> Path:
    if given:
        return Path(given)
    import aiconfigurator_core  # type: ignore[import-not-found]

    found = importlib.metadata.version("aiconfigurator-core")
    if found != PACKAGE_VERSION:
        sys.exit(f"aiconfigurator-core {found} installed; this extract is pinned to {PACKAGE_VERSION}")
    return Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"


def _keep(r: dict[str, str]) -> bool:
    return (
        r["backend"] == "vllm"
        and r["mode"] == "agg"
        and r["model_path"] in MODELS
        and r["system"] in GPUS
        and r["pp_size"] in ("", "1")
        and r["attention_dp_size"] in ("", "1")
        and bool(r["silicon_ttft_ms"])
        and bool(r["silicon_tpot_ms"])
    )


def aiconfigurator_rows(silicon: Path) -> list[dict[str, str]]:
    with silicon.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if _keep(r)]
    out = []
    for r in rows:
        quant = r["gemm_quant_mode"] or r["precision"]
        dtype = "fp8" if quant == "fp8" else "bfloat16"
        out.append(
            {
                "id": r["id"],
                "source": f"{SOURCE_PREFIX} id={r['id']} ({r['silicon_data_source'].split(';')[0]})",
                "engine": "vllm",
                "engine_version": r["backend_version"],
                "model": MODELS[r["model_path"]],
                "model_path": r["model_path"],
                "gpu": GPUS[r["system"]],
                "tensor_parallel_size": r["tp_size"] or "1",
                "dtype": dtype,
                "workload": "fixed",
                "isl": r["isl"],
                "osl": r["osl"],
                "concurrency": str(int(float(r["batch_size"]))),
                "request_rate": "inf",
                "num_prompts": "",
                "stat": "mean",
                "ttft_ms": f"{float(r['silicon_ttft_ms']):.2f}",
                "tpot_ms": f"{float(r['silicon_tpot_ms']):.3f}",
                "output_throughput": "",
                "notes": "",
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--silicon", help="a silicon_sample.csv (default: the installed aiconfigurator-core's)")
    args = ap.parse_args(argv)
    ours = aiconfigurator_rows(_silicon_path(args.silicon))
    others: list[dict[str, str]] = []
    if OUT.exists():
        with OUT.open(newline="") as f:
            others = [r for r in csv.DictReader(f) if not r["source"].startswith(SOURCE_PREFIX)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(ours + others)
    print(f"wrote {len(ours)} aiconfigurator rows and kept {len(others)} others in {OUT}")


if __name__ == "__main__":
    main()
