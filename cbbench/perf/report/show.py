"""The perf table from saved results: `cbbench show RESULTS.csv`, `perf --format`, and `perf --resume`'s table.

`saved_entries` turns the rows of a results CSV into the table's entries, named as the run named them: the run JSON
beside the CSV keeps one record label (`engine/batching/knobs/repeatN`) per row, in row order. Without the JSON a
row is named by its engine, batching and the key columns that differ between rows. `render` writes the table as
text (the terminal table), markdown or JSON (medians over repeats, the spread of output throughput).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

from cbbench.perf.json_values import JSONValue, as_object
from cbbench.perf.report.table import (
    Entry,
    TableRow,
    TableWorkload,
    print_perf_table,
    ratio_record,
    ratios,
    summarise,
    summary_lines,
    table_columns,
)
from cbbench.perf.results.columns import CONFIG_KEY_COLUMNS
from cbbench.perf.results.gate import _md as escaped
from cbbench.perf.results.rows import read_rows
from cbbench.perf.results.run_json import read_run

FORMATS = ("text", "markdown", "json")


class SavedWorkload:
    """What the table's title needs from a workload, read back from a run JSON's `workload` (or a CSV row)."""

    def __init__(self, doc: Mapping[str, JSONValue] | None, row: TableRow) -> None:
        doc = dict(doc or {})
        name = doc.get("name")
        self.name = name if isinstance(name, str) and name else str(row.get("workload") or "?")
        self.params: Mapping[str, object] = as_object(doc.get("params") or {})
        summary = doc.get("summary")
        self._summary = summary if isinstance(summary, dict) else None

    def summary(self) -> Mapping[str, object]:
        nan = math.nan
        return self._summary or {
            "num_requests": "?",
            "mean_prompt_len": nan,
            "max_prompt_len": "?",
            "mean_output_len": nan,
            "max_output_len": "?",
            "cv_output_len": nan,
        }


def labels_of_rows(rows: Sequence[TableRow], record_labels: Sequence[str]) -> list[tuple[str, str, str]]:
    """The table key of each row: from the run JSON's record labels when it holds one per row, else built."""
    if len(record_labels) >= len(rows):  # an interrupt may leave the JSON one run ahead: the extra one is last
        keys = []
        for label in record_labels[: len(rows)]:
            head, _, _ = label.rpartition("/repeat")
            engine, batching, knobs = (head.split("/", 2) + ["-", "-"])[:3]
            keys.append((engine, batching, knobs or "-"))
        return keys

    skip = {"engine", "batching", "model", "device", "dtype", "workload"}
    varying = [c for c in CONFIG_KEY_COLUMNS if c not in skip and len({str(r.get(c)) for r in rows}) > 1]
    return [
        (str(r.get("engine")), str(r.get("batching") or ""), " ".join(f"{c}={r.get(c)}" for c in varying) or "-")
        for r in rows
    ]


def saved_entries(csv_path: str | Path) -> tuple[list[Entry], SavedWorkload]:
    """The table entries of a results CSV (checked by `read_rows`) and its workload, from the JSON when present."""

    rows: list[TableRow] = [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in read_rows(csv_path)
    ]
    json_path = Path(csv_path).with_suffix(".json")
    doc: object = {}
    if json_path.is_file():
        try:
            doc = read_run(json_path, records=False)
        except ValueError:
            doc = {}  # a damaged JSON: the CSV still makes the table
    records = doc.get("records") if isinstance(doc, dict) else None
    keys = labels_of_rows(rows, list(records) if isinstance(records, dict) else [])
    workload = doc.get("workload") if isinstance(doc, dict) and isinstance(doc.get("workload"), dict) else None
    return [(k, r, None) for k, r in zip(keys, rows)], SavedWorkload(workload, rows[0])


def render(
    console: Console,
    entries: Sequence[Entry],
    workload: TableWorkload,
    fmt: str,
    goodput: Mapping[str, float] | None = None,
    *,
    steady_state: bool = False,
) -> None:
    """The table in `fmt`: text (fitted to the terminal), markdown or json; `steady_state`: with the steady-state
    window's figures (perf/steady_state.py)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "text":
        print_perf_table(console, entries, workload, goodput=goodput, steady_state=steady_state)
    elif fmt == "markdown":  # a terminal shows the text as it is; a file or a pipe gets markdown that renders it
        console.file.write(_markdown(entries, goodput, escape=not console.is_terminal, steady_state=steady_state))
    else:
        med, failed = summarise(entries, steady_state=steady_state)
        vs_static, vs_peer = ratios(entries)
        doc = {
            "runs": [
                {
                    "engine": k[0],
                    "batching": k[1],
                    "knobs": k[2],
                    **{m: (None if isinstance(v, float) and not math.isfinite(v) else v) for m, v in vals.items()},
                    # output throughput over static's, and refengine continuous's over this peer's, with intervals
                    "vs_static": ratio_record(vs_static[k]) if k in vs_static else None,
                    "continuous_vs_this": ratio_record(vs_peer[k]) if k in vs_peer else None,
                }
                for k, vals in med.items()
            ],
            "failed": [{"engine": k[0], "batching": k[1], "knobs": k[2], "error": e} for k, e in failed.items()],
            "notes": summary_lines(entries, goodput, steady_state=steady_state),
        }
        console.file.write(json.dumps(doc, indent=1) + "\n")


def _markdown(
    entries: Sequence[Entry], goodput: Mapping[str, float] | None, *, escape: bool = True, steady_state: bool = False
) -> str:
    """The table in markdown. `escape`: HTML and markdown marks escaped (`&lt;1%`, `\\(`), as a renderer needs them
    (a CI step summary renders both); off for a person reading it on a terminal, who would see the escapes."""

    def _md(x: object) -> str:
        return escaped(x) if escape else " ".join(str(x).splitlines()).replace("|", "\\|")

    cols = [c for c in table_columns(entries, goodput=goodput, steady_state=steady_state) if not c.empty]
    lines = [
        "| " + " | ".join(_md(c.header) for c in cols) + " |",
        "|" + "|".join("---" if c.justify == "left" else "---:" for c in cols) + "|",
    ]
    for i in range(len(cols[0].cells) if cols else 0):
        lines.append("| " + " | ".join(_md(str(c.cells[i])) for c in cols) + " |")
    lines += ["", *(f"- {_md(line)}" for line in summary_lines(entries, goodput, steady_state=steady_state))]
    return "\n".join(lines) + "\n"
