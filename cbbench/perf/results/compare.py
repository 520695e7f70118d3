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
When both files hold enough repeats of a configuration, the gate's test decides instead (cbbench/perf/stats.py, as
`cbbench gate` uses it): the Mann-Whitney U test on the log of each metric's repeats, the Hodges-Lehmann ratio
new / baseline and its exact interval, Bonferroni over every (configuration, metric) test at `confidence`; each
metric's tolerance is its minimum effect. "regressed": significantly worse and the ratio beyond the tolerance;
"improved" likewise; "inconclusive": no regression shown, but the interval's bad side reaches beyond the tolerance
(the smallest change these repeats could have seen, `unseen`); "small change": significant, within tolerance;
"ok": the interval rules out a change beyond the tolerance. "Enough" is what the test needs to reach its level at
all (at 95 %: 3 repeats a side for one test, 6 for the 16 default metrics of one configuration); with fewer, the
rule above decides and the summary says so.
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
2 the inputs could not be read or are of another schema version, 3 inconclusive (with `on_inconclusive="fail"`,
the default; "pass" makes it 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.text import Text

from cbbench.perf.results.files import file_error_line
from cbbench.perf.results.gate import (
    FORMATS,
    CompareSummary,
    ComparisonRow,
    gate_tolerances,
    render_json,
    render_markdown,
    render_table,
)
from cbbench.perf.results.matching import (
    cell_text,
    check_finite,
    filter_rows,
    ignored_key_names,
    keyed,
    label,
    samples_by_key,
)
from cbbench.perf.results.rows import Records, Row, as_rows, number, read_rows, with_extra_metrics

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
from cbbench.perf.stats import log_shift, runs_needed, unseen_change

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


DEFAULT_CONFIDENCE = 0.95  # for the whole comparison, as the gate's
ON_INCONCLUSIVE = ("fail", "pass")
EXIT_INCONCLUSIVE = 3  # the gate's code for the same verdict (gate/run.py)
TESTED = "U test"  # a row's `test`: how its status was decided
BY_TOLERANCE = "tolerance"


class NoCommonConfigs(ValueError):
    """The two files share no configuration: nothing was compared, which is never a pass."""


# One side of a comparison: a results CSV, or its rows (a DataFrame, or mappings as `rows.read_rows` gives them).
Source = str | os.PathLike[str] | Records | Sequence[Mapping[str, object]]


def compare(
    baseline_csv: Source,
    new_csv: Source,
    tolerances: Mapping[str, float | None] | None = None,
    *,
    fail_on_missing: bool = True,
    ignore_key: Sequence[str] = (),
    where: Sequence[str] = (),
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[list[ComparisonRow], bool]:
    """Compare each configuration's repeats: with the U test where both sides hold enough of them, else their
    medians against the tolerances (module docstring); returns (table rows, regressed). Each side is a results
    CSV or its rows (a DataFrame, or dicts as `rows.read_rows` gives them).

    `where`: KEY=VALUE filters (`batching=continuous`): only the rows of both files that match every one are
    compared, e.g. the continuous-batching run of an in-process sweep against an HTTP run.
    Each row: config, metric, direction, baseline, new, change (relative, signed), tolerance, baseline_min/max,
    new_min/max, status ("ok" | "improved" | "regressed" | "noise" | "inconclusive" | "small change" | "n/a" |
    "missing in new" | "new config"), test (TESTED or BY_TOLERANCE), and, where tested: ratio, low, high, p_worse,
    unseen, alpha.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tol = resolve_tolerances(tolerances)
    metrics = list(tol)
    frames = _frames((baseline_csv, new_csv), metrics, where)
    ignored = ignored_key_names(ignore_key)
    base, new = (keyed(df, metrics, ignored, side) for df, side in zip(frames, ("baseline", "new")))
    if base and new and not set(base) & set(new):
        made = [c for r in frames[0] if cell_text(c := r.get("command"))]
        how = f"the baseline was made with: {made[0]}" if made else "the baseline records no command"
        is_file = isinstance(baseline_csv, (str, os.PathLike))
        raise NoCommonConfigs(
            f"0 configurations in common; {how} (rerun its configurations with "
            f"`cbbench perf --like {baseline_csv if is_file else 'BASELINE.csv'}`)"
        )
    keys = list(base) + [k for k in new if k not in base]
    samples = [samples_by_key(df, metrics, ignored) for df in frames]
    alpha = (1 - confidence) / max(1, len(metrics) * len(set(base) & set(new)))  # Bonferroni, as the gate
    rows: list[ComparisonRow] = []
    regressed = False
    for key in keys:
        name = label(key, keys)
        if key not in new or key not in base:
            status = "missing in new" if key not in new else "new config"
            regressed |= status == "missing in new" and fail_on_missing
            nan = math.nan  # (a configuration's line has no numbers)
            rows.append(
                {
                    "config": name,
                    "metric": "",
                    "direction": "",
                    "baseline": nan,
                    "new": nan,
                    "change": nan,
                    "tolerance": nan,
                    "status": status,
                }
            )
            continue
        b, n = base[key], new[key]
        for m in metrics:
            row = _compare_metric(m, b, n, tol[m])
            _test_metric(row, samples[0][key][m], samples[1][key][m], tol[m], alpha)
            row["config"] = name
            regressed |= row["status"] in ("regressed", "missing in new")
            rows.append(row)
    return rows, regressed


def _frames(sources: tuple[Source, Source], metrics: Sequence[str], where: Sequence[str]) -> list[list[Row]]:
    """Each side as rows: read (a CSV path, or rows already read), its `extra` metrics as columns, checked finite,
    filtered by `where` (a metric only some `extra` cells know, or none, reads as NaN: `aggregate_rows` gets a
    missing key as NaN)."""
    frames = [with_extra_metrics(_read(x)) for x in sources]
    for table, x in zip(frames, sources):
        check_finite(table, metrics, x if isinstance(x, (str, os.PathLike)) else "a results table")
    return [filter_rows(table, where, side) for table, side in zip(frames, ("baseline", "new"))]


def _read(source: Source) -> Sequence[Mapping[str, object]]:
    return read_rows(source) if isinstance(source, (str, os.PathLike)) else as_rows(source)


def _spread(row: Row, key: str) -> float:
    """An aggregate's min or max as it is (an int column's stays an int, as the JSON shows it)."""
    v = row[key]
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else number(v)


def _compare_metric(m: str, b: Row, n: Row, tol: float) -> ComparisonRow:
    bv, nv = number(b[m]), number(n[m])
    d = direction(m)
    row: ComparisonRow = {
        "metric": m,
        "direction": d,
        "baseline": bv,
        "new": nv,
        "tolerance": tol,
        "baseline_min": _spread(b, f"{m}_min"),
        "baseline_max": _spread(b, f"{m}_max"),
        "new_min": _spread(n, f"{m}_min"),
        "new_max": _spread(n, f"{m}_max"),
    }
    if math.isnan(bv) or math.isnan(nv):
        row.update({"change": math.nan, "status": "n/a" if math.isnan(bv) else "missing in new"})
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


def _test_metric(row: ComparisonRow, b: list[float], n: list[float], tol: float, alpha: float) -> None:
    """Decide `row` with the U test instead of the tolerance rule, when both sides have repeats enough for the
    test to reach `alpha` and every value has a log; otherwise leave the rule's status and say why."""
    row.update({"test": BY_TOLERANCE, "alpha": alpha})
    if row["status"] in ("n/a", "missing in new"):
        return
    if min(len(b), len(n)) < 2 or 1 / math.comb(len(b) + len(n), len(b)) > alpha:
        return  # (too few repeats: the test could never be significant here)
    if min(b + n) <= 0:
        return  # (a zero has no log: a count such as preemptions; the rule decides)
    s = log_shift(b, n, alpha)
    lower = row["direction"] == LOWER
    p_worse, p_better = (s.p_higher, s.p_lower) if lower else (s.p_lower, s.p_higher)
    worse = s.ratio > 1 + tol if lower else s.ratio < 1 - tol
    better = s.ratio < 1 - tol if lower else s.ratio > 1 + tol
    unseen = unseen_change(s, lower)
    if p_worse <= alpha and worse:
        status = "regressed"
    elif p_better <= alpha and better:
        status = "improved"
    elif unseen > tol:
        status = "inconclusive"
    elif p_worse <= alpha or p_better <= alpha:
        status = "small change"
    else:
        status = "ok"
    row.update(
        {
            "status": status,
            "test": TESTED,
            "ratio": s.ratio,
            "low": s.low,
            "high": s.high,
            "p_worse": p_worse,
            "unseen": unseen,
        }
    )


def repeats_note(rows: Sequence[ComparisonRow], confidence: float = DEFAULT_CONFIDENCE) -> str:
    """How the statuses were decided, in one sentence: by the U test, by the tolerances because the repeats were
    too few for it (and how many it needs), or some of each."""
    judged = [r for r in rows if r.get("test") in (TESTED, BY_TOLERANCE) and r.get("metric")]
    if not judged:
        return ""
    alpha = float(judged[0]["alpha"])
    tested = sum(r["test"] == TESTED for r in judged)
    how = (
        f"U test on the log of each metric's repeats, Bonferroni over {len(judged)} tests at {confidence:.0%} "
        f"(one-sided alpha {alpha:.2g} each)"
    )
    if tested == len(judged):
        return f"decided by the {how}"
    need = runs_needed(alpha)
    fallback = f"too few repeats for the {how}: it needs {need} a side; the tolerances and the repeats' spread decided"
    if tested == 0:
        return fallback
    return f"{tested} of {len(judged)} decided by the {how}; the rest ({fallback.partition(': ')[2]})"


def inconclusive(rows: Sequence[ComparisonRow], regressed: bool) -> bool:
    return not regressed and any(r["status"] == "inconclusive" for r in rows)


def main_compare(
    baseline: str | os.PathLike[str],
    new: str | os.PathLike[str],
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
    confidence: float = DEFAULT_CONFIDENCE,
    on_inconclusive: str = "fail",
) -> int:
    """Print the comparison (`fmt`: text | markdown | json) and return the exit code (0 pass, 1 regression,
    2 unusable input: one line on `err`, stderr by default; 3 inconclusive when `on_inconclusive` is "fail")."""
    console = console or Console()
    err = err or Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if on_inconclusive not in ON_INCONCLUSIVE:
            raise ValueError(f"on-inconclusive must be one of {', '.join(ON_INCONCLUSIVE)}, got {on_inconclusive!r}")
        overrides, sources = (
            gate_tolerances(baseline, tolerance_overrides)
            if use_tolerance_files
            else (dict(tolerance_overrides or {}), ["--tolerance"] if tolerance_overrides else [])
        )
        rows, regressed = compare(
            baseline,
            new,
            overrides,
            fail_on_missing=fail_on_missing,
            ignore_key=ignore_key,
            where=where,
            confidence=confidence,
        )
    except (OSError, ValueError) as e:
        msg = file_error_line(e) if isinstance(e, OSError) else str(e).strip().splitlines()[0] if str(e).strip() else ""
        msg = msg or type(e).__name__
        err.print(f"cbbench compare: error: {msg}", markup=False, style="bold red")
        return 2
    summary = _summary(rows, regressed, baseline, new, sources, confidence)
    if fmt == "json":
        console.file.write(render_json(rows, summary) + "\n")
    elif fmt == "markdown":
        console.file.write(render_markdown(rows, summary, only_changes=only_changes))
    else:
        names = [
            f"{path} ({label})" if label else path
            for path, label in (
                (summary["baseline"], summary["baseline_label"]),
                (summary["new"], summary["new_label"]),
            )
        ]
        console.print(render_table(rows, title=f"{names[0]} -> {names[1]}", only_changes=only_changes))
        if sources:
            console.print(Text("tolerances from: " + ", ".join(sources), style="dim"))
        if summary["decided_by"]:
            console.print(Text(summary["decided_by"], style="dim"))
        style = "bold red" if regressed else "yellow" if summary["inconclusive"] else "green"
        console.print(Text(summary["message"], style=style))
    if regressed:
        return 1
    return EXIT_INCONCLUSIVE if summary["inconclusive"] and on_inconclusive == "fail" else 0


def _summary(
    rows: list[ComparisonRow],
    regressed: bool,
    baseline: str | os.PathLike[str],
    new: str | os.PathLike[str],
    sources: list[str],
    confidence: float = DEFAULT_CONFIDENCE,
) -> CompareSummary:
    """The verdict of a comparison, in words and counts, with what was compared (`--format json`'s summary)."""
    common = len({r["config"] for r in rows if r["metric"]})
    n_bad = sum(r["status"] in ("regressed", "missing in new") for r in rows)
    n_noise = sum(r["status"] == "noise" for r in rows)
    unsure = [r for r in rows if r["status"] == "inconclusive"]
    if regressed:
        head = f"{n_bad} regression(s) beyond tolerance" + (
            "" if any(r.get("test") == TESTED for r in rows) else " and outside the repeats' spread"
        )
    elif unsure:
        head = (
            "INCONCLUSIVE: no regression shown, but the repeats could not rule out one beyond tolerance; the smallest "
        )
        head += (
            "change in the bad direction they could have seen: "
            + ", ".join(
                f"{r['metric']} {r['unseen']:.1%} (tolerance {r['tolerance']:.0%})"
                + (f" ({r['config']})" if common > 1 else "")
                for r in unsure[:4]
            )
            + (" ..." if len(unsure) > 4 else "")
        )
    else:
        head = "no regression beyond tolerance"
    message = (
        head
        + f" ({common} configuration(s) in common"
        + (f"; {n_noise} change(s) within the spread of the repeats" if n_noise else "")
        + ")"
    )
    return {
        "baseline": str(baseline),
        "new": str(new),
        "baseline_label": _labels(baseline),
        "new_label": _labels(new),
        "regressed": regressed,
        "inconclusive": inconclusive(rows, regressed),
        "message": message,
        "decided_by": repeats_note(rows, confidence),
        "configurations_in_common": common,
        "tolerance_sources": sources,
    }


def _labels(path: str | os.PathLike[str]) -> str:
    """The `--label`s of a results file's runs, comma-joined ("" when it has none)."""
    cells = (r["label"] for r in read_rows(path))
    return ", ".join(x for x in dict.fromkeys(str(c) for c in cells if cell_text(c) != "") if x)
