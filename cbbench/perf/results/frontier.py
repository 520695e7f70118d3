"""`cbbench plan`'s analysis of a grid's rows: which runs meet the SLO, the best configuration per GPU, and the
throughput-per-GPU against latency frontier (the Pareto set); and the same answer as the lines `cbbench plan` prints
and `cbbench report` repeats (`summary_lines`).

Pure functions of result rows (the CSV's or the JSON's, as dicts), so `cbbench plan` and `cbbench report` read the
same answer from the same file. A run's GPUs are its `tensor_parallel_size` (a knob the row keeps in a column or in
its `extra` JSON; 1 when it has none); its throughput per GPU is `output_throughput / tensor_parallel_size`.
The frontier's latency is the p99 TPOT (what a user of a streaming reply waits between tokens): a run is on it when
no other run has both more output tokens/s per GPU and a lower TPOT p99 (ties kept once).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import SupportsFloat, SupportsIndex

FRONTIER_LATENCY = "p99_tpot_ms"
# the metric each SLO bounds, and how the summary names it
SLO_METRICS = {"ttft": ("p99_ttft_ms", "TTFT p99"), "tpot": ("p99_tpot_ms", "TPOT p99")}
# knobs a planner's configuration is named by, in this order (the others are fixed across the grid)
CONFIG_NAMES = ("batching", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size")


@dataclass(frozen=True)
class Slo:
    """The latency targets a configuration must meet (None: no bound on that metric)."""

    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_p99_ms", "tpot_p99_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"slo_{name}: expected a number of milliseconds > 0, got {v!r}")
        if self.ttft_p99_ms is None and self.tpot_p99_ms is None:
            raise ValueError("slo: give --slo-ttft-p99-ms, --slo-tpot-p99-ms or both")

    def bounds(self) -> list[tuple[str, str, float]]:
        """(row metric, its name, limit) of every bound set."""
        out = []
        for key, limit in (("ttft", self.ttft_p99_ms), ("tpot", self.tpot_p99_ms)):
            if limit is not None:
                out.append((*SLO_METRICS[key], float(limit)))
        return out

    def as_config(self) -> dict[str, float | None]:
        return {"slo_ttft_p99_ms": self.ttft_p99_ms, "slo_tpot_p99_ms": self.tpot_p99_ms}


@dataclass(frozen=True)
class Candidate:
    """One run of the grid as the planner sees it."""

    row: Mapping[str, object]
    config: str  # `continuous max_num_seqs=256 max_num_batched_tokens=8192 tensor_parallel_size=1`
    gpus: int
    throughput: float  # output tokens/s of the whole run
    ttft_p99_ms: float
    tpot_p99_ms: float
    misses: tuple[str, ...]  # `TTFT p99 812 ms > 500 ms (+62%)`, one per bound it misses

    @property
    def per_gpu(self) -> float:
        return self.throughput / self.gpus

    @property
    def meets_slo(self) -> bool:
        return not self.misses


def _number(v: object) -> float:
    if not isinstance(v, (SupportsFloat, SupportsIndex, str, bytes)):
        return math.nan  # (what float() refuses with a TypeError: None, a list, ...)
    try:
        x = float(v)
    except ValueError:
        return math.nan
    return x


def _extra(row: Mapping[str, object]) -> Mapping[str, object]:
    cell = row.get("extra")
    if isinstance(cell, dict):
        return cell
    try:
        parsed = json.loads(cell) if isinstance(cell, str) and cell.strip() else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def row_value(row: Mapping[str, object], name: str) -> object:
    """A row's cell, or the entry of its `extra` JSON (where knobs without a CSV column go)."""
    v = row.get(name)
    return v if v not in (None, "") and not (isinstance(v, float) and math.isnan(v)) else _extra(row).get(name)


def gpus_of(row: Mapping[str, object]) -> int:
    tp = _number(row_value(row, "tensor_parallel_size"))
    return int(tp) if math.isfinite(tp) and tp >= 1 else 1


def config_name(row: Mapping[str, object]) -> str:
    parts = [str(row.get("batching") or "")]
    parts += [f"{k}={_plain(row_value(row, k))}" for k in CONFIG_NAMES[1:] if row_value(row, k) is not None]
    return " ".join(p for p in parts if p)


def _plain(v: object) -> str:
    x = _number(v)
    return str(int(x)) if math.isfinite(x) and x.is_integer() else str(v)


def candidates(rows: Iterable[Mapping[str, object]], slo: Slo) -> list[Candidate]:
    """Every run that completed requests, with what it misses of `slo` and by how much."""
    out = []
    for row in rows:
        if not _number(row.get("completed")) > 0:
            continue
        misses = []
        for metric, name, limit in slo.bounds():
            v = _number(row.get(metric))
            if not v <= limit:  # a NaN latency meets no bound
                misses.append(f"{name} {v:.1f} ms > {limit:g} ms (+{(v / limit - 1) * 100:.0f}%)")
        out.append(
            Candidate(
                row,
                config_name(row),
                gpus_of(row),
                _number(row.get("output_throughput")),
                _number(row.get("p99_ttft_ms")),
                _number(row.get("p99_tpot_ms")),
                tuple(misses),
            )
        )
    return out


def best_per_gpu(cands: Sequence[Candidate]) -> Candidate | None:
    """The most output tokens/s per GPU among the runs that meet the SLO (ties: the lower TPOT p99, then fewer
    GPUs); None when no run meets it."""
    ok = [c for c in cands if c.meets_slo and math.isfinite(c.per_gpu)]
    return min(ok, key=lambda c: (-c.per_gpu, c.tpot_p99_ms, c.gpus, c.config), default=None)


def pareto(cands: Sequence[Candidate]) -> list[Candidate]:
    """The runs no other run beats on both output tokens/s per GPU (higher) and TPOT p99 (lower), by latency."""
    pts = sorted(
        (c for c in cands if math.isfinite(c.per_gpu) and math.isfinite(c.tpot_p99_ms)),
        key=lambda c: (c.tpot_p99_ms, -c.per_gpu, c.config),
    )
    front: list[Candidate] = []
    for c in pts:  # by latency: a point joins when it has more throughput than every faster point
        if not front or c.per_gpu > front[-1].per_gpu:
            front.append(c)
    return front


def _point(c: Candidate) -> str:
    return (
        f"{c.per_gpu:8.1f} tok/s/GPU ({c.throughput:.1f} on {c.gpus} GPU{'s' if c.gpus > 1 else ''})  "
        f"TTFT p99 {c.ttft_p99_ms:8.1f} ms  TPOT p99 {c.tpot_p99_ms:6.2f} ms  {c.config}"
    )


def summary_lines(rows: Sequence[Mapping[str, object]], slo: Slo) -> list[str]:
    """What `cbbench plan` prints: the SLO, the best configuration per GPU, the frontier, the misses."""
    cands = candidates(rows, slo)
    bounds = ", ".join(f"{name} <= {limit:g} ms" for _, name, limit in slo.bounds())
    best = best_per_gpu(cands)
    meet = sum(c.meets_slo for c in cands)
    lines = [f"SLO {bounds}: {meet} of {len(cands)} run(s) meet it"]
    lines.append(f"best per GPU: {_point(best).strip()}" if best else "best per GPU: no run meets the SLO")
    lines.append("frontier (output tok/s per GPU against TPOT p99; * meets the SLO):")
    lines += [f"  {'*' if c.meets_slo else ' '} {_point(c)}" for c in pareto(cands)]
    missed = [c for c in cands if not c.meets_slo]
    if missed:
        lines.append(f"missed the SLO ({len(missed)} run(s)):")
        lines += [f"    {c.config}: {'; '.join(c.misses)}" for c in missed]
    return lines
