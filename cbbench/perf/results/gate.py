"""The gate's settings and reports: tolerance files that live with a baseline, and `compare --format`.

Tolerances, from weakest to strongest (a later layer overrides an earlier one, pattern by pattern):
1. `tolerances.DEFAULT_TOLERANCES` (5 % throughput, 10 % latency mean / median / p99);
2. `[tool.cbbench.tolerances]` in the pyproject.toml of the current folder or a parent (project-wide);
3. the baseline's sidecar: `NAME.tolerances.toml` beside `NAME.csv` (what that baseline's machine can hold);
4. `--tolerance METRIC=VALUE` on the command line.
Each file holds a `[tolerances]` table (the sidecar) of metric names or fnmatch patterns to a relative tolerance:
0.2, "20%", or "off" to stop gating that metric.

Formats: `text` (rich tables, one per configuration, for a terminal or a log), `markdown` (one table, for a CI step summary such as
$GITHUB_STEP_SUMMARY), `json` (everything, for tools).
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypedDict, runtime_checkable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from cbbench.perf.results.tolerances import parse_tolerances

FORMATS = ("text", "markdown", "json")
BAD_STATUSES = ("regressed", "missing in new")


class ComparisonRow(TypedDict, total=False):
    """One line of `compare`'s table: one metric of one configuration, or the configuration itself (`metric` "")
    when only one file holds it. Every line has config, metric, direction, baseline, new, change, tolerance and
    status; a metric's line has the repeats' spread, `test` (how its status was decided) and `alpha`, and where the
    U test decided, its ratio new / baseline, interval, p-value and `unseen` (compare.py's `compare`)."""

    config: str
    metric: str
    direction: str  # "higher" | "lower" (is better); "" on a configuration's line
    baseline: float  # the median of the baseline's repeats (NaN: not measured)
    new: float
    change: float  # (new - baseline) / |baseline|
    tolerance: float
    status: str
    baseline_min: float
    baseline_max: float
    new_min: float
    new_max: float
    test: str
    alpha: float
    ratio: float
    low: float
    high: float
    p_worse: float
    unseen: float


class CompareSummary(TypedDict):
    """The verdict of a comparison, in words and counts, with what was compared (`--format json`'s summary)."""

    baseline: str
    new: str
    baseline_label: str
    new_label: str
    regressed: bool
    inconclusive: bool
    message: str
    decided_by: str
    configurations_in_common: int
    tolerance_sources: list[str]


def sidecar_path(baseline: str | os.PathLike[str]) -> Path:
    p = Path(baseline)
    return p.with_name(f"{p.stem}.tolerances.toml")


def _values(table: Mapping[str, object], where: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f'{where}: tolerance {name} must be a number, a percentage or "off", got {value!r}')
        out.update(parse_tolerances([f"{name}={value}"]))
    return out


def read_tolerance_file(
    path: str | os.PathLike[str], table: Sequence[str] = ("tolerances",)
) -> dict[str, float | None]:
    """The tolerance table of a TOML file ({} when the table is absent); ValueError naming the file if bad."""
    text = Path(path).read_text()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    for name in table:
        doc = doc.get(name, {})
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: [{'.'.join(table)}] must be a table")
    return _values(doc, str(path))


def _pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


def gate_tolerances(
    baseline: str | os.PathLike[str],
    cli: Mapping[str, float | None] | None = None,
    *,
    cwd: str | os.PathLike[str] | None = None,
) -> tuple[dict[str, float | None], list[str]]:
    """The merged overrides for `compare` (see the module docstring) and the files they came from."""
    merged: dict[str, float | None] = {}
    sources: list[str] = []

    def layer(values: Mapping[str, float | None], source: str) -> None:
        if values:
            sources.append(source)
        for k, v in values.items():
            merged.pop(k, None)  # re-insert: resolve_tolerances applies patterns in order, the last one wins
            merged[k] = v

    py = _pyproject(Path(cwd or os.getcwd()).resolve())
    if py is not None:
        layer(read_tolerance_file(py, ("tool", "cbbench", "tolerances")), f"{py} [tool.cbbench.tolerances]")
    side = sidecar_path(baseline)
    if side.is_file():
        layer(read_tolerance_file(side), str(side))
    layer(dict(cli or {}), "--tolerance")
    return merged, sources


@runtime_checkable
class _Scalar(Protocol):
    """A numpy scalar: its Python value is `item()`."""

    def item(self) -> object: ...


def _clean(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else str(x)
    if isinstance(x, _Scalar):
        return _clean(x.item())
    return x


def render_json(rows: Sequence[ComparisonRow], summary: CompareSummary) -> str:
    return json.dumps(
        {**{k: _clean(v) for k, v in summary.items()}, "rows": [{k: _clean(v) for k, v in r.items()} for r in rows]},
        indent=1,
    )


_MD_SPECIAL = re.compile(r"([\\`*_\[\]()#!|~])")  # what starts markdown emphasis, code, links, tables or HTML


def _md(x: object) -> str:
    """A label, path or name as plain text in a markdown table cell: HTML escaped, markdown's marks backslashed,
    one line (a CI step summary renders both HTML and markdown)."""
    text = html.escape(" ".join(str(x).splitlines()), quote=False)
    return _MD_SPECIAL.sub(r"\\\1", text)


def render_markdown(rows: Sequence[ComparisonRow], summary: CompareSummary, *, only_changes: bool = False) -> str:
    verdict = "FAIL" if summary["regressed"] else "INCONCLUSIVE" if summary.get("inconclusive") else "PASS"

    def name(path: str, label: str) -> str:
        return _md(path) + (f" ({_md(label)})" if label else "")

    lines = [
        f"### cbbench compare: {name(summary['baseline'], summary['baseline_label'])} -> "
        f"{name(summary['new'], summary['new_label'])}",
        "",
        f"**{verdict}**: {summary['message']}",
        "",
    ]
    if summary.get("decided_by"):
        lines += [_md(summary["decided_by"]), ""]
    shown = [r for r in rows if not (only_changes and r["status"] == "ok")]
    if shown:
        lines += [
            "| configuration | metric | baseline | new | change | tolerance | status |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for r in shown:
            change = _change(r)
            tol = "" if _nan(r.get("tolerance")) else f"{r['tolerance']:.0%}"
            status = f"**{r['status']}**" if r["status"] in (*BAD_STATUSES, "inconclusive") else r["status"]
            lines.append(
                f"| {_md(r['config'])} | {_md(r['metric'] or '(configuration)')} | {_num(r.get('baseline'))} "
                f"| {_num(r.get('new'))} | {change} | {tol} | {status} |"
            )
    return "\n".join(lines) + "\n"


def _change(r: ComparisonRow) -> str:
    """`+3.1%`, or where the U test decided, `+3.1% (-2.0% to +8.4%)`: the median change and the interval of the
    Hodges-Lehmann ratio new / baseline, as changes."""
    if _nan(r.get("change")):
        return ""
    text = f"{r['change']:+.1%}"
    low, high = _float(r.get("low")), _float(r.get("high"))
    if low > 0 and math.isfinite(high):
        text += f" ({low - 1:+.1%} to {high - 1:+.1%})"
    return text


def _float(x: float | None) -> float:
    return math.nan if x is None or _nan(x) else float(x)


def _nan(x: object) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _num(x: float | None) -> str:
    return "" if x is None or _nan(x) else f"{float(x):.4g}"


_STYLE = {
    "regressed": "bold red",
    "improved": "green",
    "missing in new": "bold red",
    "new config": "yellow",
    "n/a": "dim",
    "ok": "",
    "noise": "yellow",
    "inconclusive": "yellow",
    "small change": "yellow",
}


def render_table(rows: Sequence[ComparisonRow], *, title: str = "cbbench compare", only_changes: bool = False) -> Group:
    """`compare`'s rows as rich tables, one per configuration (its label as the table's title), so that
    the table fits an 80-column CI log. With `only_changes`, rows whose status is "ok" are left out."""
    tables: list[Table] = []
    by_config: dict[str, list[ComparisonRow]] = {}
    for r in rows:
        by_config.setdefault(r["config"], []).append(r)
    for config, group in by_config.items():
        shown = [r for r in group if not (only_changes and r["status"] == "ok")]
        if not shown:
            continue
        t = Table(title=Text(config), title_justify="left", title_style="bold")
        t.add_column("metric", no_wrap=True)
        for col in ("", "baseline", "new", "change", "tol"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_column("status", no_wrap=True)
        for r in shown:
            arrow = {"higher": "↑", "lower": "↓"}.get(r["direction"], "")
            t.add_row(
                r["metric"] or "(config)",
                arrow,
                _num(r["baseline"]),
                _num(r["new"]),
                _change(r),
                "" if _nan(r["tolerance"]) else f"{r['tolerance']:.0%}",
                r["status"],
                style=_STYLE.get(r["status"], ""),
            )
        tables.append(t)
    return Group(Text(title, style="bold"), *tables)
