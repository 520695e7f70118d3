"""cbbench.perf: the `cbbench` command line and its Python API.

Run a benchmark as `cbbench perf` does (one object per concern of its options; the defaults are the CLI's):
    run_perf(PerfOptions(...), console) -> the result rows, also written as CSV + JSON + Parquet records
Read and judge results:
    read_rows(csv), aggregate_rows(rows)      a results CSV as typed rows; repeats reduced to their median
    compare(baseline_csv, new_csv)            per configuration and metric: change, direction, status
    compute_metrics(requests, duration)       throughput, TTFT / TPOT / ITL / E2EL statistics of one run
    RequestRecord, StepRecord, RecordFiles    one request's or one engine step's record, and a run's record folder

The commands themselves (`cbbench perf`, `compare`, `report`, `serve`, ...) are in cbbench.perf.cli; docs/perf.md
describes the runs, metrics and files, docs/gate.md the CI gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench._faces import hand_over_bare_name, lazy_exports

if __name__ != "cbbench.perf":  # reached as a bare `perf` through the repository's top-level link
    hand_over_bare_name(__name__, __path__[0])

if TYPE_CHECKING:  # the public names: lazy_exports reads them from here
    from cbbench.perf.metrics import compute_metrics as compute_metrics
    from cbbench.perf.plan.options import PerfOptions as PerfOptions
    from cbbench.perf.records import RequestRecord as RequestRecord
    from cbbench.perf.records import StepRecord as StepRecord
    from cbbench.perf.results.compare import compare as compare
    from cbbench.perf.results.record_files import RecordFiles as RecordFiles
    from cbbench.perf.results.rows import aggregate_rows as aggregate_rows
    from cbbench.perf.results.rows import read_rows as read_rows
    from cbbench.perf.sweep import run_perf as run_perf

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
