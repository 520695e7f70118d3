"""Merge the peers' part files into perf/sim/data/peer_predictions.csv and say what each peer predicted.

    python3 ci/peer_sims/merge.py OUT PART_CSV... [--seconds S]

Rows come out in measured_runs.csv's order, one per (measured row, simulator), so a rerun's diff shows only what
changed. Refuses a part with a row id that is not a measured row, or one (id, simulator) twice.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import COLUMNS, measured_rows, write_part  # noqa: E402


def merge(parts: list[Path]) -> list[dict[str, str]]:
    order = {row["id"]: i for i, row in enumerate(measured_rows())}
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for part in parts:
        with part.open(newline="") as f:
            for row in csv.DictReader(f):
                key = (row["id"], row["simulator"])
                if row["id"] not in order:
                    sys.exit(f"{part}: id {row['id']!r} is not a row of measured_runs.csv")
                if key in seen:
                    sys.exit(f"{part}: {key} twice")
                seen[key] = {c: row[c] for c in COLUMNS}
    return [seen[k] for k in sorted(seen, key=lambda k: (order[k[0]], k[1]))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("parts", type=Path, nargs="+")
    ap.add_argument("--seconds", type=int, default=None, help="the run's wall time, for the closing line")
    args = ap.parse_args()
    rows = merge(args.parts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_part(args.out, rows)
    counts = Counter((r["simulator"], r["status"]) for r in rows)
    for sim in sorted({r["simulator"] for r in rows}):
        total = sum(n for (s, _), n in counts.items() if s == sim)
        by_status = ", ".join(f"{n} {st}" for (s, st), n in sorted(counts.items()) if s == sim)
        print(f"{sim}: predicted {counts[(sim, 'ok')]} of {total} rows ({by_status})")
    took = f" in {args.seconds // 60} min {args.seconds % 60} s" if args.seconds is not None else ""
    print(f"wrote {len(rows)} rows to {args.out}{took}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
