"""Each peer simulator's median |error| against the measurement, over all the rows it predicts and per model / GPU /
TP / dtype group: `python -m benchmarks.peer_errors --summary` (docs/peer-simulators.md). The predictions are read by
cbbench/perf/sim/peers.py, which `cbbench sim validate` shares; this table is the project's study of the peers.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from cbbench.perf.sim.peers import MEASURED_RUNS, PEER_PREDICTIONS, PeerPrediction, load_peer_predictions


def _measured(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def _medians(pairs: list[tuple[float, float]]) -> str:
    """Median |predicted - measured| / measured and the median signed error (the bias), in percent."""
    if not pairs:
        return "- | -"
    errors = [(p - m) / m for p, m in pairs]
    return f"{100 * statistics.median(abs(e) for e in errors):.1f}% | {100 * statistics.median(errors):+.1f}%"


def summary(predictions: dict[tuple[str, str], PeerPrediction], measured: dict[str, dict[str, str]]) -> list[str]:
    """A markdown table: per peer, over all its ok rows and per (model, GPU, TP, dtype) group: n, median |error|, bias."""
    groups: dict[tuple[str, str], list[tuple[PeerPrediction, dict[str, str]]]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (row_id, sim), p in sorted(predictions.items()):
        counts[sim][1] += 1
        if p.status != "ok":
            continue
        counts[sim][0] += 1
        row = measured[row_id]
        groups[(sim, "all rows it predicts")].append((p, row))
        groups[(sim, f"{row['model']} {row['gpu']} tp{row['tensor_parallel_size']} {row['dtype']}")].append((p, row))
    lines = [
        "| simulator | rows | n | TTFT median abs error | TTFT bias | TPOT median abs error | TPOT bias |",
        "|---|---|---|---|---|---|---|",
    ]
    for sim in sorted(counts):
        if counts[sim][0] == 0:
            lines.append(f"| {sim} | none of {counts[sim][1]} predicted | 0 | - | - | - | - |")
    for (sim, label), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1][0] != "a", kv[0][1])):
        ttft = [(p.ttft_ms, float(r["ttft_ms"])) for p, r in members if p.ttft_ms is not None]
        tpot = [(p.tpot_ms, float(r["tpot_ms"])) for p, r in members if p.tpot_ms is not None]
        lines.append(f"| {sim} | {label} | {len(members)} | {_medians(ttft)} | {_medians(tpot)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peer_errors", description=__doc__.splitlines()[0])
    ap.add_argument("--summary", action="store_true", help="print each peer's median |error| vs the measurement")
    ap.add_argument("--path", type=Path, default=PEER_PREDICTIONS, help="a peer predictions CSV")
    args = ap.parse_args(argv)
    try:
        predictions = load_peer_predictions(args.path)
    except (OSError, ValueError) as e:
        print(f"error: --path: {e}", file=sys.stderr)
        return 2
    measured = _measured(MEASURED_RUNS)
    unknown = sorted({row_id for row_id, _ in predictions if row_id not in measured})
    if unknown:
        print(f"error: --path: {len(unknown)} ids not in measured_runs.csv, first {unknown[0]!r}", file=sys.stderr)
        return 2
    if args.summary:
        print("\n".join(summary(predictions, measured)))
    else:
        by_status: dict[tuple[str, str], int] = defaultdict(int)
        for p in predictions.values():
            by_status[(p.simulator, p.status)] += 1
        for (sim, status), n in sorted(by_status.items()):
            print(f"{sim} {status}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
