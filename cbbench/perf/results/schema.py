"""Result rows: the CSV schema (one row per run), configuration keys and repeat aggregation.

The columns are columns.py's; reading and writing the files (CSV and the per-run JSON) is files.py's: import them
from there.

The CSV's columns are `COLUMNS`, in that order, always (a missing value is an empty cell); `schema_version` is its
first column and changes whenever a column is added, removed or renamed, so `compare` never matches columns by
accident. Metric keys that are not columns (an extra `--metric-percentiles` value) go, as JSON, into `extra`.
A configuration is identified by `CONFIG_KEY_COLUMNS` plus the workload's params (so fixed 1024/256 and fixed
128/32 never pass for repeats of each other), less the params that name a machine's paths or only count work
(`_PARAMS_NOT_IN_KEY`; a dataset file is named by its basename): rows that agree on all of it are repeats of one run
(`repeat` = 0, 1, ...), and a baseline made on one machine matches a run made on another.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from cbbench.perf.results.columns import COLUMNS, CONFIG_KEY_COLUMNS, METRIC_COLUMNS, SCHEMA_VERSION, ResultRow
from cbbench.perf.results.environment import git_revision
from cbbench.perf.results.files import jsonable

if TYPE_CHECKING:  # pandas is imported where it is used: `compare` and `show` read with rows.py and start fast
    import pandas as pd


@runtime_checkable
class NamedWorkload(Protocol):
    """What a row saves of a workload (a `workloads.Workload` is one): its name and its parameters."""

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> Mapping[str, object]: ...


def make_row(
    *,
    metrics: Mapping[str, object],
    engine: str,
    workload: NamedWorkload | str,
    batching: str,
    config: Mapping[str, object],
    repeat: int = 0,
    model: str,
    device: str,
    git_sha: str | None = None,
    timestamp: str | None = None,
    label: str = "",
    command: str = "",
    run_options: Mapping[str, object] | None = None,
) -> ResultRow:
    """One CSV row. `workload` is a `workloads.Workload` (its name and params are saved) or a name;
    `config` holds the engine knobs (any CONFIG_KEY_COLUMNS key; others go into `extra`)."""
    name, wparams = (workload, {}) if isinstance(workload, str) else (workload.name, dict(workload.params or {}))
    row: dict[str, object] = dict.fromkeys(COLUMNS)
    row.update(
        schema_version=SCHEMA_VERSION,
        engine=engine,
        model=model,
        device=device,
        workload=name,
        batching=batching,
        repeat=repeat,
        workload_params=json.dumps(jsonable(wparams), sort_keys=True),
        git_sha=git_sha if git_sha is not None else git_revision(),
        timestamp=timestamp or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        label=label,
        command=command,
        run_options=json.dumps(jsonable(dict(run_options)), sort_keys=True) if run_options else "",
    )
    for k in ("num_prompts", "seed", "request_rate", "burstiness"):
        row[k] = wparams.get(k)
    extra: dict[str, object] = {}
    for source in (config, metrics):
        for k, v in source.items():
            if k in row and k not in ("schema_version", "extra", "label", "command", "run_options"):
                row[k] = v
            else:
                extra[k] = v
    row["extra"] = json.dumps(jsonable(extra), sort_keys=True) if extra else ""
    return cast(ResultRow, row)  # every column, the descriptive ones as ResultRow types them


def extra_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with the numeric entries of each row's `extra` JSON (an extra percentile, ...) as columns of their own,
    so that they can be gated like any other metric."""
    df = df.copy()
    parsed = [json.loads(c) if isinstance(c, str) and c.strip() else {} for c in df["extra"]]
    names = sorted(
        {
            k
            for d in parsed
            for k, v in d.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in df.columns
        }
    )
    for k in names:
        df[k] = [float(d[k]) if isinstance(d.get(k), (int, float)) else math.nan for d in parsed]
    return df


_PARAMS_NOT_IN_KEY = {"dataset_path", "num_tokenized"}


def config_key(row: Mapping[str, object]) -> tuple[str, ...]:
    """A hashable configuration key, one entry per `KEY_NAMES`; empty / NaN cells all read as ""."""
    return (*(_key_cell(row.get(c)) for c in CONFIG_KEY_COLUMNS), workload_params_key(row.get("workload_params")))


def workload_params_key(cell: object) -> str:
    """The part of a `workload_params` cell (JSON) that identifies the sample, as canonical JSON."""
    if not isinstance(cell, str) or not cell:
        return ""
    params = {k: v for k, v in json.loads(cell).items() if k not in _PARAMS_NOT_IN_KEY}
    if isinstance(params.get("dataset"), str):
        params["dataset"] = os.path.basename(params["dataset"])
    return json.dumps(params, sort_keys=True)


def _key_cell(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def aggregate_repeats(df: pd.DataFrame, metrics: Sequence[str] = METRIC_COLUMNS) -> pd.DataFrame:
    """One row per configuration: `num_repeats`, and per metric its median (`<metric>`) and spread
    (`<metric>_min`, `<metric>_max`), so a gate can tell a change from run-to-run noise."""
    import pandas as pd

    df = df.copy()
    df["_key"] = [config_key(r) for r in df.to_dict("records")]
    out_rows = []
    for _, g in df.groupby("_key", sort=False):
        row: dict[str, object] = {c: g.iloc[0][c] for c in (*CONFIG_KEY_COLUMNS, "workload_params")}
        row["num_repeats"] = len(g)
        for m in metrics:
            v = pd.to_numeric(g[m], errors="coerce")
            row[m], row[f"{m}_min"], row[f"{m}_max"] = v.median(), v.min(), v.max()
        out_rows.append(row)
    cols = [
        *CONFIG_KEY_COLUMNS,
        "workload_params",
        "num_repeats",
        *(f"{m}{s}" for m in metrics for s in ("", "_min", "_max")),
    ]
    return pd.DataFrame(out_rows, columns=cols)
