"""The GPU baseline's runs and files, the Python side of ci/gpu_check.sh and ci/gpu_gate.sh (each subcommand is run
by perf/tests/test_gpu_scripts.py on a CPU, on the simulated H200, so a change here cannot break a GPU script
unseen):

    python -m benchmarks.gpu_runs perf OUTDIR [--floor MODEL:RUNNING:CONTEXT]... @NAME PERF_ARGS... [@NAME2 ...]
    python -m benchmarks.gpu_runs merge OUT.csv IN.csv...
    python -m benchmarks.gpu_runs split BASELINE.csv OUTDIR
    python -m benchmarks.gpu_runs summary CSV...

`perf`: one `cbbench perf PERF_ARGS --output OUTDIR/NAME.csv --quiet` per group, all in this process, with the
preset weights kept between them (a model's weights are drawn once for all its workloads: an 8B preset's take most
of a minute); every group runs even when one fails; exit 1 when one did. Each `--floor` then times a decode step of MODEL at
RUNNING requests of CONTEXT tokens against its floor (benchmarks/step_floor.py), on the groups' device and in
the same process (the weights the groups drew serve it too), into OUTDIR/step-floor.txt. `merge`: the results CSVs as one file,
byte for byte (each checked whole and non-empty first): the baseline is every workload of every model; an input
that is missing (its run failed or ran out of time) is named and left out, and the exit is 1. `split`: the
baseline as one file per (workload, its parameters, model, device, dtype), the unit `perf --like` reruns; prints
their paths, one a line. `summary`: one line per run (model, workload, engine, mode, requests, output tok/s,
TTFT and ITL means) and each file's continuous / static throughput: what a GPU check's summary shows.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from cbbench.perf.results.files import atomic_write_text, checked_lines, read_csv

# the columns that tell one `perf --like` invocation's runs from another's (perf/plan/like.py's groups)
LIKE_GROUP_COLUMNS = ("workload", "workload_params", "model", "device", "dtype")


def parse_groups(args: list[str]) -> list[tuple[str, list[str]]]:
    """`@NAME ARGS... @NAME2 ARGS...` -> [(NAME, ARGS), ...]; ValueError on args before the first @NAME, an empty
    or repeated name."""
    groups: list[tuple[str, list[str]]] = []
    for a in args:
        if a.startswith("@"):
            name = a[1:]
            if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"gpu_runs: {a!r} is not a group name (letters, digits, '-', '_', '.')")
            if any(name == n for n, _ in groups):
                raise ValueError(f"gpu_runs: group {name} is named twice")
            groups.append((name, []))
        elif not groups:
            raise ValueError(f"gpu_runs: {a!r} comes before the first @NAME")
        else:
            groups[-1][1].append(a)
    if not groups:
        raise ValueError("gpu_runs perf: no @NAME group given")
    return groups


# a --floor's timed decode steps (after its warm-up ones): enough for a stable mean, few beside the runs
FLOOR_ITERS, FLOOR_WARMUP = 10, 3


def parse_floor(spec: str) -> tuple[str, int, int]:
    """ "MODEL:RUNNING:CONTEXT" -> (model, running, context); ValueError naming the spec otherwise."""
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"gpu_runs: --floor {spec!r} is not MODEL:RUNNING:CONTEXT")
    return parts[0], int(parts[1]), int(parts[2])


def _device_of(groups: list[tuple[str, list[str]]]) -> str:
    for _, args in groups:
        if "--device" in args[:-1]:
            return args[args.index("--device") + 1]
    return "cpu"


def run_floors(outdir: Path, floors: list[tuple[str, int, int]], device: str) -> list[str]:
    """Each decode step against its floor, as step_floor's table, into OUTDIR/step-floor.txt; the specs that failed."""
    from benchmarks.step_floor import bench_step_floor, format_table

    rows, failed = [], []
    for model, running, context in floors:
        print(f"== gpu_runs floor: {model} at {running} running, {context}-token contexts, on {device}", flush=True)
        try:
            rows.append(bench_step_floor(model, device, running, context, FLOOR_ITERS, FLOOR_WARMUP))
        except (RuntimeError, ValueError) as e:  # (CUDA out of memory is a RuntimeError)
            print(f"gpu_runs floor {model}: {e}", flush=True)
            failed.append(f"{model}:{running}:{context}")
    if rows:
        table = format_table(rows)
        print(table, flush=True)
        with open(outdir / "step-floor.txt", "a", encoding="utf-8") as f:
            f.write(table + "\n")
    return failed


def run_groups(
    outdir: Path, groups: list[tuple[str, list[str]]], floors: list[tuple[str, int, int]] | None = None
) -> int:
    """Each group's `cbbench perf`, then each floor, in this process, sharing the preset weights; 0 when every one
    succeeded."""
    from cbbench.perf.cli import app
    from refengine.worker.worker import keep_preset_weights

    outdir.mkdir(parents=True, exist_ok=True)
    failed = []
    with keep_preset_weights():
        for name, args in groups:
            out = outdir / f"{name}.csv"
            print(f"== gpu_runs {name}: cbbench perf {' '.join(args)}", flush=True)
            try:
                app(["perf", *args, "--output", str(out), "--quiet"])
                code = 0
            except SystemExit as e:  # the CLI's own exit: it has printed its one-line error
                code = int(e.code or 0) if not isinstance(e.code, str) else 1
            if code:
                failed.append(name)
                print(f"gpu_runs {name}: exit {code}", flush=True)
        failed += run_floors(outdir, floors or [], _device_of(groups))
    if failed:
        print(f"gpu_runs: failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    read_csv(path)  # whole, of this schema, with rows, numbers where metrics are
    _, lines = checked_lines(path)
    return lines[0], lines[1:]


def _write(path: Path, header: list[str], rows: list[list[str]]) -> None:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([header, *rows])
    atomic_write_text(path, buf.getvalue())


def merge(out: Path, inputs: list[Path]) -> tuple[int, list[Path]]:
    """Write the rows of `inputs` that exist, in order, as one results CSV; (rows written, inputs missing)."""
    header: list[str] | None = None
    rows: list[list[str]] = []
    missing = [p for p in inputs if not p.exists()]
    present = [p for p in inputs if p.exists()]
    for path in present:
        h, r = _rows(path)
        if header is not None and h != header:
            raise ValueError(f"{path}: its header differs from {present[0]}'s")
        header = h
        rows += r
    if header is None:
        raise ValueError(f"gpu_runs merge: none of the {len(inputs)} input file(s) exists")
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(out, header, rows)
    return len(rows), missing


def summary(paths: list[Path]) -> list[str]:
    """One line per run of each file that exists, then its continuous / static output throughput."""
    lines = []
    for path in paths:
        if not path.exists():
            lines.append(f"{path.stem}: missing")
            continue
        df = read_csv(path)
        for r in df.itertuples():
            lines.append(
                f"{path.stem}: {r.model} {r.workload} {r.engine} {r.batching} {r.completed}/{r.num_prompts} "
                f"out {r.output_throughput:.0f} tok/s, TTFT mean {r.mean_ttft_ms:.1f} ms, ITL mean {r.mean_itl_ms:.2f} ms"
            )
        ref = df[df["engine"] == "refengine"].groupby("batching")["output_throughput"].median()
        if {"continuous", "static"} <= set(ref.index):
            lines.append(f"{path.stem}: continuous / static {ref['continuous'] / ref['static']:.2f}x")
    return lines


def split(baseline: Path, outdir: Path) -> list[Path]:
    """One file per `perf --like` group of `baseline`, in the order their first rows come; their paths."""
    header, rows = _rows(baseline)
    cols = [header.index(c) for c in LIKE_GROUP_COLUMNS]
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[i] for i in cols), []).append(r)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(groups.values()):
        path = outdir / f"{baseline.stem}.part{i}.csv"
        _write(path, header, part)
        paths.append(path)
    return paths


USAGE = __doc__.split("\n\n")[1] if __doc__ else ""


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("perf", "merge", "split", "summary"):
        print(f"usage:\n{USAGE}", file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "perf":
            outdir, args, floors = Path(rest[0]), rest[1:], []
            while args[:1] == ["--floor"] and len(args) > 1:
                floors.append(parse_floor(args[1]))
                args = args[2:]
            return run_groups(outdir, parse_groups(args), floors)
        if cmd == "merge":
            n, missing = merge(Path(rest[0]), [Path(p) for p in rest[1:]])
            print(f"wrote {rest[0]}: {n} rows from {len(rest) - 1 - len(missing)} file(s)")
            if missing:
                print(f"gpu_runs merge: missing (left out): {' '.join(map(str, missing))}", file=sys.stderr)
            return 1 if missing else 0
        if cmd == "summary":
            print("\n".join(summary([Path(p) for p in rest])))
            return 0
        if len(rest) != 2:
            print("usage: python -m benchmarks.gpu_runs split BASELINE.csv OUTDIR", file=sys.stderr)
            return 2
        for path in split(Path(rest[0]), Path(rest[1])):
            print(path)
        return 0
    except (OSError, ValueError) as e:
        print(f"gpu_runs {cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
