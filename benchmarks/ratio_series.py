"""Does the main command's interval hold? The README's `cbbench perf --workload sharegpt` run N times back to back,
then N more beside one CPU-bound neighbour process, each run's wall time, load average, and every ratio with its
interval (continuous / static, refengine continuous / each peer), then per ratio how many runs' intervals hold every
other run's estimate, and whether any run's interval lies wholly on the other side of 1 from another's estimate.

    python -m benchmarks.ratio_series OUTDIR [--runs 5] [--neighbour-runs 5] [-- PERF OPTIONS]

The goal (issue 45): on a quiet machine every interval holds the others' estimates; beside the neighbour the
intervals widen, and none lies wholly across 1 from another run's estimate. A benchmark: it prints what it saw and
asserts nothing. Each run's CSV, JSON and table stay in OUTDIR; `series.json` holds every number printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cbbench.perf.report.table import ratios
from cbbench.perf.results.rows import read_rows
from cbbench.perf.stats import Shift

MAIN = ["perf", "--workload", "sharegpt"]  # the README's main command, at its defaults


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else ""


def _entries(csv: Path) -> list[Any]:
    rows = read_rows(csv)
    return [((str(r.get("engine")), str(r.get("batching")), "-"), r, None) for r in rows]


def _named(csv: Path) -> dict[str, Shift]:
    """Every ratio of one run, by a name a person reads."""
    vs_static, vs_peer = ratios(_entries(csv))
    out = {f"{mode} / static": s for (_, mode, _), s in vs_static.items()}
    out.update({f"refengine continuous / {eng}": s for (eng, _, _), s in vs_peer.items()})
    return out


def agreement(runs: Sequence[tuple[float, float, float]]) -> tuple[int, int]:
    """(how many runs' intervals hold every other run's estimate, how many (run, other) pairs have the run's interval
    wholly on the other side of 1 from the other's estimate). Each run: (estimate, low, high)."""
    holds = sum(
        all(low <= e <= high for j, (e, _, _) in enumerate(runs) if j != i) for i, (_, low, high) in enumerate(runs)
    )
    across = sum(
        1
        for i, (_, low, high) in enumerate(runs)
        for j, (e, _, _) in enumerate(runs)
        if i != j and ((low > 1 and e < 1) or (high < 1 and e > 1))
    )
    return holds, across


def run_series(out: Path, n: int, neighbour: bool, perf_args: Sequence[str], tag: str) -> list[dict[str, Any]]:
    lines = []
    spinner = None
    if neighbour:  # one CPU-bound process beside every run of this series
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for k in range(n):
            csv = out / f"{tag}-{k + 1}.csv"
            argv = [sys.executable, "-m", "cbbench.perf.cli", *MAIN, *perf_args, "--output", str(csv)]
            before, t0 = _load(), time.perf_counter()
            with (out / f"{tag}-{k + 1}.txt").open("w") as f:
                proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
            wall = time.perf_counter() - t0
            line: dict[str, Any] = {"series": tag, "run": k + 1, "exit": proc.returncode, "wall_s": round(wall, 1)}
            line.update(load_before=before, load_after=_load())
            if proc.returncode == 0:
                line["ratios"] = {
                    name: {"ratio": s.ratio, "low": s.low, "high": s.high, "runs": [s.n_base, s.n_head]}
                    for name, s in _named(csv).items()
                }
            lines.append(line)
            print(json.dumps(line), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return lines


def summarise(lines: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for tag in dict.fromkeys(x["series"] for x in lines):
        done = [x for x in lines if x["series"] == tag and "ratios" in x]
        for name in dict.fromkeys(n for x in done for n in x["ratios"]):
            runs = [(r["ratio"], r["low"], r["high"]) for x in done if (r := x["ratios"].get(name))]
            holds, across = agreement(runs)
            shown = "; ".join(f"{e:.2f}x ({lo:.2f}-{hi:.2f})" for e, lo, hi in runs)
            out.append(
                f"{tag}, {name}: {shown}; {holds} of {len(runs)} intervals hold every other run's estimate; "
                f"{across} interval(s) wholly across 1 from another run's estimate"
            )
        walls = [x["wall_s"] for x in lines if x["series"] == tag]
        loads = [x["load_before"].split()[0] for x in lines if x["series"] == tag and x["load_before"]]
        out.append(f"{tag}: wall {', '.join(f'{w:.0f} s' for w in walls)}; load (1 min) before each {', '.join(loads)}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("out", type=Path, help="folder for every run's files and series.json")
    p.add_argument("--runs", type=int, default=5, help="runs back to back on the machine as it is")
    p.add_argument("--neighbour-runs", type=int, default=5, help="runs beside one CPU-bound neighbour process")
    p.add_argument("perf_args", nargs="*", help="after --: more `cbbench perf` options (default: none)")
    args = p.parse_args(argv)
    if args.runs < 0 or args.neighbour_runs < 0:
        p.error("--runs and --neighbour-runs must be >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = run_series(args.out, args.runs, False, args.perf_args, "quiet")
    lines += run_series(args.out, args.neighbour_runs, True, args.perf_args, "neighbour")
    (args.out / "series.json").write_text(json.dumps(lines, indent=1))
    for line in summarise(lines):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
