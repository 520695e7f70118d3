"""Results CSVs as plain rows (a list of dicts), for the commands that only read results: `compare` and `show`.

pandas takes most of a second to import, longer than the whole of `cbbench compare` may take, so these commands read
with the csv module. The rows hold what `schema.read_csv`'s DataFrame holds (`to_dict("records")`): a column whose
cells are all numbers holds ints (floats when a cell is empty), "True" / "False" columns hold bools, an empty cell
is NaN, and text cells are `restore`d. The checks are read_csv's: schema version, header, whole rows, numeric metrics.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, Protocol, SupportsFloat, SupportsIndex, cast, runtime_checkable

from cbbench.perf.results.cells import restore
from cbbench.perf.results.columns import COLUMNS, CONFIG_KEY_COLUMNS, METRIC_COLUMNS, SCHEMA_VERSION, Cell, ResultRow
from cbbench.perf.results.files import checked_lines, column_difference
from cbbench.perf.results.schema import config_key

# A row whose keys are not fixed: one configuration's repeats aggregated (`aggregate_rows`: its key columns,
# `num_repeats`, each metric's median, min and max), or a results row with its `extra` metrics as keys of their own;
# its cells are read by name (`number`, `matching.cell_text`).
Row = dict[str, object]

# the cells pandas' read_csv reads as missing (its default na_values), so that both readers agree on every file
NA_CELLS = frozenset(
    "|#N/A|#N/A N/A|#NA|-1.#IND|-1.#QNAN|-NaN|-nan|1.#IND|1.#QNAN|<NA>|N/A|NA|NULL|NaN|None|n/a|nan|null".split("|")
)
_BOOLS = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False, "false": False}


def number(v: object) -> float:
    """A cell as a float, NaN when it is not a number (pandas' `to_numeric(errors="coerce")`)."""
    if isinstance(v, (int, float)):
        return float(v)
    if not isinstance(v, (SupportsFloat, SupportsIndex, str, bytes)):
        return math.nan  # (what float() refuses with a TypeError: None, a list, ...)
    try:
        return float(v)
    except ValueError:
        return math.nan


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _typed_column(cells: Sequence[str]) -> list[Cell]:
    """One column's cells typed as pandas types a column: all ints, else all numbers, else bools, else text."""
    present = [c for c in cells if c not in NA_CELLS]
    missing = len(present) < len(cells)
    if present and not missing and all(_is_int(c) for c in present):
        return [int(c) for c in cells]
    if present and all(_is_float(c) for c in present):
        return [math.nan if c in NA_CELLS else float(c) for c in cells]
    if present and all(c in _BOOLS for c in present):
        return [math.nan if c in NA_CELLS else _BOOLS[c] for c in cells]
    return [math.nan if c in NA_CELLS else restore(c) for c in cells]


def read_rows(path: str | os.PathLike[str], *, allow_empty: bool = False) -> list[ResultRow]:
    """The rows of a results CSV, checked as `schema.read_csv` checks them (ValueError naming the file)."""
    header, *body = checked_lines(path)[1]
    columns = {name: _typed_column([cells[i] for cells in body]) for i, name in enumerate(header)}
    versions = {int(v) for v in map(number, columns["schema_version"]) if not math.isnan(v)}
    if versions - {SCHEMA_VERSION}:
        raise ValueError(
            f"{path}: schema_version {sorted(versions)}, this cbbench reads {SCHEMA_VERSION} "
            "(rerun the baseline's configurations with `cbbench perf --like` to refresh it)"
        )
    if tuple(header) != COLUMNS:
        raise ValueError(f"{path}: {column_difference(header)}")
    if not body and not allow_empty:
        raise ValueError(f"{path}: no result rows (a header only)")
    for m in METRIC_COLUMNS:
        for i, v in enumerate(columns[m]):
            if isinstance(v, str):
                raise ValueError(f"{path}: metric {m} holds {v!r} on row {i + 1}, not a number")
    # (the header is this schema's and every metric a number: the cells are what ResultRow types)
    return [cast(ResultRow, {name: columns[name][i] for name in header}) for i in range(len(body))]


@runtime_checkable
class Records(Protocol):
    """A table that gives its rows as records: a DataFrame (`to_dict("records")`), read without importing pandas."""

    def to_dict(self, orient: Literal["records"]) -> list[Row]: ...


def as_rows(table: Records | Iterable[Mapping[str, object]]) -> list[Row]:
    """Rows from a DataFrame (`to_dict("records")`, no pandas import needed) or a sequence of mappings (copied)."""
    if isinstance(table, Records):
        return list(table.to_dict("records"))
    return [dict(r) for r in table]


def with_extra_metrics(rows: Sequence[Mapping[str, object]]) -> list[Row]:
    """The rows with the numeric entries of each one's `extra` JSON (an extra percentile, ...) as keys of their own,
    NaN in the rows that lack them, so that they can be gated like any other metric."""
    parsed = [json.loads(c) if isinstance(c, str) and c.strip() else {} for r in rows for c in [r.get("extra")]]
    known = set().union(*(r.keys() for r in rows)) if rows else set()
    names = sorted(
        {k for d in parsed for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} - known
    )
    out = []
    for r, d in zip(rows, parsed):
        out.append({**r, **{k: float(d[k]) if isinstance(d.get(k), (int, float)) else math.nan for k in names}})
    return out


def _median(values: Sequence[float]) -> float:
    xs = sorted(values)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return float(xs[mid]) if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def aggregate_rows(rows: Iterable[Mapping[str, object]], metrics: Sequence[str] = METRIC_COLUMNS) -> list[Row]:
    """One row per configuration, in first-seen order: its key columns, `num_repeats`, and per metric the median
    (`<metric>`) and spread (`<metric>_min`, `<metric>_max`) of its repeats, NaN cells left out (as
    `schema.aggregate_repeats`)."""
    groups: dict[tuple[str, ...], list[Mapping[str, object]]] = {}
    for r in rows:
        groups.setdefault(config_key(r), []).append(r)
    out = []
    for g in groups.values():
        row: Row = {c: g[0].get(c) for c in (*CONFIG_KEY_COLUMNS, "workload_params")}
        row["num_repeats"] = len(g)
        for m in metrics:
            raw = [r.get(m) for r in g]
            ints = [x for x in raw if isinstance(x, int) and not isinstance(x, bool)]
            # an integer column keeps int extremes, as pandas' min / max of it do
            v: Sequence[float] = ints if len(ints) == len(raw) else [x for x in map(number, raw) if not math.isnan(x)]
            row[m], row[f"{m}_min"], row[f"{m}_max"] = _median(v), min(v, default=math.nan), max(v, default=math.nan)
        out.append(row)
    return out
