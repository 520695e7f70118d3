"""Real / simulated throughput per configuration: one workload run on a real device and on its simulated twin
(`sim:<gpu>`: the same scheduler on measured kernel times), and continuous / static on each side.

    python -m benchmarks.real_vs_sim OUTDIR [--real-device cuda] [--sim-device sim:h200] PERF_ARGS...

runs `cbbench perf PERF_ARGS --device REAL` into OUTDIR/real.csv and `--device SIM` into OUTDIR/sim.csv (PERF_ARGS
name the model, workload and configurations, never the device), matches their rows as benchmarks/sim_calibration.py
does (engine, batching, max_num_seqs), writes OUTDIR/real_vs_sim.csv and prints, per configuration, the output
throughput of each side and real / simulated, then continuous / static on each side. A benchmark: it prints ratios,
it checks no goal (the H200's goals are in docs/engine.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from benchmarks.sim_calibration import MATCH, calibration, run_perf
from cbbench.perf.results.files import read_csv

METRIC = "output_throughput"


def throughput_ratios(real: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: real and simulated output throughput (medians over repeats) and real / sim."""
    report = calibration(real, sim)
    rows = report[report["metric"] == METRIC].drop(columns=["metric", "error"])
    rows = rows.rename(columns={"real": "real_tok_s", "simulated": "sim_tok_s"})
    ok = rows["real_tok_s"].notna() & rows["sim_tok_s"].notna() & (rows["sim_tok_s"] > 0)
    rows["real_over_sim"] = (rows["real_tok_s"] / rows["sim_tok_s"]).where(ok)
    return rows.reset_index(drop=True)


def continuous_over_static(rows: pd.DataFrame, column: str) -> dict[tuple[str, object], float]:
    """Per (engine, max_num_seqs): continuous / static of `column`, where both modes ran."""
    out = {}
    for (engine, seqs), group in rows.groupby(["engine", "max_num_seqs"]):
        by = dict(zip(group["batching"], group[column]))
        if by.get("continuous") and by.get("static"):
            out[(str(engine), seqs)] = float(by["continuous"] / by["static"])
    return out


def format_report(rows: pd.DataFrame) -> str:
    lines = [
        f"{'engine':>10} {'batching':>10} {'max_num_seqs':>12} {'real tok/s':>11} {'sim tok/s':>10} {'real/sim':>9}"
    ]
    for r in rows.itertuples(index=False):
        d = r._asdict()
        ratio = d["real_over_sim"]
        lines.append(
            f"{d['engine']:>10} {d['batching']:>10} {d['max_num_seqs']:>12} {d['real_tok_s']:>11.1f} "
            f"{d['sim_tok_s']:>10.1f} {'-' if pd.isna(ratio) else f'{ratio:.2f}x':>9}"
        )
    for side, column in (("real", "real_tok_s"), ("simulated", "sim_tok_s")):
        for (engine, seqs), ratio in continuous_over_static(rows, column).items():
            lines.append(f"continuous / static ({side}, {engine}, max_num_seqs {seqs}): {ratio:.2f}x")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_vs_sim", add_help=True)
    p.add_argument("outdir")
    p.add_argument("--real-device", default="cuda")
    p.add_argument("--sim-device", default="sim:h200")
    a, perf_args = p.parse_known_args(argv)
    if "--device" in perf_args:
        print("real_vs_sim: PERF_ARGS must not name --device (give --real-device / --sim-device)", file=sys.stderr)
        return 2
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    for device, name in ((a.real_device, "real.csv"), (a.sim_device, "sim.csv")):
        code = run_perf([*perf_args, "--device", device], out / name)
        if code:
            return code
    try:
        real, sim = read_csv(out / "real.csv"), read_csv(out / "sim.csv")
    except (OSError, ValueError) as e:
        print(f"real_vs_sim: {e}", file=sys.stderr)
        return 2
    rows = throughput_ratios(real, sim)
    rows.to_csv(out / "real_vs_sim.csv", index=False)
    print(f"output throughput, {a.real_device} vs {a.sim_device} ({', '.join(MATCH)} matched)")
    print(format_report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
