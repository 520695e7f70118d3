"""The run JSON beside a results CSV: a small summary (environment, configuration, workload) that points at the CSV
(one row per run) and at the record folder (record_files.py: every request and step, as Parquet), and its reading
back into one document, whichever cbbench wrote the file.

A JSON written before the records moved out holds `rows`, `records` and `steps` itself; `read_run` returns that
document as it is, and a summary's as the same shape (rows from the CSV, records and steps from the folder, each
run's paired with its row by plan entry), so `cbbench report`, `show` and the tests read both alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

from cbbench.perf.json_values import JSONObject, JSONValue
from cbbench.perf.results.columns import SCHEMA_VERSION
from cbbench.perf.results.files import atomic_write_text, jsonable, read_named, workload_dict
from cbbench.perf.results.record_files import RecordFiles, plan_id_of, records_dir, runs_in_row_order
from cbbench.perf.results.rows import read_rows

SUMMARY_KEY = "record_files"  # a summary's pointer; a JSON with embedded records has `records` instead


class RunDocument(TypedDict, total=False):
    """A run JSON as `read_run` gives it: the summary's fields, and `rows` (the CSV's, or an older JSON's own, as it
    wrote them: non-finite numbers as text), each run's request `records` and `steps` (their JSON entries, perf/
    records.py) by run label, in row order, and `server_metrics` (an HTTP run's /metrics series) when any. An older
    JSON is returned as it is, its shapes checked by its readers (report/html.py's `load_run`)."""

    schema_version: int
    environment: JSONObject
    config: JSONObject
    workload: JSONValue  # the workload's name, params and summary (`Workload.to_dict`)
    rows_file: str
    record_files: JSONObject
    rows: list[Mapping[str, object]]
    records: dict[str, list[JSONObject]]
    steps: dict[str, list[JSONObject]]
    server_metrics: dict[str, list[JSONValue]]


def write_summary(
    json_path: str | os.PathLike[str],
    *,
    config: Mapping[str, object],
    environment: Mapping[str, object],
    workload: object,
) -> Path:
    """The summary JSON of the pair whose CSV is `json_path` with `.csv` (written at the start and at the end of a
    run, never per run: its size does not grow with the grid)."""
    path = Path(json_path)
    folder = records_dir(path).name
    doc = {
        "schema_version": SCHEMA_VERSION,
        "environment": dict(environment),
        "config": dict(config),
        "workload": workload_dict(workload),
        "rows_file": path.with_suffix(".csv").name,
        SUMMARY_KEY: {
            "format": "parquet",
            "requests": f"{folder}/requests",
            "steps": f"{folder}/steps",
            "read_with": f'pandas.read_parquet("{folder}/requests"), polars.read_parquet("{folder}/requests/*.parquet")',
        },
    }
    return atomic_write_text(path, json.dumps(jsonable(doc), indent=1, default=str) + "\n")


def load_json(path: str | os.PathLike[str]) -> JSONValue:
    """The parsed JSON (ValueError naming the file when it is missing or not JSON)."""
    text = read_named(path)
    try:
        doc: JSONValue = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    return doc


def is_summary(doc: object) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get(SUMMARY_KEY), dict)


def pair_files(path: str | os.PathLike[str], doc: Mapping[str, JSONValue]) -> tuple[Path, Path]:
    """The CSV and the record folder of the summary JSON at `path`, checked to be there (ValueError naming the file and
    the field that points at it: a renamed pair, a missing or replaced record folder, a symlink loop)."""
    json_path = Path(path)
    name = doc.get("rows_file")
    if name is not None and (not isinstance(name, str) or not name or Path(name).name != name):
        raise ValueError(f"{json_path}: rows_file {name!r} is not a file name")
    csv_path = json_path.parent / (name or json_path.with_suffix(".csv").name)
    if not csv_path.is_file():
        renamed = " (was the pair renamed? rename the CSV, JSON and record folder back alike)"
        raise ValueError(
            f"{json_path}: rows_file names {csv_path.name}, which {_missing(csv_path)}" + renamed * (name is not None)
        )
    folder = records_dir(json_path)
    if not folder.is_dir():
        raise ValueError(f"{json_path}: {SUMMARY_KEY}: its record folder {folder} {_missing(folder)}")
    pointer = doc.get(SUMMARY_KEY)
    pointed = str((pointer if isinstance(pointer, dict) else {}).get("requests") or "").split("/")[0]
    if pointed and pointed != folder.name:
        raise ValueError(
            f"{json_path}: {SUMMARY_KEY}.requests names {pointed}/, but its record folder is {folder.name}/ "
            "(a renamed pair: rename it back, all three files alike)"
        )
    return csv_path, folder


def _missing(p: Path) -> str:
    """Why `p` is not there as what it should be, in a few words."""
    if p.is_symlink() and not p.exists():
        try:
            p.resolve(strict=True)
        except RuntimeError:
            return "is a symlink loop"
        except OSError as e:
            return "is a symlink loop" if e.errno == 40 else "is a dangling symlink"
        return "is a dangling symlink"
    if not p.exists():
        return "is missing"
    return "is a folder, not a file" if p.is_dir() else "is a file, not a folder"


def read_run(path: str | os.PathLike[str], *, records: bool = True) -> RunDocument:
    """The run document: environment, config, workload, `rows` (the CSV's), `records` and `steps` by run label in
    row order, `server_metrics` when any. With `records=False` the record and step lists are empty (the labels
    stay): `show` names its rows without reading a record."""
    doc = load_json(path)
    if not isinstance(doc, dict) or not is_summary(doc):
        return cast(RunDocument, doc)  # an older JSON holds its records itself (checked by its reader)

    csv_path, folder = pair_files(path, doc)
    rows = read_rows(csv_path, allow_empty=True)
    files = RecordFiles(folder)
    runs = runs_in_row_order(files.runs(), rows)
    if rows and not runs:  # (a run whose records alone are gone leaves the others to read; none is no pair)
        raise ValueError(
            f"{csv_path}: none of its {len(rows)} rows has a run in {folder} (row 1's run_options.plan_id is "
            f"{plan_id_of(rows[0])!r}): the CSV and the record folder are not one pair"
        )
    out = cast(RunDocument, doc)  # (the summary's fields, as write_summary wrote them)
    out["rows"] = list(rows)
    if records:
        out["records"] = {r.label: recs for r, recs in files.iter_runs("requests", runs)}
        out["steps"] = {r.label: steps for r, steps in files.iter_runs("steps", runs)}
    else:
        out["records"] = {r.label: [] for r in runs}
        out["steps"] = {r.label: [] for r in runs}
    series = {r.label: r.server_series for r in runs if r.server_series}
    if series:
        out["server_metrics"] = series
    return out
