"""Serving-level validation through the real engine: each measured vLLM run of Llama-3.1-8B-Instruct-FP8 on an
H200 (TP1, data/silicon_llama31_8b_fp8_h200.csv) replayed by `concurrency` closed-loop clients against
`LLMEngine("llama-3.1-8b", device="sim:h200", dtype="fp8")`, beside the cost-model-only `replay_fixed_lengths` on
the same row.

Shared by test_silicon_engine.py (which pins the errors) and docs/sim-validation.md (its table:
`python -m refengine.tests.sim.silicon_engine [--waves N]`).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from perf.sim.closed_loop import closed_loop_on_engine
from perf.sim.replay import ReplayResult, replay_fixed_lengths
from refengine.sim.cost_model import CostModel
from refengine.tests.sim.silicon import LLAMA_31_8B, SILICON_CSV, median_abs

# requests per row = WAVES x concurrency, as replay_fixed_lengths' default; the first and last wave are left out
DEFAULT_WAVES = 6


@dataclass(frozen=True)
class EngineRow:
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float  # measured on the H200
    tpot_ms: float
    engine: ReplayResult  # the simulated engine
    replay: ReplayResult  # replay_fixed_lengths, the same requests
    wall_s: float  # wall seconds of the engine run

    @property
    def ttft_error(self) -> float:
        return self.engine.mean_ttft_s * 1e3 / self.ttft_ms - 1

    @property
    def tpot_error(self) -> float:
        return self.engine.mean_tpot_s * 1e3 / self.tpot_ms - 1


def silicon_rows() -> list[tuple[int, int, int, float, float]]:
    """(isl, osl, concurrency, measured TTFT ms, measured TPOT ms) per CSV row."""
    with open(SILICON_CSV) as f:
        return [
            (
                int(r["isl"]),
                int(r["osl"]),
                int(float(r["batch_size"])),
                float(r["silicon_ttft_ms"]),
                float(r["silicon_tpot_ms"]),
            )
            for r in csv.DictReader(f)
        ]


def engine_rows(waves: int = DEFAULT_WAVES, select: Callable[[int, int, int], bool] | None = None) -> list[EngineRow]:
    """Replay the rows `select(isl, osl, concurrency)` keeps (all by default) with waves x concurrency requests."""
    cost = CostModel("h200", LLAMA_31_8B, "fp8")
    out = []
    for isl, osl, conc, ttft, tpot in silicon_rows():
        if select is not None and not select(isl, osl, conc):
            continue
        start = time.perf_counter()
        eng = closed_loop_on_engine(isl, osl, conc, waves * conc)
        wall = time.perf_counter() - start
        out.append(
            EngineRow(isl, osl, conc, ttft, tpot, eng, replay_fixed_lengths(cost, isl, osl, conc, waves * conc), wall)
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="serving-level validation through the simulated engine")
    ap.add_argument("--waves", type=int, default=DEFAULT_WAVES, help="requests per row = waves x concurrency")
    args = ap.parse_args(argv)
    if args.waves < 1:  # bad input: one line on stderr, exit 2
        print(f"error: --waves: must be >= 1, got {args.waves}", file=sys.stderr)
        sys.exit(2)
    rows = engine_rows(args.waves)
    print(
        "| isl / osl | concurrency | TTFT measured / engine / replay (ms) | TTFT error | TPOT measured / engine / "
        "replay (ms) | TPOT error | engine steps | wall s |\n|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        e, p = r.engine, r.replay
        print(
            f"| {r.isl} / {r.osl} | {r.concurrency} | {r.ttft_ms:.0f} / {e.mean_ttft_s * 1e3:.0f} / "
            f"{p.mean_ttft_s * 1e3:.0f} | {r.ttft_error:+.0%} | {r.tpot_ms:.1f} / {e.mean_tpot_s * 1e3:.1f} / "
            f"{p.mean_tpot_s * 1e3:.1f} | {r.tpot_error:+.0%} | {e.num_steps} | {r.wall_s:.0f} |"
        )
    long = [r for r in rows if r.osl >= 1000]
    for name, sel in (("all rows", rows), ("osl >= 1000", long)):
        print(
            f"{name}: median |TTFT error| {median_abs([r.ttft_error for r in sel]):.1%}, "
            f"median |TPOT error| {median_abs([r.tpot_error for r in sel]):.1%}"
        )
    same = sum(r.engine == r.replay for r in rows)
    print(f"engine == replay_fixed_lengths (bit for bit, TTFT, TPOT, duration, steps) on {same} of {len(rows)} rows")


if __name__ == "__main__":
    main()
