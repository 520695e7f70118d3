"""Result files written as the runs finish: Ctrl-C or a crash keeps every finished run, and the CSV never holds a
row that its JSON lacks.

After each run, `ResultWriter.add` rewrites the JSON (records, steps, rows) and then the CSV, each atomically (a
temporary file renamed over the old one), so at any moment both files are whole and agree. Each run's records are
encoded once (perf/results/json_text.py), so the rewrites stay linear in the sweep's size. `--resume` opens an
existing pair: the rows and records already there are kept, and `done(plan_id)` tells which runs to skip (each row
carries the id of the plan entry it came from in its `run_options`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cbbench.perf.records import RequestRecord, StepRecord
from cbbench.perf.results.cells import restore
from cbbench.perf.results.files import (
    atomic_write_text,
    checked_lines,
    jsonable,
    read_csv,
    remove_stale_temporaries,
    write_csv,
)
from cbbench.perf.results.json_text import encode, run_json_text
from cbbench.perf.results.schema import workload_params_key


def plan_id(engine: str, batching: str, knobs: Mapping[str, Any], load: str, repeat: int) -> str:
    """What names one run of a plan before it runs (its CSV key is known only after: the engine resolves knobs)."""
    return json.dumps([engine, batching, {k: knobs[k] for k in sorted(knobs)}, load, repeat], default=str)


class ResultWriter:
    """The CSV + JSON pair of one `cbbench perf` invocation."""

    def __init__(
        self,
        csv_path: str | Path,
        *,
        config: Mapping[str, Any],
        environment: Mapping[str, Any],
        workload: Any,
        resume: bool = False,
    ) -> None:
        self.csv_path = Path(csv_path)
        self.json_path = self.csv_path.with_suffix(".json")
        self.config, self.environment, self.workload = dict(config), dict(environment), workload
        self.rows: list[dict[str, Any]] = []
        self.records: dict[str, str] = {}  # run label -> its records, as JSON text (encoded once)
        self.steps: dict[str, str] = {}
        self.server_metrics: dict[str, Any] = {}  # HTTP runs: the /metrics series of each (ServerMetrics.series)
        self._done: set[str] = set()
        for p in (self.csv_path, self.json_path):  # a run killed mid-write (SIGKILL) left its temporary behind
            remove_stale_temporaries(p)
        if resume:
            self._load_existing()
        elif self.csv_path.exists():
            raise ValueError(f"output: {self.csv_path} exists; add --resume to complete it, or name a new file")

    def _load_existing(self) -> None:
        if not self.csv_path.exists():
            return  # nothing to resume: start the file
        read_csv(self.csv_path, allow_empty=True)  # schema, whole rows, numbers
        mine = workload_params_key(json.dumps(jsonable(getattr(self.workload, "params", {}) or {})))
        # the cells as written (an older schema's upgraded), so a resumed file keeps them byte for byte
        header, *body = checked_lines(self.csv_path)[1]
        raw = [dict(zip(header, cells)) for cells in body]
        for row in raw:
            if workload_params_key(row.get("workload_params")) != mine or row.get("workload") != self.workload.name:
                raise ValueError(
                    f"resume: {self.csv_path} holds runs of another workload ({row.get('workload')} "
                    f"{row.get('workload_params')}); resume with the options it was made with"
                )
            self.rows.append({k: restore(v) for k, v in row.items()})  # write_csv marks them again
            opts = json.loads(row["run_options"]) if row.get("run_options") else {}
            if opts.get("plan_id"):
                self._done.add(opts["plan_id"])
        if self.json_path.exists():
            doc = json.loads(self.json_path.read_text())
            self.records = {k: encode(v) for k, v in (doc.get("records") or {}).items()}
            self.steps = {k: encode(v) for k, v in (doc.get("steps") or {}).items()}
            self.server_metrics = dict(doc.get("server_metrics") or {})

    def done(self, pid: str) -> bool:
        return pid in self._done

    @property
    def num_done(self) -> int:
        return len(self._done)

    def add(
        self,
        row: Mapping[str, Any],
        label: str,
        records: Sequence[RequestRecord],
        steps: Sequence[StepRecord],
        server_series: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """One finished run: JSON first, then CSV, so an interrupt between the two leaves a JSON with one run more
        than the CSV (harmless: --resume reruns it), never a CSV row without its records."""
        self.rows.append(dict(row))
        self.records[label] = encode([r.to_dict() for r in records])
        self.steps[label] = encode([s.to_dict() for s in steps])
        if server_series:
            self.server_metrics[label] = [dict(p) for p in server_series]
        opts = json.loads(row["run_options"]) if row.get("run_options") else {}
        if opts.get("plan_id"):
            self._done.add(opts["plan_id"])
        self.flush()

    def flush(self) -> None:
        text = run_json_text(
            config=self.config,
            environment=self.environment,
            workload=self.workload,
            rows=self.rows,
            records=self.records,
            steps=self.steps,
            server_metrics=self.server_metrics or None,
        )
        atomic_write_text(self.json_path, text)
        write_csv(self.csv_path, self.rows)
