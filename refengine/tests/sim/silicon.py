"""Serving-level validation: replay each measured vLLM run of Llama-3.1-8B-Instruct-FP8 on an H200 (TP1) from
data/silicon_llama31_8b_fp8_h200.csv on the cost model, and compare TTFT and TPOT.

Shared by test_replay.py (which pins the errors) and docs/sim-validation.md (its table:
`python -m refengine.tests.sim.silicon`).
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass

from refengine.sim.cost_model import CostModel
from refengine.sim.model_shape import ModelShape
from refengine.sim.kernel_tables import DATA_DIR, load_tables
from refengine.sim.replay import replay_fixed_lengths

LLAMA_31_8B = ModelShape(
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
)
SILICON_CSV = DATA_DIR / "silicon_llama31_8b_fp8_h200.csv"


@dataclass(frozen=True)
class SiliconRow:
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float
    sim_ttft_ms: float
    sim_tpot_ms: float
    implied_linear_tflops: float  # decoder-linear FLOP/s the measured run needs at full concurrency

    @property
    def ttft_error(self) -> float:
        return self.sim_ttft_ms / self.ttft_ms - 1

    @property
    def tpot_error(self) -> float:
        return self.sim_tpot_ms / self.tpot_ms - 1


def linear_flops_per_token(shape: ModelShape) -> float:
    return 2.0 * shape.num_layers * sum(n * k for n, k in shape.linear_shapes().values())


def best_table_tflops(shape: ModelShape, gpu: str = "h200", dtype: str = "fp8") -> float:
    """The highest decoder-linear throughput the measured GEMM table reaches for this model, any M up to 8192."""
    tables = load_tables(gpu)
    best = 0.0
    for m in (256, 512, 1024, 2048, 4096, 8192):
        ms = sum(tables.gemm(dtype, n, k).ms(m) for n, k in shape.linear_shapes().values()) * shape.num_layers
        best = max(best, linear_flops_per_token(shape) * m / (ms * 1e-3) / 1e12)
    return best


def replay_rows(async_scheduling: bool = False) -> list[SiliconRow]:
    cost = CostModel("h200", LLAMA_31_8B, "fp8", async_scheduling=async_scheduling)
    out = []
    with open(SILICON_CSV) as f:
        for row in csv.DictReader(f):
            isl, osl, conc = int(row["isl"]), int(row["osl"]), int(float(row["batch_size"]))
            ttft, tpot = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
            sim = replay_fixed_lengths(cost, isl, osl, conc)
            cycle_s = (ttft + (osl - 1) * tpot) * 1e-3  # one client's request, send to last token
            implied = conc * (isl + osl) / cycle_s * linear_flops_per_token(LLAMA_31_8B) / 1e12
            out.append(SiliconRow(isl, osl, conc, ttft, tpot, sim.mean_ttft_s * 1e3, sim.mean_tpot_s * 1e3, implied))
    return out


def median_abs(values: list[float]) -> float:
    return statistics.median(abs(v) for v in values)


if __name__ == "__main__":
    rows = replay_rows()
    print(f"best fp8 decoder-linear throughput in the h200 table: {best_table_tflops(LLAMA_31_8B):.0f} TFLOP/s")
    print(
        "| isl / osl | concurrency | TTFT measured / sim (ms) | error | TPOT measured / sim (ms) | error "
        "| TFLOP/s the run implies |\n|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r.isl} / {r.osl} | {r.concurrency} | {r.ttft_ms:.0f} / {r.sim_ttft_ms:.0f} | {r.ttft_error:+.0%} "
            f"| {r.tpot_ms:.1f} / {r.sim_tpot_ms:.1f} | {r.tpot_error:+.0%} | {r.implied_linear_tflops:.0f} |"
        )
    long = [r for r in rows if r.osl >= 1000]
    for name, sel in (("all rows", rows), ("osl >= 1000", long)):
        print(
            f"{name}: median |TTFT error| {median_abs([r.ttft_error for r in sel]):.0%}, "
            f"median |TPOT error| {median_abs([r.tpot_error for r in sel]):.0%}"
        )
