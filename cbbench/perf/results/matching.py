"""Which rows of two results files `compare` sets side by side, and the label of each configuration.

A row is matched on its key, less the columns `--ignore-key` leaves out, after the `--where` filters; a metric
that is infinite is refused.

An empty cell is unknown, not different: an HTTP run cannot know the server's batching mode, so it matches any.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from cbbench.perf.results.columns import KEY_NAMES
from cbbench.perf.results.rows import Row, aggregate_rows, number
from cbbench.perf.results.schema import config_key

# key columns whose value reads without its name in a config label
_BARE = {"engine", "model", "device", "dtype", "workload", "batching", "arm"}


def label(key: tuple[str, ...], keys: Sequence[tuple[str, ...]]) -> str:
    """engine, workload and batching, then only what tells this configuration from the others."""
    parts = []
    for i, name in enumerate(KEY_NAMES):
        if key[i] == "" or (name not in ("engine", "workload", "batching") and len({k[i] for k in keys}) == 1):
            continue
        if name == "workload_params":  # only the params that differ between configurations
            dicts = [json.loads(k[i]) if k[i] else {} for k in keys]
            mine = json.loads(key[i])
            parts += [f"{p}={v}" for p, v in mine.items() if len({json.dumps(d.get(p)) for d in dicts}) > 1]
        else:
            parts.append(key[i] if name in _BARE else f"{name}={key[i]}")
    return " ".join(parts)


# what identifies the load a run was measured under; `--ignore-key server` ignores every other key column
LOAD_KEY_NAMES = ("model", "workload", "num_prompts", "seed", "request_rate", "burstiness", "workload_params")
# (a gate's `arm` is neither: which tree ran the row, kept apart even when the server's columns are ignored)
SERVER_KEY_NAMES = tuple(k for k in KEY_NAMES if k not in (*LOAD_KEY_NAMES, "arm"))


def ignored_key_names(names: Sequence[str]) -> set[str]:
    """`["server"]` / `["engine,batching"]` -> the key columns to leave out of matching (ValueError if unknown)."""
    out: set[str] = set()
    for item in names:
        for name in (x.strip() for x in item.split(",") if x.strip()):
            if name == "server":
                out.update(SERVER_KEY_NAMES)
            elif name in KEY_NAMES:
                out.add(name)
            else:
                raise ValueError(f"ignore-key: {name!r} is not a key column (one of server, {', '.join(KEY_NAMES)})")
    return out


def keyed(rows: Sequence[Row], metrics: Sequence[str], ignored: set[str], side: str) -> dict[tuple[str, ...], Row]:
    """Each configuration's repeats aggregated (`rows.aggregate_rows`), by its key less the `ignored` columns
    (ValueError when ignoring them makes two configurations one)."""
    out: dict[tuple[str, ...], Row] = {}
    for r in aggregate_rows(rows, metrics):
        key = tuple("" if name in ignored else cell for name, cell in zip(KEY_NAMES, config_key(r)))
        if key in out:
            raise ValueError(
                f"ignore-key: two configurations of the {side} file become one "
                f"({r['engine']} {r['batching']}); pick one with --where (e.g. --where "
                f"batching={r['batching']}) or ignore fewer key columns"
            )
        out[key] = r
    return out


def samples_by_key(
    rows: Sequence[Row], metrics: Sequence[str], ignored: set[str]
) -> dict[tuple[str, ...], dict[str, list[float]]]:
    """Per configuration (keyed as `keyed` keys it), each metric's value in every repeat that has one."""
    out: dict[tuple[str, ...], dict[str, list[float]]] = {}
    for r in rows:
        key = tuple("" if name in ignored else cell for name, cell in zip(KEY_NAMES, config_key(r)))
        per = out.setdefault(key, {m: [] for m in metrics})
        for m in metrics:
            if not math.isnan(v := number(r.get(m))):
                per[m].append(v)
    return out


def parse_where(items: Sequence[str]) -> list[tuple[str, str]]:
    """`["batching=continuous"]` -> [("batching", "continuous")] (ValueError naming a bad item)."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in KEY_NAMES + ("label",):
            raise ValueError(
                f"where: {item!r} is not KEY=VALUE with KEY a key column or label ({', '.join(KEY_NAMES)}, label)"
            )
        out.append((name.strip(), value.strip()))
    return out


def filter_rows(rows: Sequence[Row], where: Sequence[str], side: str) -> list[Row]:
    """The rows whose cells (read as config keys read them: 512.0 is "512") match every `where` item. An
    empty cell is unknown, not different, and matches: an HTTP run cannot know the server's batching mode, so
    `--where batching=continuous` keeps it and picks the continuous run of the in-process file."""
    out = list(rows)
    for name, value in parse_where(where):
        out = [r for r in out if cell_text(r.get(name)) in (value, "")]
        if not out:
            raise ValueError(f"where: no row of the {side} file has {name}={value}")
    return out


def cell_text(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def check_finite(rows: Sequence[Row], metrics: Sequence[str], source: object) -> None:
    """ValueError naming the first row whose metric is +-inf: a gate on it would pass or fail by accident
    (an empty cell, NaN, is a missing metric and is judged as one)."""
    for m in metrics:
        for i, r in enumerate(rows):
            if abs(v := number(r.get(m))) == math.inf:
                raise ValueError(
                    f"{source}: metric {m} is {v} on row {i + 1} ({r['engine']} {r['batching']}): not a finite number"
                )
