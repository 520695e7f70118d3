"""Shares in the perf table (peak KV, slot util) never read 0% when something was used: 58 of 16384 KV blocks is
"<1%", in the text table, the markdown table and the HTML report alike (they share `table_columns`)."""

from __future__ import annotations

import io
import math

from rich.console import Console

from cbbench.perf.report.html import results_table
from cbbench.perf.report.show import render
from cbbench.perf.report.table import percent, print_perf_table
from cbbench.workloads.workload import Workload, WorkloadRequest

USED, TOTAL = 58, 16384  # issue 28's run: 58 blocks of the pool used at the peak


def _entries() -> list:
    row = {"output_throughput": 9788.0, "peak_kv_blocks": USED, "peak_kv_usage": USED / TOTAL}
    return [
        (("refengine", "continuous", "-"), {**row, "mean_slot_utilisation": 0.001}, None),
        (("refengine", "static", "-"), {**row, "peak_kv_usage": 0.0, "mean_slot_utilisation": 0.5}, None),
    ]


def _workload() -> Workload:
    return Workload("sharegpt", {"request_rate": math.inf, "burstiness": 1.0}, [WorkloadRequest([1] * 10, 5)])


def test_percent_reads_below_one_percent_and_keeps_zero_and_nan():
    assert percent(USED / TOTAL) == "<1%"
    assert percent(0.004999) == "<1%"
    assert percent(0.0) == "0%"  # nothing used: a true zero
    assert percent(0.015) == "2%" and percent(1.0) == "100%"
    assert percent(math.nan) == ""


def test_text_markdown_and_html_tables_show_under_one_percent():
    buf = io.StringIO()
    print_perf_table(Console(file=buf, force_terminal=False, color_system=None, width=200), _entries(), _workload())
    md = io.StringIO()
    render(Console(file=md), _entries(), _workload(), "markdown")
    page = results_table(_entries(), None)
    assert "<1%" in buf.getvalue(), buf.getvalue()
    assert "&lt;1%" in page, page  # (HTML-escaped)
    # markdown escapes "<" as "&lt;" (it would open an HTML tag); rendered, it reads <1%
    continuous = next(line for line in md.getvalue().splitlines() if "| continuous |" in line)
    static = next(line for line in md.getvalue().splitlines() if "| static |" in line)
    assert continuous.count("&lt;1%") == 2, continuous  # peak KV and slot util
    assert "| 0% |" in static and "1%" not in static, static  # a share that is 0 stays 0%
