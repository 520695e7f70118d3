"""Per-request and per-step records as columnar files: one Parquet file per run and table, written once, when the
run finishes, beside the CSV (`RUN.records/requests/*.parquet`, `RUN.records/steps/*.parquet`).

A grid's records therefore cost each run its own records once on disk and nothing afterwards: no file is rewritten
as the grid goes on, and the process that writes them keeps none of them. The folders are Parquet datasets that
pandas (`pd.read_parquet("RUN.records/requests")`) and polars (`pl.read_parquet("RUN.records/requests/*.parquet")`)
read whole; every file has the same columns: the run's label (`run`), every field of perf/records.py's record
(None where the source did not observe it) and `layout`, the keys the record's JSON entry held, so that
`to_dicts` gives back exactly what the older JSON held. The run's label, its plan entry (`plan_id`) and, for HTTP
runs, the scraped /metrics series are in a small JSON of its own (`RUN.records/runs/run-N.json`).

Each file is written to a temporary beside it and renamed (a reader never sees half a file; a SIGKILL leaves a
`.NAME.*.tmp` that the next writer removes), steps, then requests, then the run's JSON: a run is in the files once
its JSON is. `--resume` keeps the runs whose plan entries are in the CSV and removes the others (a run killed between
its files and its CSV row is run again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cbbench.perf.json_values import JSONObject, JSONValue
from cbbench.perf.records import RequestRecord, StepRecord
from cbbench.perf.results.files import file_mode, jsonable

if TYPE_CHECKING:  # imported where used: `show` names its rows without pyarrow (pyarrow ships no types)
    import pyarrow as pa

# One scrape of a server's /metrics as a run keeps it (backends/server_metrics.py's SERIES_KEYS: seconds since the
# first scrape, KV usage, running, waiting, preemptions; None for what the server does not export), written as it is.
SeriesPoint = Mapping[str, object]

RECORDS_SUFFIX = ".records"
TABLES = ("requests", "steps")
RUNS = "runs"  # one small JSON per run ({"label", "plan_id", "server_series"}), written last: the run's commit mark
_FILE = re.compile(r"^run-(\d{6,})\.(parquet|json)$")
COMPRESSION = "zstd"  # per-step request-id lists repeat from step to step: zstd takes them to a few bytes each


def records_dir(path: str | os.PathLike[str]) -> Path:
    """The record folder of a results pair, from its CSV or JSON path."""
    return Path(path).with_suffix(RECORDS_SUFFIX)


def _field_types() -> dict[str, dict[str, pa.DataType]]:
    import pyarrow as pa

    def arrow(tp: object) -> pa.DataType:
        text = str(tp)
        if "list[float]" in text:
            return pa.list_(pa.float64())
        if "list[str]" in text:
            return pa.list_(pa.string())
        if text.startswith("bool"):
            return pa.bool_()
        if text.startswith("float"):
            return pa.float64()
        if text.startswith("int"):
            return pa.int64()
        return pa.string()

    return {
        name: {f.name: arrow(f.type) for f in dataclasses.fields(cls) if f.name != "layout"}
        for name, cls in (("requests", RequestRecord), ("steps", StepRecord))
    }


def _schema(table: str) -> pa.Schema:
    import pyarrow as pa

    fields = [pa.field("run", pa.string())]
    fields += [pa.field(k, t) for k, t in _field_types()[table].items()]
    return pa.schema([*fields, pa.field("layout", pa.string())])


def to_table(table: str, label: str, records: Sequence[RequestRecord] | Sequence[StepRecord]) -> pa.Table:
    """A run's records as an Arrow table with `table`'s fixed columns."""
    import pyarrow as pa

    schema = _schema(table)
    names = [f.name for f in schema if f.name not in ("run", "layout")]
    columns: dict[str, list[object]] = {k: [getattr(r, k) for r in records] for k in names}
    columns["run"] = [label] * len(records)
    columns["layout"] = [",".join(r.layout) for r in records]
    arrays = []
    for f in schema:
        try:
            arrays.append(pa.array(columns[f.name], type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise ValueError(f"{table} record field {f.name!r}: {e}") from None
    return pa.Table.from_arrays(arrays, schema=schema)


def to_dicts(table: pa.Table) -> dict[str, list[JSONObject]]:
    """Run label -> its records as the older run JSON held them (the keys of each record's layout, in order)."""
    out: dict[str, list[JSONObject]] = {}
    for row in table.to_pylist():
        keys = row["layout"].split(",") if row["layout"] else []
        out.setdefault(row["run"], []).append({k: row[k] for k in keys})
    return out


@dataclass(frozen=True)
class RunFiles:
    """One run in the record folder: its file number, label, plan entry and HTTP /metrics series."""

    number: int
    label: str
    plan_id: str | None
    server_series: list[JSONValue] | None  # its SeriesPoints, as the run file holds them


class RecordFiles:
    """The record folder of one results pair."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._next: int | None = None  # the next run's file number (listed once: a grid does not list per run)

    def path(self, table: str, number: int) -> Path:
        return self.root / table / f"run-{number:06d}.{'json' if table == RUNS else 'parquet'}"

    def _numbers(self, table: str) -> list[int]:
        folder = self.root / table
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _FILE.match(p.name)))

    def remove_temporaries(self) -> None:
        """What a writer killed mid-file left (`.run-*.tmp`)."""
        for table in (*TABLES, RUNS):
            folder = self.root / table
            if folder.is_dir():
                for p in folder.glob(".run-*.tmp"):
                    with contextlib.suppress(OSError):
                        p.unlink()

    def runs(self) -> list[RunFiles]:
        """Every whole run (its run file written, after its records), in the order they were written. Reads no
        Parquet (`cbbench show` names its rows from these without importing pyarrow or numpy)."""
        out = []
        for n in self._numbers(RUNS):
            path = self.path(RUNS, n)
            try:
                info = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, ValueError) as e:
                why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
                raise ValueError(f"{path}: not a readable run file ({why})") from None
            if not isinstance(info, dict):
                raise ValueError(f"{path}: not a run file (a JSON object with label and plan_id)")
            pid, series = info.get("plan_id"), info.get("server_series")
            out.append(
                RunFiles(
                    n,
                    str(info.get("label")),
                    pid if isinstance(pid, str) else None,
                    series if isinstance(series, list) else None,
                )
            )
        return out

    def write_run(
        self,
        label: str,
        plan_id: str | None,
        records: Sequence[RequestRecord],
        steps: Sequence[StepRecord],
        server_series: Sequence[SeriesPoint] | None = None,
    ) -> int:
        """Write one finished run (steps, then requests: the run counts once its requests file is there); returns
        its file number."""
        if self._next is None:
            self._next = max([0, *(n for t in (*TABLES, RUNS) for n in self._numbers(t))]) + 1
        number, self._next = self._next, self._next + 1
        info = {"label": label, "plan_id": plan_id, "server_series": [dict(p) for p in server_series or []] or None}

        self._write(self.path("steps", number), to_table("steps", label, steps))
        self._write(self.path("requests", number), to_table("requests", label, records))
        self._write(self.path(RUNS, number), json.dumps(jsonable(info), default=str))
        return number

    def _write(self, path: Path, content: str | pa.Table) -> None:
        """A Parquet table or a text, to a temporary beside `path`, renamed over it."""
        import pyarrow.parquet as pq

        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        os.close(fd)
        try:
            os.chmod(tmp, file_mode(path))  # mkstemp makes 0600; a result file is as readable as any other
            if isinstance(content, str):
                Path(tmp).write_text(content)
            else:
                pq.write_table(content, tmp, compression=COMPRESSION)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def remove(self, numbers: Iterable[int]) -> None:
        self._next = None
        for n in numbers:
            for table in (RUNS, *TABLES):  # the run's mark first: a kill between leaves no half run that counts
                with contextlib.suppress(FileNotFoundError):
                    self.path(table, n).unlink()

    def keep_only(self, plan_ids: set[str]) -> None:
        """Remove the runs whose plan entry is not in `plan_ids` (a run killed before its CSV row), and record files
        whose run never got its mark (killed mid-run)."""
        whole = self.runs()
        self.remove(r.number for r in whole if r.plan_id not in plan_ids)
        self.remove({n for t in TABLES for n in self._numbers(t)} - {r.number for r in whole})

    def clear(self) -> None:
        self.remove({n for t in (*TABLES, RUNS) for n in self._numbers(t)})

    def read(self, table: str, numbers: Iterable[int] | None = None) -> pa.Table:
        """The records of `table` (of the runs `numbers`, else all) as one Arrow table."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        wanted = self._numbers(table) if numbers is None else [n for n in numbers if self.path(table, n).exists()]
        parts = [pq.read_table(self.path(table, n), schema=_schema(table)) for n in wanted]
        return pa.concat_tables(parts) if parts else _schema(table).empty_table()

    def iter_runs(self, table: str, runs: Sequence[RunFiles]) -> Iterator[tuple[RunFiles, list[JSONObject]]]:
        """Each run's records of `table` as dicts, one run at a time (a report of a large grid holds one run's)."""
        for r in runs:
            yield r, to_dicts(self.read(table, [r.number])).get(r.label, [])


def plan_id_of(row: Mapping[str, object]) -> str | None:
    opts = row.get("run_options")
    try:
        parsed = json.loads(opts) if isinstance(opts, str) and opts else opts or {}
    except ValueError:
        return None
    pid = parsed.get("plan_id") if isinstance(parsed, Mapping) else None
    return pid if isinstance(pid, str) else None


def runs_in_row_order(runs: Sequence[RunFiles], rows: Sequence[Mapping[str, object]]) -> list[RunFiles]:
    """The runs paired with the CSV's rows (by plan entry), in row order; rows with no run are left out."""
    by_plan = {r.plan_id: r for r in runs if r.plan_id is not None}
    return [by_plan[pid] for row in rows if (pid := plan_id_of(row)) in by_plan]
