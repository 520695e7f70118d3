"""The load generator's report on itself: how late it sent each request (its schedule delay), the request rate it
achieved, and whether it lagged (as inference-perf's load summary and AIPerf's pacer report their own lag).

- A request's schedule delay is `arrival_time - scheduled_time` on the client's own clock: when it was sent minus
  when a perfect client would have sent it (its arrival in the workload's schedule, or, under `--max-concurrency`,
  the moment a slot freed if that was later: the wait for a slot is the cap's by design, vLLM's "client queue
  time", not the client's lateness). An event loop busy parsing other streams, or a machine without a free core,
  shows here first.
- `achieved_request_rate` = (sent - 1) / (last send - first send): the rate the client kept, beside the workload's
  `request_rate` (what was asked; inf = every request at once, where the achieved rate only says how fast the
  client could send them, or what the cap let through).
- A run's client lagged when its median schedule delay is at least `CLIENT_LAG_MS`.

TTFT and every latency count from the send (vLLM's definition; its PR 54136 kept it so and reports the client's
queue time beside it): neither the wait for a slot nor the client's lateness is in TTFT. That lateness is what the
schedule delay reports, so a lagging client is flagged rather than hidden in TTFT.

Only clients have a schedule delay: an in-process run adds each request to the engine when it is due (between two
steps, as a server's input queue would), its `arrival_time` is the schedule's, and these figures are NaN there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import SupportsFloat, SupportsIndex

from cbbench.perf.records import RequestRecord

# inference-perf's threshold: a median schedule delay of 10 ms or more means the load generator could not keep to
# its schedule, and the latencies it measured carry its own lateness (its docs and the load summary it prints).
CLIENT_LAG_MS = 10.0
CLIENT_COLUMNS = ("median_schedule_delay_ms", "p99_schedule_delay_ms", "max_schedule_delay_ms", "achieved_request_rate")


def schedule_delays(records: Sequence[RequestRecord]) -> list[float]:
    """Each sent request's schedule delay in seconds (failed requests too: they were sent), in record order."""
    return [r.arrival_time - r.scheduled_time for r in records if r.scheduled_time is not None]


def client_metrics(records: Sequence[RequestRecord]) -> dict[str, float]:
    """CLIENT_COLUMNS of one run; NaN where no record has a `scheduled_time` (an in-process run, an older file)."""
    delays = schedule_delays(records)
    if not delays:
        return dict.fromkeys(CLIENT_COLUMNS, math.nan)
    import numpy as np

    ms = np.asarray(delays, dtype=np.float64) * 1000.0
    sends = sorted(r.arrival_time for r in records if r.scheduled_time is not None)
    span = sends[-1] - sends[0]
    return {
        "median_schedule_delay_ms": float(np.median(ms)),
        "p99_schedule_delay_ms": float(np.percentile(ms, 99)),
        "max_schedule_delay_ms": float(np.max(ms)),
        "achieved_request_rate": (len(sends) - 1) / span if span > 0 else math.nan,
    }


def _number(v: object) -> float:
    if not isinstance(v, (SupportsFloat, SupportsIndex, str, bytes)):
        return math.nan  # (what float() refuses with a TypeError: None, a list, ...)
    try:
        return float(v)
    except ValueError:
        return math.nan


def lagged(row: Mapping[str, object]) -> bool:
    """The run's client lagged: its median schedule delay reached CLIENT_LAG_MS."""
    return _number(row.get("median_schedule_delay_ms")) >= CLIENT_LAG_MS


def lag_line(name: str, rows: Sequence[Mapping[str, object]]) -> str | None:
    """The line under the table for one configuration whose client lagged in any repeat, else None."""
    late = [r for r in rows if lagged(r)]
    if not late:
        return None
    worst = max(_number(r.get("median_schedule_delay_ms")) for r in late)
    rates = [_number(r.get("achieved_request_rate")) for r in late]
    asked = _number(late[0].get("request_rate"))
    rate = ""
    if math.isfinite(asked) and all(math.isfinite(x) for x in rates):
        rate = f"; achieved {min(rates):.3g} req/s of {asked:g} requested"
    runs = "" if len(rows) == 1 else f" in {len(late)} of {len(rows)} runs"
    return (
        f"client lagged, {name}{runs}: median schedule delay {worst:.1f} ms >= {CLIENT_LAG_MS:g} ms "
        f"(inference-perf's threshold){rate}: requests were sent late, and its latencies carry the client's "
        "own delay (fewer streams per client process, or --client-workers)"
    )


def arms_lag_notes(
    names: Sequence[str], base: Sequence[Sequence[Mapping[str, object]]], head: Sequence[Sequence[Mapping[str, object]]]
) -> list[str]:
    """`cbbench gate`: per configuration whose arms' clients lagged in different numbers of runs, a note that a
    difference between the arms may be the client's. `base` / `head`: each arm's runs, each run its rows in plan
    order (verdict.decide's shape); rows without schedule delays (in-process runs) never lag."""
    notes = []
    for i, name in enumerate(names):
        nb = sum(lagged(run[i]) for run in base if i < len(run))
        nh = sum(lagged(run[i]) for run in head if i < len(run))
        if nb != nh:
            notes.append(
                f"{name}: the clients lagged differently (median schedule delay >= {CLIENT_LAG_MS:g} ms in "
                f"{nb} of {len(base)} base runs, {nh} of {len(head)} head runs): a latency difference between "
                "the arms may be the load generator's, not the server's"
            )
    return notes
