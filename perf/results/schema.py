"""Result files: the CSV schema (one row per run), repeat aggregation, and the per-run JSON.

The CSV's columns are `COLUMNS`, in that order, always (a missing value is an empty cell); `schema_version` is its
first column and changes whenever a column is added, removed or renamed, so `compare` never matches columns by
accident. Metric keys that are not columns (an extra `--metric-percentiles` value) go, as JSON, into `extra`.
A configuration is identified by `CONFIG_KEY_COLUMNS` plus the workload's params (so fixed 1024/256 and fixed
128/32 never pass for repeats of each other), less the params that name a machine's paths or only count work
(`_PARAMS_NOT_IN_KEY`; a dataset file is named by its basename): rows that agree on all of it are repeats of one run
(`repeat` = 0, 1, ...), and a baseline made on one machine matches a run made on another.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from glob import escape as glob_escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbbench.perf.metrics import stat_keys
from cbbench.perf.results.cells import neutralise, restore
from cbbench.perf.results.environment import environment_info, git_revision

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 2

CONFIG_KEY_COLUMNS = (
    "engine",
    "model",
    "device",
    "dtype",
    "workload",
    "num_prompts",
    "seed",
    "request_rate",
    "burstiness",
    "batching",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "enable_prefix_caching",
    "preemption_mode",
    "policy",
    "priority_preemption",
    "attention_backend",
)
THROUGHPUT_COLUMNS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
# Every run stores this dense set of latency percentiles whatever `--metric-percentiles` asks to show, so a gate can
# check any of them (other percentiles go into `extra`, and `compare` reads them from there too).
STORED_PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9)
LATENCY_COLUMNS = tuple(k for m in ("ttft", "tpot", "itl", "e2el", "queue") for k in stat_keys(m, STORED_PERCENTILES))
ENGINE_COLUMNS = (
    "num_preemptions",
    "recomputed_tokens",
    "peak_kv_blocks",
    "peak_kv_usage",
    "prefix_cache_hit_rate",
    "mean_slot_utilisation",
    "mean_token_budget_utilisation",
    "slot_waste",
    "num_steps",
)
METRIC_COLUMNS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    *THROUGHPUT_COLUMNS,
    *LATENCY_COLUMNS,
    *ENGINE_COLUMNS,
)
# label: a name for the run (`--label`), not part of the configuration; command: the `cbbench perf` command line
# (options given explicitly); run_options: JSON of what shaped the run without defining its configuration
# (warm-up, threads, and the plan entry that `--resume` matches on).
COLUMNS = (
    "schema_version",
    "label",
    *CONFIG_KEY_COLUMNS,
    "repeat",
    "workload_params",
    *METRIC_COLUMNS,
    "git_sha",
    "timestamp",
    "command",
    "run_options",
    "extra",
)


def make_row(
    *,
    metrics: Mapping[str, Any],
    engine: str,
    workload: Any,
    batching: str,
    config: Mapping[str, Any],
    repeat: int = 0,
    model: str,
    device: str,
    git_sha: str | None = None,
    timestamp: str | None = None,
    label: str = "",
    command: str = "",
    run_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One CSV row. `workload` is a `cbbench.workloads.Workload` (its name and params are saved) or a name;
    `config` holds the engine knobs (any CONFIG_KEY_COLUMNS key; others go into `extra`)."""
    name = getattr(workload, "name", workload)
    wparams = dict(getattr(workload, "params", {}) or {})
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(
        schema_version=SCHEMA_VERSION,
        engine=engine,
        model=model,
        device=device,
        workload=name,
        batching=batching,
        repeat=repeat,
        workload_params=json.dumps(_jsonable(wparams), sort_keys=True),
        git_sha=git_sha if git_sha is not None else git_revision(),
        timestamp=timestamp or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        label=label,
        command=command,
        run_options=json.dumps(_jsonable(dict(run_options)), sort_keys=True) if run_options else "",
    )
    for k in ("num_prompts", "seed", "request_rate", "burstiness"):
        row[k] = wparams.get(k)
    extra: dict[str, Any] = {}
    for source in (config, metrics):
        for k, v in source.items():
            if k in row and k not in ("schema_version", "extra", "label", "command", "run_options"):
                row[k] = v
            else:
                extra[k] = v
    row["extra"] = json.dumps(_jsonable(extra), sort_keys=True) if extra else ""
    return row


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a reader (or an interrupt)
    sees the old file or the new one, never half of one."""
    path = Path(path)
    if path.exists() and not path.is_file():  # the rename would replace a device (/dev/full) or fail on a folder
        raise ValueError(f"{path} exists and is not a regular file")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600; a result file is as readable as any other
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporaries `atomic_write_text` left beside `path` when it was killed (SIGKILL) mid-write; call
    it before writing `path` again. Returns what was removed."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob_escape(path.name)}.*.tmp")) if path.parent.is_dir() else []
    for tmp in stale:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return stale


def _file_mode(path: Path) -> int:
    if path.exists():
        return path.stat().st_mode & 0o777
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write `rows` (replacing the file, atomically) with the fixed header."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="raise")
    w.writeheader()
    for row in rows:
        w.writerow({k: neutralise(v) for k, v in row.items()})
    return atomic_write_text(path, buf.getvalue())


def append_rows(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Append rows, writing the header first for a new file; a file with another header raises ValueError."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return write_csv(path, rows)
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    if tuple(header) != COLUMNS:
        raise ValueError(f"{path}: its header is not schema version {SCHEMA_VERSION}'s; write a new file")
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        for row in rows:
            w.writerow({k: neutralise(v) for k, v in row.items()})
    return path


def read_csv(path: str | os.PathLike, *, allow_empty: bool = False) -> pd.DataFrame:
    """Read a results CSV, checking its schema version and columns, that every row is whole (a truncated file
    raises), that there is at least one row (unless `allow_empty`), and that metric cells are numbers."""
    import pandas as pd  # here, not at the top: `compare` and `show` read with rows.py and must start fast

    text = Path(path).read_text()
    try:
        lines = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:  # e.g. a cell over csv's field size limit (131072 characters)
        raise ValueError(f"{path}: not a readable CSV ({e})") from None
    if not lines or "schema_version" not in lines[0]:
        raise ValueError(f"{path}: not a cbbench results CSV (no schema_version column)")
    for i, cells in enumerate(lines[1:], start=2):
        if len(cells) != len(lines[0]):
            raise ValueError(
                f"{path}: line {i} has {len(cells)} of {len(lines[0])} cells: the file is truncated or damaged"
            )
    if len(lines) > 1 and not text.endswith("\n"):
        raise ValueError(f"{path}: the last line does not end: the file is truncated")
    df = pd.read_csv(io.StringIO(text), keep_default_na=True)
    versions = set(pd.to_numeric(df["schema_version"], errors="coerce").dropna().astype(int))
    if versions - {SCHEMA_VERSION}:
        raise ValueError(
            f"{path}: schema_version {sorted(versions)}, this cbbench reads {SCHEMA_VERSION} "
            "(rerun the baseline's configurations with `cbbench perf --like` to refresh it)"
        )
    if tuple(df.columns) != COLUMNS:
        raise ValueError(f"{path}: columns differ from schema version {SCHEMA_VERSION}")
    for c in df.columns:  # user strings were marked against spreadsheet formulas when written (cells.py)
        if not pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]):
            df[c] = df[c].map(restore)
    if df.empty and not allow_empty:
        raise ValueError(f"{path}: no result rows (a header only)")
    for m in METRIC_COLUMNS:
        bad = df[m].notna() & pd.to_numeric(df[m], errors="coerce").isna()
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise ValueError(f"{path}: metric {m} holds {df[m].iloc[i]!r} on row {i + 1}, not a number")
    return df


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
KEY_NAMES = (*CONFIG_KEY_COLUMNS, "workload_params")


def config_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """A hashable configuration key, one entry per `KEY_NAMES`; empty / NaN cells all read as ""."""
    return (*(_key_cell(row.get(c)) for c in CONFIG_KEY_COLUMNS), workload_params_key(row.get("workload_params")))


def workload_params_key(cell: Any) -> str:
    """The part of a `workload_params` cell (JSON) that identifies the sample, as canonical JSON."""
    if not isinstance(cell, str) or not cell:
        return ""
    params = {k: v for k, v in json.loads(cell).items() if k not in _PARAMS_NOT_IN_KEY}
    if isinstance(params.get("dataset"), str):
        params["dataset"] = os.path.basename(params["dataset"])
    return json.dumps(params, sort_keys=True)


def _key_cell(v: Any) -> str:
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
        row: dict[str, Any] = {c: g.iloc[0][c] for c in (*CONFIG_KEY_COLUMNS, "workload_params")}
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


def write_run_json(
    path: str | os.PathLike,
    *,
    config: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    records: Mapping[str, Sequence[Mapping[str, Any]]] | Sequence[Mapping[str, Any]],
    workload: Any = None,
    environment: Mapping[str, Any] | None = None,
    steps: Any = None,
    server_metrics: Mapping[str, Any] | None = None,
) -> Path:
    """The full record of a perf invocation: environment, config, workload, CSV rows, per-request records
    (a list, or a dict run-label -> list), and optionally the per-step traces and, for HTTP runs, the scraped
    /metrics series by run label (`server_metrics`, only when there is one). Non-finite floats become strings."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "environment": dict(environment) if environment is not None else environment_info(config.get("device")),
        "config": dict(config),
        "workload": workload.to_dict() if hasattr(workload, "to_dict") else workload,
        "rows": list(rows),
        "records": records,
        "steps": steps,
    }
    if server_metrics:
        doc["server_metrics"] = dict(server_metrics)
    return atomic_write_text(path, json.dumps(_jsonable(doc), indent=1, default=str))


def _jsonable(x: Any) -> Any:
    """Strict JSON: inf / nan as strings, tuples as lists, numpy scalars as Python numbers."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    np = sys.modules.get("numpy")  # a numpy value exists only once numpy is imported: no import just to check
    if np is not None and isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if np is not None and isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x
