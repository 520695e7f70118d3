"""The cost model's calibration report: the same workload run on a real GPU and on `sim:<that gpu>`, and the error
of the simulation per configuration and metric (ci/gpu_check.sh's `calibration` step writes it).

    python -m benchmarks.sim_calibration REAL.csv OUTDIR PERF_ARGS...

runs `cbbench perf PERF_ARGS --output OUTDIR/sim.csv` (PERF_ARGS name the `sim:<gpu>` device and the real run's
workload) and writes OUTDIR/calibration.csv.

Rows are matched on (engine, batching, max_num_seqs): the device columns differ by design. The error is
(simulated - real) / real; a configuration that only one side has is listed with an empty error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from cbbench.perf.results.files import read_csv

METRICS = (
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "duration",
)
MATCH = ("engine", "batching", "max_num_seqs")


def calibration(real: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, metric): the real value, the simulated one and the relative error."""
    real_m = real.groupby(list(MATCH))[list(METRICS)].median()
    sim_m = sim.groupby(list(MATCH))[list(METRICS)].median()
    out = []
    for key in sorted(set(real_m.index) | set(sim_m.index), key=str):
        for m in METRICS:
            r = real_m[m].get(key) if key in real_m.index else None
            s = sim_m[m].get(key) if key in sim_m.index else None
            err = (s - r) / r if r and s is not None and pd.notna(r) and pd.notna(s) else None
            out.append({**dict(zip(MATCH, key)), "metric": m, "real": r, "simulated": s, "error": err})
    return pd.DataFrame(out)


def run_perf(perf_args: list[str], csv: Path) -> int:
    """`cbbench perf PERF_ARGS --output CSV --quiet` in this process; its exit code (0: done)."""
    from cbbench.perf.cli import app

    try:
        app(["perf", *perf_args, "--output", str(csv), "--quiet"])
    except SystemExit as e:  # the CLI's own exit (it has printed its one-line error)
        if e.code:
            return int(e.code)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m benchmarks.sim_calibration REAL.csv OUTDIR PERF_ARGS...", file=sys.stderr)
        return 2
    out = Path(argv[1])
    sim_csv = out / "sim.csv"
    if not Path(argv[0]).is_file():  # the real run failed or ran out of time: nothing to calibrate against
        print(f"sim_calibration: no real run {argv[0]}", file=sys.stderr)
        return 2
    code = run_perf(argv[2:], sim_csv)
    if code:
        return code
    try:
        real, sim = read_csv(argv[0]), read_csv(sim_csv)
    except (OSError, ValueError) as e:
        print(f"sim_calibration: {e}", file=sys.stderr)
        return 2
    report = calibration(real, sim)
    report.to_csv(out / "calibration.csv", index=False)
    print(report.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
