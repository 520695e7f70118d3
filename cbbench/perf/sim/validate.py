"""`cbbench sim validate`: replay every measured serving run through `cbbench perf --device sim:<gpu>` and report
the simulator's error per row and its medians, beside the peer simulators' predictions on the same rows.

Each row runs the exact `cbbench perf` command line `Protocol.perf_argv` prints (in-process, so the simulated
engine, the perf runner and the metrics are the ones a user gets); rows run in parallel worker processes and are
written to the output CSV as they finish, so an interrupted validation resumes (`--resume`). A row's result is
only reused when the cost model's version and the protocol are the same. What runs a command line is handed down by
the command line itself (`RunCommand`: cbbench.perf.cli.main's `run_command_line`, passed to worker processes by
name), so that this module, which the `sim validate` command runs, never imports the command line back.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from cbbench.perf.json_values import JSONValue
from cbbench.perf.results.rows import number, read_rows
from cbbench.perf.results.run_json import read_run
from cbbench.perf.sim.measured import MeasuredRun, Protocol

RESULT_FIELDS = ("ttft_ms", "tpot_ms", "output_throughput")
# runs a `cbbench` command line (["perf", ...]) in this process; a failure raises (or exits, as click does)
RunCommand = Callable[[list[str]], None]


@dataclass(frozen=True)
class Replay:
    """The simulated figures of one measured run (means over the measured requests, as the run's client took)."""

    id: str
    cost_model: str
    rounds: int
    protocol: str  # Protocol.key: its prompt pool (0: every prompt distinct) and its server's limits
    ttft_ms: float  # means over the measured requests (a long-output row: as if all its rounds ran, see below)
    tpot_ms: float
    median_ttft_ms: float
    median_tpot_ms: float
    output_throughput: float
    num_preemptions: int
    steps: int
    wall_s: float
    error: str = ""


def _cost_model_version() -> str:
    from refengine.sim.cost_model import COST_MODEL_VERSION  # (brings in numpy)

    return COST_MODEL_VERSION


def replay(run: MeasuredRun, protocol: Protocol, run_command: RunCommand) -> Replay:
    """Run `cbbench perf` on `run`'s command line (its output silenced) and read its CSV row back."""

    version = _cost_model_version()
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cbbench-validate-") as tmp:
        argv = [*protocol.perf_argv(run), "--quiet", "--output", str(Path(tmp) / "run.csv")]
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                run_command(argv)
            (row,) = read_rows(Path(tmp) / "run.csv")
            ttft = number(row.get("mean_ttft_ms"))
            if protocol.rounds_for(run) < protocol.rounds:
                ttft = _as_if_all_rounds(Path(tmp) / "run.json", run, protocol.rounds)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one failed row is reported, the others go on
            last = sink.getvalue().strip().splitlines()[-1:] or [f"{type(e).__name__}: {e}"]
            nan = math.nan
            rounds, key = protocol.rounds_for(run), protocol.key(run)
            return Replay(run.id, version, rounds, key, nan, nan, nan, nan, nan, 0, 0, 0.0, last[0])
    return Replay(
        run.id,
        version,
        protocol.rounds_for(run),
        protocol.key(run),
        ttft,
        number(row.get("mean_tpot_ms")),
        number(row.get("median_ttft_ms")),
        number(row.get("median_tpot_ms")),
        number(row.get("output_throughput")),
        int(number(row.get("num_preemptions"))),
        int(number(row.get("num_steps"))),
        time.perf_counter() - wall,
    )


def _as_if_all_rounds(json_path: Path, run: MeasuredRun, rounds: int) -> float:
    """Mean TTFT (ms) as a run of `rounds` rounds would weigh a shorter replay's: a long-output row replays fewer
    rounds (Protocol.long_rounds), and its opening round, all c prompts at once into an idle server, is a far larger
    share of its requests than of the measured run's 20 rounds. The opening round (the first c arrivals) keeps its
    weight of 1 in `rounds`; the replayed rounds after it stand for the rest."""

    (records,) = read_run(json_path)["records"].values()
    by_arrival = sorted(records, key=lambda r: _seconds(r["arrival_time"]))
    ttfts = [1e3 * (_seconds(r["first_token_time"]) - _seconds(r["arrival_time"])) for r in by_arrival]
    c = run.concurrency or len(ttfts)
    opening, rest = ttfts[:c], ttfts[c:]
    if not rest:
        return sum(opening) / len(opening)
    return (sum(opening) / len(opening) + (rounds - 1) * sum(rest) / len(rest)) / rounds


def _seconds(v: JSONValue) -> float:
    """A record's time as float() reads it (TypeError for null: a request with no first token)."""
    if isinstance(v, (int, float, str)):
        return float(v)
    raise TypeError(f"a record's time is {v!r}, not a number")


def read_replays(path: Path) -> dict[str, Replay]:
    """The replays an earlier validation wrote to `path` (none if it does not exist)."""
    if not path.exists():
        return {}
    out = {}
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            kw = {}
            for fld in fields(Replay):
                cell = r[fld.name]
                kw[fld.name] = (
                    float(cell) if fld.type == "float" else int(cell) if fld.type == "int" else cell
                )  # (the annotations are strings under `from __future__ import annotations`)
            out[r["id"]] = Replay(**kw)  # type: ignore[arg-type]  # built field by field from the dataclass
    return out


def write_replays(path: Path, replays: Iterable[Replay]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fld.name for fld in fields(Replay)], lineterminator="\n")
        w.writeheader()
        for r in replays:
            w.writerow(asdict(r))
    os.replace(tmp, path)


def replay_all(
    runs: Sequence[MeasuredRun],
    protocol: Protocol,
    run_command: RunCommand,
    *,
    workers: int = 1,
    done: dict[str, Replay] | None = None,
    on_result: Callable[[Replay], None] | None = None,
) -> dict[str, Replay]:
    """Every run's replay: reused from `done` when made by this cost model and protocol, else simulated (in
    `workers` processes, longest runs first so the pool drains evenly)."""
    version = _cost_model_version()
    out: dict[str, Replay] = {}
    todo = []
    for run in runs:
        old = (done or {}).get(run.id)
        made_alike = (version, protocol.rounds_for(run), protocol.key(run))
        if old is not None and not old.error and (old.cost_model, old.rounds, old.protocol) == made_alike:
            out[run.id] = old
        else:
            todo.append(run)
    todo.sort(key=lambda r: -(r.osl or 0) * (r.concurrency or 0))
    if workers <= 1:
        results: Iterable[Replay] = (replay(r, protocol, run_command) for r in todo)
        for res in results:
            out[res.id] = res
            if on_result:
                on_result(res)
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(replay, r, protocol, run_command) for r in todo]
        for fut in as_completed(futures):
            res = fut.result()
            out[res.id] = res
            if on_result:
                on_result(res)
    return out
