"""The gate's results pair: every run of both arms as ordinary result rows (CSV, summary JSON, record folder), so that
`show`, `compare`, `plot` and `report` read it as they read any `cbbench perf` output.

Each run of an arm wrote its own pair (in the gate's scratch folder, by the arm's own code, whatever its schema
version); they are read back with this tree's readers and written again as one pair: each row with its `arm`
(base / head), `repeat` = its run's index within the arm, its `label` naming the tree (`base main (1a2b3c4)`) and
its records relabelled `engine/batching/<arm> knobs/repeatN`, so that each arm is a configuration of its own in
`show` and `report`, and `process_cpu_s` (the run's whole process, in CPU seconds) in its `extra`. The `git_sha` column
is what the arm's own code recorded: the proof of which tree ran.

Nothing is half-written: the pair is made in a temporary folder beside the target and moved into place at the end,
the record folder first and the CSV, which names the runs, last; a failure before leaves nothing at the target.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cbbench.perf.gate.arms import Run
from cbbench.perf.records import as_request_record, as_step_record
from cbbench.perf.results.record_files import records_dir
from cbbench.perf.results.run_json import read_run
from cbbench.perf.results.writer import ResultWriter


def check_target(csv_path: Path) -> None:
    """ValueError before anything runs when the pair cannot be written where asked."""
    if csv_path.suffix != ".csv":
        raise ValueError(f"output: {csv_path} must name the CSV (the JSON and the record folder go beside it)")
    for p in (csv_path, csv_path.with_suffix(".json"), records_dir(csv_path)):
        if p.exists():
            raise ValueError(f"output: {p} exists; name a new file")


def _relabel(label: str, arm: str, index: int) -> str:
    """`refengine/continuous/max_num_seqs=4/repeat0` of an arm's run -> `refengine/continuous/base max_num_seqs=4/
    repeat3`: the table of `show` keeps one entry per arm."""
    head, _, _ = label.rpartition("/repeat")
    engine, batching, knobs = ([*head.split("/", 2), "-", "-"])[:3]
    return f"{engine}/{batching}/{arm}{'' if knobs in ('', '-') else ' ' + knobs}/repeat{index}"


def _run_options(cell: Any, arm: str, index: int, rev: str) -> str:
    opts = json.loads(cell) if isinstance(cell, str) and cell.strip() else {}
    pid = opts.get("plan_id")
    opts["plan_id"] = json.dumps([arm, index, pid])  # unique per run of the pair: rows and records pair on it
    opts["gate_rev"] = rev
    return json.dumps(opts, sort_keys=True)


def write_pair(
    csv_path: Path, runs: Sequence[Run], describe: Mapping[str, str], gate: Mapping[str, Any], label: str = ""
) -> Path:
    """Write every run of `runs` (in the order they ran) as one results pair at `csv_path`; returns it."""
    check_target(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=csv_path.parent, prefix=f".{csv_path.stem}.gate-"))
    try:
        _write(staging / csv_path.name, runs, describe, gate, label)
        for src, dst in (
            (records_dir(staging / csv_path.name), records_dir(csv_path)),
            ((staging / csv_path.name).with_suffix(".json"), csv_path.with_suffix(".json")),
            (staging / csv_path.name, csv_path),
        ):
            os.replace(src, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            for p in (records_dir(csv_path), csv_path.with_suffix(".json")):
                if p.exists() and not csv_path.exists():  # moved before the failure: not a pair without its CSV
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return csv_path


def _write(target: Path, runs: Sequence[Run], describe: Mapping[str, str], gate: Mapping[str, Any], label: str) -> None:
    docs = {(r.arm, r.index): read_run(r.csv.with_suffix(".json")) for r in runs}
    head = next((docs[(r.arm, r.index)] for r in runs if r.arm == "head"), docs[(runs[0].arm, runs[0].index)])
    config = {**dict(head.get("config") or {}), "gate": dict(gate)}
    writer = ResultWriter(
        target, config=config, environment=head.get("environment") or {}, workload=head.get("workload")
    )
    for r in runs:
        doc = docs[(r.arm, r.index)]
        records, steps = doc.get("records") or {}, doc.get("steps") or {}
        series = doc.get("server_metrics") or {}
        labels = list(records) if isinstance(records, dict) else []
        if len(labels) != len(r.rows):
            raise ValueError(f"gate: {r.csv.with_suffix('.json')} holds {len(labels)} runs for {len(r.rows)} rows")
        for row, old in zip(r.rows, labels):  # (rows as this tree reads them: an older schema's upgraded)
            new_label = _relabel(old, r.arm, r.index)
            out = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            extra = json.loads(out["extra"]) if isinstance(out.get("extra"), str) and out["extra"] else {}
            extra["process_cpu_s"] = out.pop("process_cpu_s", r.cpu_s)  # (a metric `compare` reads from extra)
            out.update(
                arm=r.arm,
                repeat=r.index,
                label=" ".join(x for x in (label, f"{r.arm} {describe[r.arm]}") if x),
                extra=json.dumps(extra, sort_keys=True),
                run_options=_run_options(row.get("run_options"), r.arm, r.index, describe[r.arm]),
            )
            writer.add(
                out,
                new_label,
                [as_request_record(x) for x in records.get(old) or []],
                [as_step_record(x) for x in steps.get(old) or []],
                server_series=series.get(old),
            )
    writer.finish()
