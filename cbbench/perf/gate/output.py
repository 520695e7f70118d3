"""The gate's results pair: every run of both arms as ordinary result rows (CSV, summary JSON, record folder), so that
`show`, `compare`, `plot` and `report` read it as they read any `cbbench perf` output.

Each run of an arm wrote its own pair (in the gate's scratch folder, by the arm's own code, whatever its schema
version); they are read back with this tree's readers and written again as one pair: each row with its `arm`
(base / head), `repeat` = its run's index within the arm, its `label` naming the tree (`base main (1a2b3c4)`) and
its records relabelled `engine/batching/<arm> knobs/repeatN`, so that each arm is a configuration of its own in
`show` and `report`, and `process_cpu_s` (the run's whole process, in CPU seconds) in its `extra`. The `git_sha` column
is what the arm's own code recorded: the proof of which tree ran.

Nothing measured is lost, and nothing half-written: every path the gate writes (the CSV, its JSON, the record
folder, `--summary`) is checked and reserved before the first run (`Outputs.reserve`: each created exclusively, so
an output that exists, appears meanwhile or is another gate's is refused, and a default name is unique per
process); after every finished run the pair of the runs so far is made in a temporary folder beside the target and
moved over the reserved paths, the record folder first and the CSV, which names the runs, last. A failure or an
interrupt after that keeps the finished runs there (and says so); one before the first finished run releases the
reserved paths. Only the paths this gate created are ever removed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from cbbench.perf.gate.arms import Run
from cbbench.perf.records import as_request_record, as_step_record
from cbbench.perf.results.record_files import records_dir
from cbbench.perf.results.run_json import read_run
from cbbench.perf.results.writer import ResultWriter, series_points


def check_target(csv_path: Path) -> None:
    """ValueError before anything runs when the pair cannot be written where asked."""
    if csv_path.suffix != ".csv":
        raise ValueError(f"output: {csv_path} must name the CSV (the JSON and the record folder go beside it)")
    for p in (csv_path, csv_path.with_suffix(".json"), records_dir(csv_path)):
        if p.exists() or p.is_symlink():
            raise ValueError(f"output: {p} exists; name a new file")


def pair_paths(csv_path: Path) -> tuple[Path, Path, Path]:
    return csv_path, csv_path.with_suffix(".json"), records_dir(csv_path)


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


RESERVE_TRIES = 100  # default names tried when other gates take them meanwhile


class _Taken(Exception):
    """A reserved path was created by someone else between the look and the create."""


class Outputs:
    """The paths one gate writes, reserved before its first run (module docstring); `made`: what it created."""

    def __init__(self, csv_path: Path, summary: Path | None) -> None:
        self.csv, self.summary = csv_path, summary
        self.made: list[Path] = []
        self.runs_written = 0
        self.kept: list[Path] = []  # failed runs' stderr, kept beside the output

    @classmethod
    def reserve(cls, csv_path: Path | None, summary: Path | None, default_folder: Path) -> Outputs:
        """Create each output path exclusively (ValueError naming the path and option when one cannot be); with no
        `csv_path`, a new `default_folder/gate-TIME-PID.csv` (a number added until no such pair exists)."""
        for _ in range(RESERVE_TRIES if csv_path is None else 1):
            target = csv_path if csv_path is not None else _unique_default(default_folder)
            if csv_path is not None:
                check_target(target)  # (a default name is taken or not by the exclusive create alone)
            out = cls(target, summary)
            try:
                out._reserve_pair()
            except _Taken:
                out.release()
                if csv_path is not None:
                    raise ValueError(f"output: {target} exists; name a new file") from None
                continue  # another gate took the free name between the look and the create: the next one
            except BaseException:
                out.release()
                raise
            try:
                if summary is not None:
                    out._check_summary(summary)
            except BaseException:
                out.release()
                raise
            return out
        raise ValueError(f"output: no free name for a gate's results in {default_folder}")

    def _reserve_pair(self) -> None:
        csv_path, json_path, rec = pair_paths(self.csv)
        try:
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            for p in (csv_path, json_path):
                with open(p, "x"):
                    pass
                self.made.append(p)
            rec.mkdir()
            self.made.append(rec)
        except FileExistsError:
            raise _Taken() from None
        except OSError as e:
            where = e.filename or csv_path
            raise ValueError(f"output: cannot create {where} ({_why(e)})") from None

    @staticmethod
    def _check_summary(summary: Path) -> None:
        """--summary is appended to at the end: it must be a file that can be opened for appending now."""
        try:
            existed = summary.exists()
            with summary.open("a"):
                pass
        except OSError as e:
            raise ValueError(f"summary: cannot append to {summary} ({_why(e)})") from None
        if not existed:
            summary.unlink()  # (created when the verdict is ready, as before: a gate that fails early adds nothing)

    def write(self, runs: Sequence[Run], describe: Mapping[str, str], gate: Mapping[str, object], label: str) -> None:
        """The pair of `runs` (every run finished so far) over the reserved paths."""
        write_pair(self.csv, runs, describe, gate, label, replace=True)
        self.runs_written = len(runs)

    def keep_log(self, log: Path | None, arm: str, index: int) -> Path | None:
        """A copy of a failed run's stderr beside the output (`FILE.<arm>-run<N>.err`), which the message names."""
        if log is None or not log.is_file():
            return None
        stem = self.csv.with_suffix("")
        for k in range(100):
            dst = Path(f"{stem}.{arm}-run{index + 1}{'' if k == 0 else f'-{k}'}.err")
            try:
                with open(dst, "xb") as f:
                    f.write(log.read_bytes())
            except FileExistsError:
                continue
            except OSError:
                return None
            self.kept.append(dst)
            return dst
        return None

    def release(self) -> None:
        """Remove the reserved paths when no run was written to them (only the ones this gate created)."""
        if self.runs_written:
            return
        for p in reversed(self.made):
            with contextlib.suppress(OSError):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        self.made.clear()

    def kept_note(self) -> str:
        """What a failed or interrupted gate leaves: where its finished runs and failed runs' stderr are."""
        parts = []
        if self.runs_written:
            parts.append(f"the {self.runs_written} finished run(s) are in {self.csv}")
        parts += [f"stderr kept in {p}" for p in self.kept]
        return "; ".join(parts)


def _unique_default(folder: Path) -> Path:

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = folder / f"gate-{stamp}-{os.getpid()}"
    for k in range(1000):
        p = Path(f"{base}{'' if k == 0 else f'-{k}'}.csv")
        if not any(q.exists() or q.is_symlink() for q in pair_paths(p)):
            return p  # (reserved exclusively next: a gate that takes it meanwhile makes this one fail, not collide)
    raise ValueError(f"output: no free name for {base}.csv in {folder}")


def _relabel(label: str, arm: str, index: int) -> str:
    """`refengine/continuous/max_num_seqs=4/repeat0` of an arm's run -> `refengine/continuous/base max_num_seqs=4/
    repeat3`: the table of `show` keeps one entry per arm."""
    head, _, _ = label.rpartition("/repeat")
    engine, batching, knobs = ([*head.split("/", 2), "-", "-"])[:3]
    return f"{engine}/{batching}/{arm}{'' if knobs in ('', '-') else ' ' + knobs}/repeat{index}"


def _run_options(cell: object, arm: str, index: int, rev: str) -> str:
    opts = json.loads(cell) if isinstance(cell, str) and cell.strip() else {}
    pid = opts.get("plan_id")
    opts["plan_id"] = json.dumps([arm, index, pid])  # unique per run of the pair: rows and records pair on it
    opts["gate_rev"] = rev
    return json.dumps(opts, sort_keys=True)


def write_pair(
    csv_path: Path,
    runs: Sequence[Run],
    describe: Mapping[str, str],
    gate: Mapping[str, object],
    label: str = "",
    *,
    replace: bool = False,
) -> Path:
    """Write every run of `runs` (in the order they ran) as one results pair at `csv_path`; returns it. `replace`:
    over a pair this gate reserved or wrote before (else the target must not exist)."""
    if not replace:
        check_target(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=csv_path.parent, prefix=f".{csv_path.stem}.gate-"))
    moved: list[Path] = []
    try:
        _write(staging / csv_path.name, runs, describe, gate, label)
        old_records = records_dir(csv_path)
        if replace and (old_records.is_dir() and not old_records.is_symlink()):
            os.replace(old_records, staging / "old.records")  # (this gate's own: a folder cannot be replaced whole)
        for src, dst in (
            (records_dir(staging / csv_path.name), records_dir(csv_path)),
            ((staging / csv_path.name).with_suffix(".json"), csv_path.with_suffix(".json")),
            (staging / csv_path.name, csv_path),
        ):
            os.replace(src, dst)
            moved.append(dst)
    except BaseException:
        if not replace:
            with contextlib.suppress(OSError):
                for p in moved:
                    if p != csv_path:  # moved before the failure: not a pair without its CSV
                        shutil.rmtree(p) if p.is_dir() else p.unlink()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return csv_path


def _write(
    target: Path, runs: Sequence[Run], describe: Mapping[str, str], gate: Mapping[str, object], label: str
) -> None:
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
            cell = out.get("extra")
            extra = json.loads(cell) if isinstance(cell, str) and cell else {}
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
                server_series=series_points(series.get(old)),
            )
    writer.finish()
