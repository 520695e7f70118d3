"""The run JSON written piece by piece: each run's records and steps are encoded once, when the run finishes.

`ResultWriter` rewrites the whole JSON after every run (so an interrupt keeps every finished run). Re-encoding every
earlier run's per-step trace each time made a sweep quadratic: a simulated ShareGPT sweep holds about 200k step
records per unbatched run, and spent most of its time in json. Here a run's records are turned into JSON text once
(the C encoder, strict JSON), and each rewrite only joins the texts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cbbench.perf.results.columns import SCHEMA_VERSION
from cbbench.perf.results.files import jsonable


def encode(x: Any) -> str:
    """Strict, compact JSON of `x`, as `jsonable` makes it (inf / nan as strings, numpy scalars as numbers).

    The fast path is the C encoder on `x` as it is; only a value it refuses (a non-finite float, a numpy integer, a
    non-string key) sends the whole value through `jsonable`, which gives the same document."""
    try:
        return json.dumps(x, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return json.dumps(jsonable(x), separators=(",", ":"), default=str)


def encode_runs(runs: Mapping[str, str]) -> str:
    """{label: encoded JSON text} -> the JSON text of the object."""
    return "{" + ",\n".join(f"{json.dumps(label)}:{text}" for label, text in runs.items()) + "}"


def run_json_text(
    *,
    config: Mapping[str, Any],
    environment: Mapping[str, Any],
    workload: Any,
    rows: list[dict[str, Any]],
    records: Mapping[str, str],
    steps: Mapping[str, str],
    server_metrics: Mapping[str, Any] | None = None,
) -> str:
    """The document `schema.write_run_json` writes (same keys, same order, same values), from pre-encoded runs."""
    head = {
        "schema_version": SCHEMA_VERSION,
        "environment": dict(environment),
        "config": dict(config),
        "workload": workload.to_dict() if hasattr(workload, "to_dict") else workload,
        "rows": rows,
    }
    parts = [f"{json.dumps(k)}: {json.dumps(jsonable(v), indent=1, default=str)}" for k, v in head.items()]
    parts += [f'"records": {encode_runs(records)}', f'"steps": {encode_runs(steps)}']
    if server_metrics:  # HTTP runs only: the scraped /metrics series by run label (small)
        parts.append(f'"server_metrics": {json.dumps(jsonable(dict(server_metrics)), indent=1, default=str)}')
    return "{\n" + ",\n".join(parts) + "\n}"
