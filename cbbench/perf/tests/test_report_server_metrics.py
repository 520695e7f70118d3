"""HTTP runs keep the scraped /metrics series in the results JSON (`server_metrics`, by run label), and
`cbbench report` draws it: one chart per run with four lines (KV usage, running, waiting, preemptions); a JSON
without a series (an in-process run, a server without /metrics) gets no chart at all."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from benchmarks.fake_openai_server import FakeOpenAIServer
from cbbench.perf.backends.server_metrics import SERIES_KEYS
from cbbench.perf.cli import app
from cbbench.perf.report.html import render_html
from cbbench.perf.report.server_series import server_metrics_html
from cbbench.perf.results.run_json import read_run

TINY = ["--workload", "fixed", "--workload-param", "input_len=8,output_len=8", "--num-prompts", "6", "--quiet"]
FOUR = ["kv_usage", "num_running", "num_waiting", "num_preemptions"]


@pytest.fixture(scope="module")
def http_json(tmp_path_factory):
    out = tmp_path_factory.mktemp("http")
    with FakeOpenAIServer(token_delay_s=0.02) as server:
        res = CliRunner().invoke(
            app,
            ["perf", *TINY, "--backend", "openai", "--base-url", server.base_url, "--model", "fake-model",
             "--output", str(out / "r.csv")],
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    return out / "r.json"


def _series_drawn(page: str) -> list[str]:
    return re.findall(r'<polyline data-series="([a-z_]+)"', page)


def test_http_run_json_keeps_the_series(http_json):
    doc = read_run(http_json)
    (label,) = doc["records"]
    series = doc["server_metrics"][label]
    assert len(series) >= 2  # the scrapes before and after the run, at least
    assert all(list(p) == list(SERIES_KEYS) for p in series)
    times = [p["time"] for p in series]
    assert times == sorted(times) and times[0] == 0.0
    assert series[0]["num_preemptions"] == 0.0 and series[-1]["num_preemptions"] == 6.0  # one per request
    assert all(p["num_running"] is not None and p["kv_usage"] is not None for p in series)


def test_report_draws_the_four_lines(http_json):
    page_path = http_json.with_suffix(".html")
    res = CliRunner().invoke(app, ["report", str(http_json), "-o", str(page_path)])
    assert res.exit_code == 0, res.output
    page = page_path.read_text()
    assert 'id="server-metrics"' in page
    assert _series_drawn(page) == FOUR


def test_no_series_no_chart(http_json):
    doc = read_run(http_json)
    del doc["server_metrics"]
    page = render_html(doc)
    assert "server-metrics" not in page and not _series_drawn(page)
    assert server_metrics_html({"server_metrics": {"a/b/-/repeat0": []}}) == ""  # a run with no scrape: nothing


def test_a_line_the_server_does_not_export_is_left_out():
    points = [dict(zip(SERIES_KEYS, (t, 0.5, 2.0, None, 0.0))) for t in (0.0, 0.5, 1.0)]
    page = server_metrics_html({"server_metrics": {"openai/-/-/repeat0": points}})
    assert _series_drawn(page) == ["kv_usage", "num_running", "num_preemptions"]
    assert "KV usage % (peak 50)" in page
