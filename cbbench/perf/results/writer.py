"""Result files written as the runs finish: Ctrl-C, a crash or SIGKILL keeps every finished run, and the CSV never
holds a row whose records are not on disk.

Three things per results pair: the CSV (one row per run), the record folder (record_files.py: each run's requests and
steps in Parquet files of its own) and the summary JSON (run_json.py: environment, configuration, workload). When a
run finishes, `ResultWriter.add` writes its record files, then appends its row to the CSV: nothing already written is
read or written again, so a grid of any size costs each run its own bytes once, and the writer keeps only the rows
(no record) in memory. The summary JSON is written when the writer opens and again when it is done (`finish`: the
simulated speed, the rows in plan order for a parallel grid).

`--resume` opens an existing pair: the rows already there are kept (a last line cut short by a kill is dropped, and
its run is run again), record files of runs with no CSV row are removed, and `done(plan_id)` tells which runs to
skip (each row carries the id of the plan entry it came from in its `run_options`). A pair written by an older
cbbench, whose JSON holds every record, has its records moved into the folder first.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from cbbench.perf.json_values import JSONObject, JSONValue, as_list, as_object
from cbbench.perf.records import RequestRecord, StepRecord, as_request_record, as_step_record
from cbbench.perf.results.cells import restore
from cbbench.perf.results.columns import COLUMNS
from cbbench.perf.results.files import (
    append_rows,
    checked_lines,
    jsonable,
    read_csv,
    remove_stale_temporaries,
    write_csv,
)
from cbbench.perf.results.record_files import RecordFiles, SeriesPoint, plan_id_of, records_dir, runs_in_row_order
from cbbench.perf.results.run_json import is_summary, load_json, write_summary
from cbbench.perf.results.schema import NamedWorkload, workload_params_key


def plan_id(engine: str, batching: str, knobs: Mapping[str, object], load: str, repeat: int) -> str:
    """What names one run of a plan before it runs (its CSV key is known only after: the engine resolves knobs)."""
    return json.dumps([engine, batching, {k: knobs[k] for k in sorted(knobs)}, load, repeat], default=str)


class ResultWriter:
    """The CSV, record folder and summary JSON of one `cbbench perf` invocation."""

    def __init__(
        self,
        csv_path: str | Path,
        *,
        config: Mapping[str, object],
        environment: Mapping[str, object],
        workload: NamedWorkload | JSONValue,
        resume: bool = False,
    ) -> None:
        self.csv_path = Path(csv_path)
        self.json_path = self.csv_path.with_suffix(".json")
        self.files = RecordFiles(records_dir(self.csv_path))
        self.config, self.environment, self.workload = dict(config), dict(environment), workload
        # the rows in the CSV's order: each new one as `make_row` made it; a resumed file's as written (text cells)
        self.rows: list[Mapping[str, object]] = []
        self.labels: dict[str, str] = {}  # plan_id -> its run's record label
        self._done: set[str] = set()
        for p in (self.csv_path, self.json_path):  # a run killed mid-write (SIGKILL) left its temporary behind
            remove_stale_temporaries(p)
        self.files.remove_temporaries()
        if resume and self.csv_path.exists():
            self._load_existing()
        elif self.csv_path.exists():
            raise ValueError(f"output: {self.csv_path} exists; add --resume to complete it, or name a new file")
        else:
            self.files.clear()  # a folder left without its CSV belongs to no result any more
            write_csv(self.csv_path, [])
        self._write_summary()

    def _load_existing(self) -> None:
        _drop_cut_last_line(self.csv_path)
        read_csv(self.csv_path, allow_empty=True)  # schema, whole rows, numbers
        wl = self.workload
        name, params = (wl.name, wl.params) if isinstance(wl, NamedWorkload) else (None, {})
        mine = workload_params_key(json.dumps(jsonable(params or {})))
        # the cells as written (an older schema's upgraded), so a resumed file keeps them byte for byte
        header, *body = checked_lines(self.csv_path)[1]
        raw = [dict(zip(header, cells)) for cells in body]
        for row in raw:
            if workload_params_key(row.get("workload_params")) != mine or row.get("workload") != name:
                raise ValueError(
                    f"resume: {self.csv_path} holds runs of another workload ({row.get('workload')} "
                    f"{row.get('workload_params')}); resume with the options it was made with"
                )
            self.rows.append({k: restore(v) for k, v in row.items()})  # write_csv marks them again
            if pid := plan_id_of(row):
                self._done.add(pid)
        with self.csv_path.open(newline="") as f:
            on_disk = next(csv.reader(f), [])
        if tuple(on_disk) != COLUMNS:
            write_csv(self.csv_path, self.rows)  # an older schema's file: appending needs this one's header
        if self.json_path.exists() and not is_summary(doc := load_json(self.json_path)):
            self._move_embedded_records(doc)
        self.files.keep_only(self._done)
        self.labels = {r.plan_id: r.label for r in self.files.runs() if r.plan_id is not None}

    def _move_embedded_records(self, doc: JSONValue) -> None:
        """An older pair's JSON holds every run's records, in row order: write them as record files once."""
        doc = as_object(doc)
        records, steps = as_object(doc.get("records") or {}), as_object(doc.get("steps") or {})
        series = as_object(doc.get("server_metrics") or {})
        self.files.clear()
        for row, label in zip(self.rows, records):
            self.files.write_run(
                label,
                plan_id_of(row),
                [as_request_record(r) for r in _objects(records[label], label)],
                [as_step_record(s) for s in _objects(steps.get(label), label)],
                series_points(series.get(label)),
            )

    def done(self, pid: str) -> bool:
        return pid in self._done

    @property
    def num_done(self) -> int:
        return len(self._done)

    def row_labels(self) -> list[str]:
        """The record label of each row, in row order (rows whose records are missing are left out)."""
        return [r.label for r in runs_in_row_order(self.files.runs(), self.rows)]

    def add(
        self,
        row: Mapping[str, object],
        label: str,
        records: Sequence[RequestRecord],
        steps: Sequence[StepRecord],
        server_series: Sequence[SeriesPoint] | None = None,
    ) -> None:
        """One finished run: its record files, then its CSV row (appended), so an interrupt between the two leaves
        records with no row (removed by --resume, which runs it again), never a row without its records."""
        pid = plan_id_of(row)
        self.files.write_run(label, pid, records, steps, server_series)
        append_rows(self.csv_path, [row])
        self.rows.append(dict(row))
        if pid:
            self._done.add(pid)
            self.labels[pid] = label

    def finish(self, rows_in_order: Sequence[Mapping[str, object]] | None = None) -> None:
        """The run is over (or interrupted): the summary JSON again (the config may have grown: `sim_speed`), and the
        CSV rewritten once when `rows_in_order` puts its rows in another order."""
        if rows_in_order is not None:
            self.rows = [dict(r) for r in rows_in_order]
            write_csv(self.csv_path, self.rows)
        self._write_summary()

    def _write_summary(self) -> None:
        write_summary(self.json_path, config=self.config, environment=self.environment, workload=self.workload)


def _objects(v: JSONValue, label: str) -> list[JSONObject]:
    """The entries of a run's JSON list of records or steps (none for null): ValueError for one that is not an
    object."""
    out = []
    for x in as_list(v):
        if not isinstance(x, dict):
            raise ValueError(f"resume: a record of run {label!r} is not an object")
        out.append(x)
    return out


def series_points(v: JSONValue) -> list[SeriesPoint] | None:
    """A run's /metrics series as a JSON document holds it: its points (objects), or None when it has none."""
    return [p for p in v if isinstance(p, dict)] if isinstance(v, list) else None


def _drop_cut_last_line(path: Path) -> None:
    """A kill during an append can leave the CSV's last line cut short: drop it (its run has no row yet)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])
