"""What every peer-simulator runner under ci/peer_sims/ shares: the measured rows it reads, the columns of
perf/sim/data/peer_predictions.csv it writes, and the part-file format the runners hand to merge.py.

Standard library only: each runner runs in its peer's own venv (.venv-vidur, .venv-aiconfigurator), where cbbench is
not installed, so nothing here may import the project. perf/sim/peers.py reads the merged CSV on the project's side;
its COLUMNS must stay equal to these (perf/tests/sim/test_peer_predictions.py checks that they do).
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "perf" / "sim" / "data" / "measured_runs.csv"
DEFAULT_OUT = REPO / "perf" / "sim" / "data" / "peer_predictions.csv"
COLUMNS = ("id", "simulator", "simulator_version", "status", "ttft_ms", "tpot_ms", "output_throughput", "how", "error")
STATUSES = ("ok", "unsupported", "error")


def measured_rows(path: Path = MEASURED) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def fixed_closed_loop(row: dict[str, str]) -> str | None:
    """Why a row is not a fixed-length, fixed-concurrency run (the only kind both peers take), or None if it is."""
    if row["workload"] != "fixed":
        return f"workload={row['workload']}: the peer is given one isl/osl per run, not a length distribution"
    if not row["concurrency"]:
        return "no client concurrency (a rate-limited run): the peer's batch size has nothing to map from"
    return None


def prediction(
    row_id: str,
    simulator: str,
    version: str,
    status: str,
    how: str,
    *,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    output_throughput: float | None = None,
    error: str = "",
) -> dict[str, str]:
    """One output row; an `ok` row must carry finite positive TTFT and TPOT (checked here, before it is written)."""
    if status not in STATUSES:
        raise ValueError(f"status: {status!r} is not one of {STATUSES}")
    if status == "ok":
        for name, value in (("ttft_ms", ttft_ms), ("tpot_ms", tpot_ms)):
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}: {value!r} for an ok row {row_id}")

    def num(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    # one line per row: the error texts of both peers can hold newlines
    return {
        "id": row_id,
        "simulator": simulator,
        "simulator_version": version,
        "status": status,
        "ttft_ms": num(ttft_ms, 3),
        "tpot_ms": num(tpot_ms, 4),
        "output_throughput": num(output_throughput, 2),
        "how": how.replace("\n", " "),
        "error": " ".join(error.split())[:300],
    }


def write_part(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def runner_start(doc: str, dist: str, pinned: str) -> tuple[Path, str, list[dict[str, str]]]:
    """A runner's command line (`PART [--limit N]`) and the checks before it predicts: the peer's installed version
    must be the one ci/peer_sims.sh pins. Returns the part file to write, that version and the rows to predict."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("part", type=Path, help="where to write this peer's rows")
    ap.add_argument("--limit", type=int, default=0, help="only the first N measured rows (a quick check)")
    args = ap.parse_args()
    version = importlib.metadata.version(dist)
    if version != pinned:
        sys.exit(f"{dist} {version} installed; ci/peer_sims.sh pins {pinned}")
    rows = measured_rows()
    return args.part, version, rows[: args.limit] if args.limit else rows
