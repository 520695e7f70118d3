"""The whole `cbbench sim validate` job: pick the rows, replay them (perf/sim/validate.py), check each row's
feasibility, put the peers' predictions beside, print the medians and write the tables."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from cbbench.perf.sim.consistency import feasibility
from cbbench.perf.sim.measured import MeasuredRun, Protocol, load_measured_runs
from cbbench.perf.sim.peers import load_peer_predictions
from cbbench.perf.sim.relative_errors import Prediction, RowErrors, row_errors
from cbbench.perf.sim.report import render_markdown, render_summary
from cbbench.perf.sim.validate import Replay, RunCommand, read_replays, replay_all, write_replays
from refengine.sim.cost_model import COST_MODEL_VERSION
from refengine.sim.sim_models import sim_model

_WHERE_KEYS = {"model", "gpu", "tp", "dtype", "isl", "osl", "concurrency", "workload", "id"}


def select(runs: Sequence[MeasuredRun], where: str | None, limit: int | None) -> list[MeasuredRun]:
    """The replayable runs matching every key=value of `where`; ValueError naming a bad key."""
    wanted: dict[str, str] = {}
    for part in (where or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _WHERE_KEYS:
            raise ValueError(f"--where: {part.strip()!r}; expected key=value with key one of {sorted(_WHERE_KEYS)}")
        wanted[key] = value.strip()
    out = []
    for r in runs:
        cells = {
            "model": r.model,
            "gpu": r.gpu,
            "tp": str(r.tensor_parallel_size),
            "dtype": r.dtype,
            "isl": str(r.isl),
            "osl": str(r.osl),
            "concurrency": str(r.concurrency),
            "workload": r.workload,
            "id": r.id,
        }
        if all(cells[k] == v for k, v in wanted.items()):
            out.append(r)
    if not out:
        raise ValueError(f"--where {where!r} matches no measured run")
    return out[:limit] if limit else out


def peer_predictions() -> dict[str, dict[str, Prediction]]:
    """simulator -> row id -> its prediction, from perf/sim/data/peer_predictions.csv (ci/peer_sims.sh); only the
    rows a peer predicted (status ok)."""

    out: dict[str, dict[str, Prediction]] = {}
    for (rid, sim), p in load_peer_predictions().items():
        if p.status == "ok" and p.ttft_ms is not None and p.tpot_ms is not None:
            tput = p.output_throughput if p.output_throughput is not None else math.nan
            out.setdefault(sim, {})[rid] = Prediction(p.ttft_ms, p.tpot_ms, tput)
    return out


def build_rows(runs: Sequence[MeasuredRun], replays: dict[str, Replay]) -> tuple[list[RowErrors], list[str]]:

    peers = peer_predictions()
    rows = []
    for run in runs:
        rep = replays[run.id]
        if rep.error:
            continue
        shape = sim_model(run.model)[1]
        mine = {name: by_id[run.id] for name, by_id in peers.items() if run.id in by_id}
        rows.append(row_errors(run, rep, mine, feasibility(run, shape)))
    return rows, sorted(peers)


def run_validation(
    *,
    where: str | None,
    limit: int | None,
    rounds: int,
    long_rounds: int,
    workers: int,
    output: Path,
    resume: bool,
    markdown: Path | None,
    console: Console,
    run_command: RunCommand,
    prompts: str = "recipe",
    server: str = "generator",
) -> list[RowErrors]:
    """`run_command` runs each row's `cbbench perf` command line (validate.py: `RunCommand`)."""

    protocol = Protocol(rounds=rounds, long_rounds=long_rounds, prompts=prompts, server=server)
    chosen = select(load_measured_runs(), where, limit)
    runs = [r for r in chosen if r.replayable]
    skipped = [r for r in chosen if not r.replayable]
    done = read_replays(output) if resume else {}
    if output.exists() and not resume:
        raise ValueError(f"--output {output} exists; add --resume to reuse its rows, or name a new file")
    kept = dict(done)
    finished: list[str] = []

    def on_result(r: Replay) -> None:
        kept[r.id] = r
        finished.append(r.id)
        write_replays(output, kept.values())
        status = r.error or f"TTFT {r.ttft_ms:.0f} ms, TPOT {r.tpot_ms:.2f} ms in {r.wall_s:.0f} s"
        console.print(f"[{len(finished)}/{len(runs)}] {r.id}: {status}", markup=False, highlight=False)

    replays = replay_all(runs, protocol, run_command, workers=workers, done=done, on_result=on_result)
    write_replays(output, {**kept, **replays}.values())
    failed = [r for r in replays.values() if r.error]
    rows, peers = build_rows(runs, replays)
    console.print(render_summary(rows, peers), markup=False, highlight=False)
    for r in failed:
        console.print(f"failed: {r.id}: {r.error}", markup=False, highlight=False)
    reasons: dict[str, int] = {}
    for run in skipped:
        reasons[run.not_replayable] = reasons.get(run.not_replayable, 0) + 1
    for why, n in sorted(reasons.items()):
        console.print(f"not replayed: {n} row(s): {why}", markup=False, highlight=False)
    if markdown is not None:
        markdown.write_text(render_markdown(rows, protocol, peers, COST_MODEL_VERSION, skipped))
        console.print(f"wrote {markdown}", markup=False, highlight=False)
    console.print(f"wrote {output}", markup=False, highlight=False)
    return rows
