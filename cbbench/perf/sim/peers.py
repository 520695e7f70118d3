"""The peer simulators' predictions of the measured rows (data/peer_predictions.csv, written by ci/peer_sims.sh):
a typed reader that refuses a malformed file, and `python -m cbbench.perf.sim.peers --summary`, each peer's median |error|
against the measurement, over all the rows it predicts and per model / GPU / TP / dtype group.

The CSV's columns are those of ci/peer_sims/common.py (the runners' side, which cannot import the project); a test
keeps the two equal. docs/peer-simulators.md says what each peer is given per row and why it cannot take the others.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DATA = Path(__file__).resolve().parent / "data"
PEER_PREDICTIONS = DATA / "peer_predictions.csv"
MEASURED_RUNS = DATA / "measured_runs.csv"
COLUMNS = ("id", "simulator", "simulator_version", "status", "ttft_ms", "tpot_ms", "output_throughput", "how", "error")
Status = Literal["ok", "unsupported", "error"]
STATUSES: tuple[Status, ...] = ("ok", "unsupported", "error")
# the versions ci/peer_sims.sh installs; a CSV from any other is not the committed comparison
PINNED_VERSIONS = {"vidur": "0.0.26", "aiconfigurator": "0.12.0"}


@dataclass(frozen=True)
class PeerPrediction:
    """One peer's answer for one measured row; ttft_ms / tpot_ms are set exactly when status is "ok"."""

    id: str
    simulator: str
    simulator_version: str
    status: Status
    ttft_ms: float | None
    tpot_ms: float | None
    output_throughput: float | None
    how: str
    error: str


def _number(text: str, field: str) -> float | None:
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field}: {text!r} is not a positive finite number")
    return value


def _parse(raw: dict[str, str]) -> PeerPrediction:
    status = raw["status"]
    if status not in STATUSES:
        raise ValueError(f"status: {status!r} is not one of {', '.join(STATUSES)}")
    if not raw["id"] or not raw["simulator"]:
        raise ValueError("id and simulator must be set")
    p = PeerPrediction(
        id=raw["id"],
        simulator=raw["simulator"],
        simulator_version=raw["simulator_version"],
        status=status,  # narrowed to Status by the check against STATUSES above
        ttft_ms=_number(raw["ttft_ms"], "ttft_ms"),
        tpot_ms=_number(raw["tpot_ms"], "tpot_ms"),
        output_throughput=_number(raw["output_throughput"], "output_throughput"),
        how=raw["how"],
        error=raw["error"],
    )
    if (p.status == "ok") != (p.ttft_ms is not None and p.tpot_ms is not None):
        raise ValueError(f"ttft_ms / tpot_ms: set on every ok row and on no other (status {p.status})")
    if p.status != "ok" and not p.error:
        raise ValueError(f"error: empty on a {p.status} row (it says why)")
    return p


def load_peer_predictions(path: Path | None = None) -> dict[tuple[str, str], PeerPrediction]:
    """Every prediction by (measured row id, simulator); ValueError naming the line and row of anything malformed."""
    path = PEER_PREDICTIONS if path is None else Path(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: header {reader.fieldnames} is not {list(COLUMNS)}")
        out: dict[tuple[str, str], PeerPrediction] = {}
        for raw in reader:
            where = f"{path}:{reader.line_num}: row {raw.get('id')!r}"
            if None in raw or any(v is None for v in raw.values()):
                raise ValueError(f"{where}: {len(COLUMNS)} fields expected")
            try:
                p = _parse(raw)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if (p.id, p.simulator) in out:
                raise ValueError(f"{where}: a second {p.simulator} prediction of this row")
            out[(p.id, p.simulator)] = p
    return out


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
    ap = argparse.ArgumentParser(prog="python -m cbbench.perf.sim.peers", description=__doc__.splitlines()[0])
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
