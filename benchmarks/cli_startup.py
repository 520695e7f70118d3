"""Wall time of the commands a user runs most and that need no engine: `cbbench --help`, `compare A B`, `show A`,
`plot --help` and `report --help`.

    python -m benchmarks.cli_startup [--repeats 7] [--target-s 1.0]

Each repeat starts the venv's `cbbench` script in a fresh process (what a user's shell does); the commands
alternate, so a slow patch of a shared machine hits all of them. Prints, per command, the median wall time with its
ratio to the target, its spread, and the median CPU time (user + sys of the process: on a shared machine the wall
time adds the wait for a core, so compare CPU times across machines). `compare` and `show` read two small CSVs
written here (two configurations, three repeats each) that differ by less than any tolerance. It asserts nothing:
the numbers are for a reader (and the machine's load, printed with them).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_TARGET_S = 1.0  # the goal for a command that needs no engine
COMMAND_TIMEOUT_S = 120  # a cold start on a loaded machine is slow, never this slow


def write_csvs(folder: Path) -> tuple[Path, Path]:
    """Two results CSVs of the same configurations, the second 1% faster (within every default tolerance)."""
    from cbbench.perf.results.columns import ResultRow
    from cbbench.perf.results.files import write_csv
    from cbbench.perf.results.schema import make_row

    knobs = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16, "dtype": "float32"}

    def rows(scale: float) -> list[ResultRow]:
        metrics = {
            "request_throughput": 2.0 / scale,
            "output_throughput": 200.0 / scale,
            **{
                f"{s}_{m}_ms": 100.0 * scale for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")
            },
        }
        return [
            make_row(
                metrics=metrics,
                engine="refengine",
                workload="fixed",
                batching=b,
                config=knobs,
                repeat=r,
                model="tiny-qwen2",
                device="cpu",
                git_sha="bench",
                timestamp="2026-01-01T00:00:00+00:00",
            )
            for b in ("continuous", "static")
            for r in range(3)
        ]

    return write_csv(folder / "a.csv", rows(1.0)), write_csv(folder / "b.csv", rows(0.99))


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_command(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run: on a shared machine the CPU time is what the command itself costs,
    the wall time adds the wait for a core."""
    t, cpu = time.perf_counter(), _children_cpu_s()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    elapsed = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return elapsed, _children_cpu_s() - cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--target-s", type=float, default=DEFAULT_TARGET_S)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats: must be >= 1")
    exe = str(Path(sys.executable).with_name("cbbench"))
    with tempfile.TemporaryDirectory() as tmp:
        a, b = write_csvs(Path(tmp))
        commands = {
            "cbbench --help": [exe, "--help"],
            "cbbench compare a.csv b.csv": [exe, "compare", str(a), str(b)],
            "cbbench show a.csv": [exe, "show", str(a)],
            "cbbench plot --help": [exe, "plot", "--help"],
            "cbbench report --help": [exe, "report", "--help"],
        }
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.repeats):  # interleaved
            for name, cmd in commands.items():
                times[name].append(time_command(cmd))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min), {os.cpu_count()} cores")
    for name, ts in times.items():
        wall, cpu = [w for w, _ in ts], [c for _, c in ts]
        med = statistics.median(wall)
        verdict = "ok" if med < args.target_s else "OVER TARGET"
        print(
            f"{name:30s} wall median {med:.3f} s = {med / args.target_s:.2f}x target (min {min(wall):.3f}, "
            f"max {max(wall):.3f}); CPU median {statistics.median(cpu):.3f} s  (n={len(ts)}, {verdict})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
