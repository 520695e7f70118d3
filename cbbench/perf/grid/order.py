"""Plan order for results that came in finishing order: a parallel grid writes each row the moment its run is over,
and once the runs are in, the CSV is rewritten with the rows in the order of the plan (the record files stay as they
are: readers pair them with the rows by plan entry), so that a pool's or Ray's files hold the same rows, in the same
order, as a serial run's.

A row's place is the index of the plan entry named by the `plan_id` in its `run_options`; rows that name no entry
of this plan (none do in a file this plan wrote) keep their relative order after the others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cbbench.perf.grid.build import RunPlan
    from cbbench.perf.results.writer import ResultWriter

# The CSV columns that differ between two runs of one plan whatever the executor: when the row was made, and the
# command line, which names --executor when it was given. Every other cell is the same, serial, pool or Ray (the
# JSON's config also holds `executor`, `output` and, for simulated runs, `sim_speed`: wall-clock, the host's).
RUN_SPECIFIC_COLUMNS = ("timestamp", "command")

Position = tuple[int, int]  # (0, index in the plan) or (1, index in the file): what the rows are sorted by


def plan_positions(plan: RunPlan) -> dict[str, int]:
    """plan_id -> the index of its spec in the plan."""
    return {spec.plan_id: i for i, spec in enumerate(plan.specs)}


def row_position(row: Mapping[str, object], positions: Mapping[str, int], fallback: int) -> Position:
    """Where `row` goes: its plan entry's index, or after every planned row at `fallback` (its index in the file)."""
    opts = row.get("run_options")
    try:
        parsed = json.loads(opts) if isinstance(opts, str) and opts else opts or {}
    except ValueError:
        parsed = None
    pid = parsed.get("plan_id") if isinstance(parsed, Mapping) else None
    return (0, positions[pid]) if isinstance(pid, str) and pid in positions else (1, fallback)


def put_in_plan_order(writer: ResultWriter, plan: RunPlan) -> bool:
    """Rewrite the CSV once with the writer's rows in plan order (the records need no move: `cbbench report` pairs
    them with the rows by plan entry); False (and nothing written) when they already are in order."""
    rows = writer.rows
    positions = plan_positions(plan)
    order = sorted(range(len(rows)), key=lambda k: row_position(rows[k], positions, k))
    if order == list(range(len(rows))):
        return False
    writer.finish([rows[k] for k in order])
    return True
