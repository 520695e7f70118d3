"""The validation's numbers: per-row relative errors of the simulator (and of each peer simulator) against the
measurement, and their medians over all rows, over the self-consistent rows, and per group.

An error is (predicted - measured) / measured, signed; a median error is the median of the absolute errors.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cbbench.perf.sim.consistency import Feasibility
from cbbench.perf.sim.measured import MeasuredRun
from cbbench.perf.sim.validate import Replay

METRICS = ("ttft", "tpot", "throughput")


@dataclass(frozen=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float
    output_throughput: float = math.nan


@dataclass(frozen=True)
class RowErrors:
    run: MeasuredRun
    sim: Prediction
    errors: dict[str, float]  # metric -> signed relative error of the simulator
    peers: dict[str, dict[str, float]]  # peer -> metric -> its signed relative error (rows it predicts)
    feasibility: Feasibility | None

    @property
    def consistent(self) -> bool:
        return self.feasibility is None or self.feasibility.consistent


def rel_error(predicted: float, measured: float | None) -> float:
    if measured is None or not math.isfinite(predicted) or measured <= 0:
        return math.nan
    return (predicted - measured) / measured


def errors_of(run: MeasuredRun, p: Prediction) -> dict[str, float]:
    return {
        "ttft": rel_error(p.ttft_ms, run.ttft_ms),
        "tpot": rel_error(p.tpot_ms, run.tpot_ms),
        "throughput": rel_error(p.output_throughput, run.implied_output_throughput),
    }


def row_errors(
    run: MeasuredRun, replay: Replay, peers: Mapping[str, Prediction], feasibility: Feasibility | None
) -> RowErrors:
    median = run.stat == "median"  # compare like with like: the statistic the source reports
    sim = Prediction(
        replay.median_ttft_ms if median else replay.ttft_ms,
        replay.median_tpot_ms if median else replay.tpot_ms,
        replay.output_throughput,
    )
    peer_errors = {name: errors_of(run, p) for name, p in peers.items()}
    return RowErrors(run, sim, errors_of(run, sim), peer_errors, feasibility)


def median_abs(values: Iterable[float]) -> float:
    finite = [abs(v) for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


@dataclass(frozen=True)
class Medians:
    rows: int
    ttft: float
    tpot: float
    throughput: float


def medians(rows: Sequence[RowErrors], who: str = "cbbench") -> Medians:
    """Median |error| per metric of the simulator (who="cbbench") or of a peer, over `rows`."""

    def err(r: RowErrors, m: str) -> float:
        return r.errors[m] if who == "cbbench" else r.peers.get(who, {}).get(m, math.nan)

    return Medians(len(rows), *(median_abs(err(r, m) for r in rows) for m in METRICS))


def groups(rows: Sequence[RowErrors]) -> dict[str, list[RowErrors]]:
    """Rows by model, GPU and tensor-parallel size."""
    out: dict[str, list[RowErrors]] = {}
    for r in rows:
        key = f"{r.run.model} {r.run.gpu} tp{r.run.tensor_parallel_size} {r.run.dtype}"
        out.setdefault(key, []).append(r)
    return dict(sorted(out.items()))
