"""The peer simulators' predictions of the measured rows (data/peer_predictions.csv, written by ci/peer_sims.sh):
a typed reader that refuses a malformed file (`cbbench sim validate` puts them beside the simulator's own errors).
Each peer's median |error| over the rows, the project's own study of the peers, is benchmarks/peer_errors.py's.

The CSV's columns are those of ci/peer_sims/common.py (the runners' side, which cannot import the project); a test
keeps the two equal. docs/peer-simulators.md says what each peer is given per row and why it cannot take the others.
"""

from __future__ import annotations

import csv
import math
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
