"""Compare two results CSVs: per configuration and metric, the change, its direction and a tolerance.

Rows are matched on `config_key` (engine, model, device, workload and its params, batching, the engine
knobs); repeats of a configuration are first reduced to their median (`aggregate_repeats`), and the min / max
spread of both sides is carried into the rows (`baseline_min`, ...) so a reader can see how noisy a metric was.

A metric regresses when BOTH hold:
- its new median is worse than the baseline's by more than its relative tolerance: higher-is-better (throughputs,
  goodput): new < baseline * (1 - tol); lower-is-better (latencies, in ms): new > baseline * (1 + tol);
- and the repeats do not overlap: every new repeat is worse than every baseline repeat (higher-is-better:
  new_max < baseline_min; lower-is-better: new_min > baseline_max). With one run per side this is implied by the
  first condition; with repeats, a shift that stays inside the run-to-run spread is reported as "noise", not
  failed. Improvements are judged the same way.
A metric the baseline has but the new file lacks (NaN) is "missing in new" and fails; NaN in the baseline is "n/a".
Metrics in a row's `extra` JSON (a percentile asked for with --metric-percentiles) can be gated too.
Tolerances come from the defaults, pyproject's [tool.cbbench.tolerances], the baseline's sidecar
NAME.tolerances.toml and --tolerance, in that order (`gate.py`). Zero configurations in common is an error (exit
2), with the command the baseline was made with (rerun it with `cbbench perf --like BASELINE.csv`).
By default the gate covers the throughputs (5 %) and the mean / median / p99 of TTFT, TPOT, ITL and E2EL (10 %);
other known metrics can be added with a tolerance override. A configuration of the baseline that is missing from
the new file fails the gate unless `fail_on_missing=False`; one that is new is only reported.

Across backends (an in-process run against an HTTP run of the same workload, i.e. the server's overhead): the
HTTP row cannot know the server's engine, device, dtype, batching mode or knobs, so `ignore_key=["server"]`
(`cbbench compare --ignore-key server`) matches rows on the model and the load alone (workload, its params,
num_prompts, seed, request rate, burstiness, max concurrency). Any key column can be ignored by name; if ignoring
makes two configurations of one file the same, the comparison is refused (exit 2) rather than guessed.

Exit codes of `main_compare` (for CI): 0 no regression, 1 a regression (or a missing configuration),
2 the inputs could not be read or are of another schema version.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from cbbench.perf.results.gate import FORMATS, gate_tolerances, render_json, render_markdown, render_table
from cbbench.perf.results.rows import Row, aggregate_rows, as_rows, number, read_rows, with_extra_metrics
from cbbench.perf.results.schema import KEY_NAMES, config_key

# (the tolerance rules are tolerances.py's; importable from here too, as they always were)
from cbbench.perf.results.tolerances import (
    DEFAULT_TOLERANCES,
    DIRECTIONS,
    HIGHER,
    LATENCY_TOLERANCE,
    LOWER,
    THROUGHPUT_TOLERANCE,
    direction,
    parse_tolerances,
    resolve_tolerances,
)

__all__ = [
    "DEFAULT_TOLERANCES",
    "DIRECTIONS",
    "HIGHER",
    "LATENCY_TOLERANCE",
    "LOWER",
    "NoCommonConfigs",
    "THROUGHPUT_TOLERANCE",
    "compare",
    "direction",
    "ignored_key_names",
    "main_compare",
    "parse_tolerances",
    "render_table",
    "resolve_tolerances",
]

# key columns whose value reads without its name in a config label
_BARE = {"engine", "model", "device", "dtype", "workload", "batching"}


def _label(key: tuple[str, ...], keys: Sequence[tuple[str, ...]]) -> str:
    """engine, workload and batching, then only what tells this configuration from the others."""
    parts = []
    for i, name in enumerate(KEY_NAMES):
        if key[i] == "" or (name not in ("engine", "workload", "batching") and len({k[i] for k in keys}) == 1):
            continue
        if name == "workload_params":  # only the params that differ between configurations
            dicts = [json.loads(k[i]) if k[i] else {} for k in keys]
            mine = json.loads(key[i])
            parts += [f"{p}={v}" for p, v in mine.items() if len({json.dumps(d.get(p)) for d in dicts}) > 1]
        else:
            parts.append(key[i] if name in _BARE else f"{name}={key[i]}")
    return " ".join(parts)


# what identifies the load a run was measured under; `--ignore-key server` ignores every other key column
LOAD_KEY_NAMES = ("model", "workload", "num_prompts", "seed", "request_rate", "burstiness", "workload_params")
SERVER_KEY_NAMES = tuple(k for k in KEY_NAMES if k not in LOAD_KEY_NAMES)


def ignored_key_names(names: Sequence[str]) -> set[str]:
    """`["server"]` / `["engine,batching"]` -> the key columns to leave out of matching (ValueError if unknown)."""
    out: set[str] = set()
    for item in names:
        for name in (x.strip() for x in item.split(",") if x.strip()):
            if name == "server":
                out.update(SERVER_KEY_NAMES)
            elif name in KEY_NAMES:
                out.add(name)
            else:
                raise ValueError(f"ignore-key: {name!r} is not a key column (one of server, {', '.join(KEY_NAMES)})")
    return out


def _keyed(rows: Sequence[Row], metrics: Sequence[str], ignored: set[str], side: str) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for r in aggregate_rows(rows, metrics):
        key = tuple("" if name in ignored else cell for name, cell in zip(KEY_NAMES, config_key(r)))
        if key in out:
            raise ValueError(
                f"ignore-key: two configurations of the {side} file become one "
                f"({r['engine']} {r['batching']}); pick one with --where (e.g. --where "
                f"batching={r['batching']}) or ignore fewer key columns"
            )
        out[key] = r
    return out


def parse_where(items: Sequence[str]) -> list[tuple[str, str]]:
    """`["batching=continuous"]` -> [("batching", "continuous")] (ValueError naming a bad item)."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in KEY_NAMES + ("label",):
            raise ValueError(
                f"where: {item!r} is not KEY=VALUE with KEY a key column or label ({', '.join(KEY_NAMES)}, label)"
            )
        out.append((name.strip(), value.strip()))
    return out


def filter_rows(rows: Sequence[Row], where: Sequence[str], side: str) -> list[Row]:
    """The rows whose cells (read as config keys read them: 512.0 is "512") match every `where` item. An
    empty cell is unknown, not different, and matches: an HTTP run cannot know the server's batching mode, so
    `--where batching=continuous` keeps it and picks the continuous run of the in-process file."""
    out = list(rows)
    for name, value in parse_where(where):
        out = [r for r in out if _cell_text(r.get(name)) in (value, "")]
        if not out:
            raise ValueError(f"where: no row of the {side} file has {name}={value}")
    return out


def _cell_text(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def check_finite(rows: Sequence[Row], metrics: Sequence[str], source: Any) -> None:
    """ValueError naming the first row whose metric is +-inf: a gate on it would pass or fail by accident
    (an empty cell, NaN, is a missing metric and is judged as one)."""
    for m in metrics:
        for i, r in enumerate(rows):
            if abs(v := number(r.get(m))) == math.inf:
                raise ValueError(
                    f"{source}: metric {m} is {v} on row {i + 1} ({r['engine']} {r['batching']}): not a finite number"
                )


class NoCommonConfigs(ValueError):
    """The two files share no configuration: nothing was compared, which is never a pass."""


def compare(
    baseline_csv: str | os.PathLike | Any,
    new_csv: str | os.PathLike | Any,
    tolerances: Mapping[str, float | None] | None = None,
    *,
    fail_on_missing: bool = True,
    ignore_key: Sequence[str] = (),
    where: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], bool]:
    """Compare the median of each configuration's repeats; returns (table rows, regressed). Each side is a results
    CSV or its rows (a DataFrame, or dicts as `rows.read_rows` gives them).

    `where`: KEY=VALUE filters (`batching=continuous`): only the rows of both files that match every one are
    compared, e.g. the continuous-batching run of an in-process sweep against an HTTP run.
    Each row: config, metric, direction, baseline, new, change (relative, signed), tolerance, baseline_min/max,
    new_min/max, status ("ok" | "improved" | "regressed" | "n/a" | "missing in new" | "new config").
    """
    tol = resolve_tolerances(tolerances)
    metrics = list(tol)
    is_file = [isinstance(x, (str, os.PathLike)) for x in (baseline_csv, new_csv)]
    frames = [with_extra_metrics(read_rows(x) if f else as_rows(x)) for x, f in zip((baseline_csv, new_csv), is_file)]
    for table, x, f in zip(frames, (baseline_csv, new_csv), is_file):
        check_finite(table, metrics, x if f else "a results table")
    # (a metric only some `extra` cells know, or none, reads as NaN: `aggregate_rows` gets a missing key as NaN)
    frames = [filter_rows(table, where, side) for table, side in zip(frames, ("baseline", "new"))]
    ignored = ignored_key_names(ignore_key)
    base, new = (_keyed(table, metrics, ignored, side) for table, side in zip(frames, ("baseline", "new")))
    if base and new and not set(base) & set(new):
        made = [c for r in frames[0] if _cell_text(c := r.get("command"))]
        how = f"the baseline was made with: {made[0]}" if made else "the baseline records no command"
        raise NoCommonConfigs(
            f"0 configurations in common; {how} (rerun its configurations with "
            f"`cbbench perf --like {baseline_csv if is_file[0] else 'BASELINE.csv'}`)"
        )
    keys = list(base) + [k for k in new if k not in base]
    rows: list[dict[str, Any]] = []
    regressed = False
    for key in keys:
        label = _label(key, keys)
        if key not in new or key not in base:
            status = "missing in new" if key not in new else "new config"
            regressed |= status == "missing in new" and fail_on_missing
            rows.append(
                {
                    "config": label,
                    "metric": "",
                    "direction": "",
                    "baseline": math.nan,
                    "new": math.nan,
                    "change": math.nan,
                    "tolerance": math.nan,
                    "status": status,
                }
            )
            continue
        b, n = base[key], new[key]
        for m in metrics:
            row = _compare_metric(m, b, n, tol[m])
            row["config"] = label
            regressed |= row["status"] in ("regressed", "missing in new")
            rows.append(row)
    return rows, regressed


def _compare_metric(m: str, b: Mapping[str, Any], n: Mapping[str, Any], tol: float) -> dict[str, Any]:
    bv, nv = float(b[m]), float(n[m])
    d = direction(m)
    row = {
        "metric": m,
        "direction": d,
        "baseline": bv,
        "new": nv,
        "tolerance": tol,
        "baseline_min": b[f"{m}_min"],
        "baseline_max": b[f"{m}_max"],
        "new_min": n[f"{m}_min"],
        "new_max": n[f"{m}_max"],
    }
    if math.isnan(bv) or math.isnan(nv):
        row.update(change=math.nan, status="n/a" if math.isnan(bv) else "missing in new")
        return row
    row["change"] = (nv - bv) / abs(bv) if bv != 0 else (0.0 if nv == bv else math.copysign(math.inf, nv - bv))
    worse = nv < bv * (1 - tol) if d == HIGHER else nv > bv * (1 + tol)
    better = nv > bv * (1 + tol) if d == HIGHER else nv < bv * (1 - tol)
    bmin, bmax, nmin, nmax = (
        float(x) for x in (row["baseline_min"], row["baseline_max"], row["new_min"], row["new_max"])
    )
    apart_worse = nmax < bmin if d == HIGHER else nmin > bmax  # every new repeat worse than every baseline one
    apart_better = nmin > bmax if d == HIGHER else nmax < bmin
    row["status"] = (
        "regressed"
        if worse and apart_worse
        else "improved"
        if better and apart_better
        else "noise"
        if worse or better
        else "ok"
    )
    return row


def main_compare(
    baseline: str | os.PathLike,
    new: str | os.PathLike,
    tolerance_overrides: Mapping[str, float | None] | None = None,
    *,
    fail_on_missing: bool = True,
    only_changes: bool = False,
    console: Console | None = None,
    ignore_key: Sequence[str] = (),
    err: Console | None = None,
    fmt: str = "text",
    use_tolerance_files: bool = True,
    where: Sequence[str] = (),
) -> int:
    """Print the comparison (`fmt`: text | markdown | json) and return the exit code (0 pass, 1 regression,
    2 unusable input: one line on `err`, stderr by default)."""
    console = console or Console()
    err = err or Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        overrides, sources = (
            gate_tolerances(baseline, tolerance_overrides)
            if use_tolerance_files
            else (dict(tolerance_overrides or {}), ["--tolerance"] if tolerance_overrides else [])
        )
        rows, regressed = compare(
            baseline, new, overrides, fail_on_missing=fail_on_missing, ignore_key=ignore_key, where=where
        )
    except (OSError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        err.print(f"cbbench compare: error: {msg}", markup=False, style="bold red")
        return 2
    common = len({r["config"] for r in rows if r["metric"]})
    n_bad = sum(r["status"] in ("regressed", "missing in new") for r in rows)
    n_noise = sum(r["status"] == "noise" for r in rows)
    message = (
        (
            f"{n_bad} regression(s) beyond tolerance and outside the repeats' spread"
            if regressed
            else "no regression beyond tolerance"
        )
        + f" ({common} configuration(s) in common"
        + (f"; {n_noise} change(s) within the spread of the repeats" if n_noise else "")
        + ")"
    )
    labels = {side: _labels(path) for side, path in (("baseline", baseline), ("new", new))}
    names = {
        side: f"{path} ({labels[side]})" if labels[side] else str(path)
        for side, path in (("baseline", baseline), ("new", new))
    }
    summary = {
        "baseline": str(baseline),
        "new": str(new),
        "baseline_label": labels["baseline"],
        "new_label": labels["new"],
        "regressed": regressed,
        "message": message,
        "configurations_in_common": common,
        "tolerance_sources": sources,
    }
    if fmt == "json":
        console.file.write(render_json(rows, summary) + "\n")
    elif fmt == "markdown":
        console.file.write(render_markdown(rows, summary, only_changes=only_changes))
    else:
        console.print(render_table(rows, title=f"{names['baseline']} -> {names['new']}", only_changes=only_changes))
        if sources:
            console.print(Text("tolerances from: " + ", ".join(sources), style="dim"))
        console.print(Text(message, style="bold red" if regressed else "green"))
    return 1 if regressed else 0


def _labels(path: str | os.PathLike) -> str:
    """The `--label`s of a results file's runs, comma-joined ("" when it has none)."""
    cells = (r["label"] for r in read_rows(path))
    return ", ".join(x for x in dict.fromkeys(str(c) for c in cells if _cell_text(c) != "") if x)
