"""`cbbench report RUN.json -o report.html`: one self-contained page (results table, TTFT / ITL CDFs, slot timeline,
environment), checked as text and in a real headless Chromium: the DOM after its script ran holds the table rows
and the drawn charts, and the page fetches nothing (a probe lists every resource the page loaded; a control page
with an external image proves the probe sees them)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from tiny_run import TINY_RUN  # perf/tests/tiny_run.py (pytest puts this folder on sys.path)
from typer.testing import CliRunner

from cbbench.perf.cli import app
from cbbench.perf.report.axis_scale import LOG_SPREAD, Axis, choose_axis
from cbbench.perf.report.html import latency_values, load_run, render_html
from cbbench.perf.report.plot_data import plain_number
from cbbench.perf.report.timeline_svg import KINDS, LEGEND_BASE, cell_fill, palette, request_rgb
from cbbench.perf.results.run_json import read_run

TINY = TINY_RUN + ["--peers", "none", "--batching", "continuous,static"]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--virtual-time-budget=3000",
]
CHROMIUM_TIMEOUT_S = 120
PROBE = """<script>window.addEventListener("load", () => setTimeout(() => {
  const p = document.createElement("pre"); p.id = "probe-resources";
  p.textContent = JSON.stringify(performance.getEntriesByType("resource").map(e => e.name));
  document.body.appendChild(p); }, 200));</script>"""


@pytest.fixture(scope="module")
def run_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = CliRunner().invoke(app, ["perf", *TINY, "--result-dir", str(out)])
    assert res.exit_code == 0, res.output
    (js,) = out.glob("*.json")
    page = out / "report.html"
    res = CliRunner().invoke(app, ["report", str(js), "-o", str(page)])
    assert res.exit_code == 0, res.output
    return js, page


class Dom(HTMLParser):
    """Elements as (tag, attrs, text) with the text directly inside them; script bodies are not elements."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict, list[str]]] = []
        self._stack: list[int] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), []))
        if tag not in ("img", "br", "meta", "rect", "line", "path", "input"):
            self._stack.append(len(self.elements) - 1)

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), []))

    def handle_endtag(self, tag):
        while self._stack and self.elements[self._stack[-1]][0] != tag:
            self._stack.pop()
        if self._stack:
            self._stack.pop()

    def handle_data(self, data):
        if self._stack:
            self.elements[self._stack[-1]][2].append(data)

    def find(self, tag=None, **attrs):
        return [
            e
            for e in self.elements
            if (tag is None or e[0] == tag)
            and all(e[1].get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())
        ]


def _rows(dom: Dom, table: str = "results") -> list[list[str]]:
    """A table's body rows (the results table's unless named), as cell texts (tbody tr td, in order)."""
    cells, rows, inside = [], [], False
    for tag, attrs, text in [*dom.elements, ("table", {}, [])]:  # a sentinel table closes the last row
        if tag in ("tr", "table") and inside and cells:
            rows.append(cells)
            cells = []
        if tag == "table":
            inside = attrs.get("id") == table
        elif inside and tag == "td":
            cells.append("".join(text).strip())
    return rows


def test_page_is_self_contained(run_page):
    _, page = run_page
    text = page.read_text()
    assert not re.search(r"https?://", text), "the page names a URL"
    assert "<link" not in text and "@import" not in text and "url(" not in text
    dom = Dom(text)
    srcs = [e[1]["src"] for e in dom.elements if "src" in e[1]]
    assert all(s.startswith("data:image/png;base64,") for s in srcs)  # the timeline is inline SVG, not an image
    assert dom.find("svg", class_="timeline-svg")


def test_page_content_matches_the_run(run_page):
    js, page = run_page
    doc = load_run(js)
    dom = Dom(page.read_text())
    assert [r[:2] for r in _rows(dom)] == [["refengine", "continuous"], ["refengine", "static"]]
    headers = ["".join(e[2]).strip() for e in dom.find("th")]
    assert "out tok/s" in headers and "slot waste" in headers
    assert "cont ÷ this" not in headers  # no peer ran: the empty column is left out
    data = json.loads(dom.find("script", id="cdf-data")[0][2][0])
    label = next(k for k in doc["records"] if "/continuous/" in k)
    ttft, itl = latency_values(doc["records"][label])
    series = next(s for s in data["ttft"]["series"] if s["name"] == "refengine continuous")
    assert series["x"] == pytest.approx(sorted(ttft), abs=1e-3) and series["y"][-1] == 1.0
    assert len(next(s for s in data["itl"]["series"] if s["name"] == "refengine continuous")["x"]) == len(itl) == 9
    (cmd,) = dom.find("pre", id="command")  # the command that made the run, as the CSV keeps it
    assert "".join(cmd[2]) == doc["rows"][0]["command"] and "perf" in doc["rows"][0]["command"]
    env_text = " ".join("".join(e[2]) for e in dom.find("td"))
    assert doc["environment"]["git_sha"] in env_text and doc["environment"]["torch_version"] in env_text
    assert len(dom.find("svg", class_="timeline-svg")) == 2  # one per batching mode


def test_timeline_colours_match_its_legend_and_name_requests(run_page):
    js, page = run_page
    dom = Dom(page.read_text())
    legend = {e[1]["data-kind"]: e[1]["style"].removeprefix("background:") for e in dom.find("span", class_="swatch")}
    assert legend == {k: cell_fill(LEGEND_BASE, k) for k in KINDS}
    rects = dom.find("rect")
    titles = {"".join(e[2]) for e in dom.find("title")}
    colours = palette()
    kinds = {r[1]["data-kind"] for r in rects}
    assert {"prefill", "decode"} <= kinds <= set(legend)
    for _, a, _ in rects:
        assert a["fill"] == cell_fill(request_rgb(a["data-request"], colours), a["data-kind"])
        assert any(t.startswith(f"request {a['data-request']}: {KINDS[a['data-kind']][1]}") for t in titles)
    assert {r[1]["fill"] for r in rects if r[1]["data-kind"] == "held"} <= {legend["held"]}
    assert {r[1]["data-request"] for r in rects} == {"0", "1", "2"}


def test_one_slot_use_figure_and_the_resolved_configuration(run_page):
    js, page = run_page
    doc = load_run(js)
    dom = Dom(page.read_text())
    headers = ["".join(e[2]).strip() for e in dom.find("th")]
    util = {row["batching"]: f"slot util {float(row['mean_slot_utilisation']):.0%}" for row in doc["rows"]}
    captions = ["".join(e[2]) for e in dom.find("figcaption")]
    assert captions == [
        f"refengine {m}: {len(doc['steps'][k])} steps, {util[m]}"
        for m, k in zip(("continuous", "static"), doc["steps"])
    ]
    col = headers.index("slot util")
    assert [r[col] for r in _rows(dom)] == [util[m].removeprefix("slot util ") for m in ("continuous", "static")]
    assert "peak KV" in headers and doc["rows"][0]["peak_kv_usage"] > 0  # shown because the rows have it
    start = next(i for i, e in enumerate(dom.elements) if e[0] == "table" and e[1].get("id") == "config")
    cfg_headers = ["".join(e[2]).strip() for e in dom.elements[start:] if e[0] == "th"]
    assert "num_gpu_blocks" in cfg_headers and "cpu_threads" not in cfg_headers  # resolved knobs, not options
    blocks = [r[cfg_headers.index("num_gpu_blocks")] for r in _rows(dom, "config")]
    assert blocks == [str(doc["rows"][0]["num_gpu_blocks"])] * 2 and doc["config"].get("num_gpu_blocks") is None


def test_old_json_without_step_ids_still_renders(run_page):
    js, _ = run_page
    doc = read_run(js)
    for steps in doc["steps"].values():
        for s in steps:
            for k in ("scheduled_req_ids", "running_req_ids", "prefill_req_ids", "batch_id"):
                s.pop(k)
    text = render_html(doc)
    assert '<svg class="timeline-svg"' not in text and "no per-step request ids" in text


def test_bad_json_is_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"rows": 3}')
    res = CliRunner().invoke(app, ["report", str(bad)])
    assert res.exit_code == 2 and "not a cbbench perf run JSON" in res.output
    assert len(res.output.strip().splitlines()) == 1


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _browse(page: Path, *args: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run(
            [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
            capture_output=True,
            text=True,
            timeout=CHROMIUM_TIMEOUT_S,
        )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


needs_chromium = pytest.mark.skipif(
    _chromium() is None,
    reason="no chromium binary found (Debian: apt-get install -y "
    "chromium); the headless-browser check of `cbbench report` needs one",
)


@needs_chromium
def test_headless_chromium_draws_the_page_and_fetches_nothing(run_page, tmp_path):
    _, page = run_page
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = Dom(_browse(probed, "--dump-dom"))
    assert dom.find("body")[0][1].get("data-charts-drawn") == "yes"  # the script ran to its end
    for chart in ("ttft-cdf", "itl-cdf"):
        (div,) = dom.find("div", id=chart)
        assert div[1].get("data-rendered") == "2"
    paths = dom.find("path", class_="cdf-line")
    assert sorted(p[1]["data-series"] for p in paths) == ["refengine continuous"] * 2 + ["refengine static"] * 2
    assert all(p[1]["d"].count("L") >= 3 for p in paths)  # 3 requests: at least 3 steps each
    assert len(_rows(dom)) == 2
    assert len(dom.find("svg", class_="timeline-svg")) == 2  # the timelines survive the script
    assert {r[1]["data-request"] for r in dom.find("rect") if "data-request" in r[1]} == {"0", "1", "2"}
    (probe,) = dom.find("pre", id="probe-resources")
    assert json.loads("".join(probe[2])) == []  # no resource was fetched


@needs_chromium
def test_the_probe_sees_external_resources(run_page, tmp_path):
    """Control: the same probe on a page with an external image and style sheet lists both."""
    _, page = run_page
    bad = tmp_path / "bad.html"
    bad.write_text(
        page.read_text().replace(
            "</body>",
            '<img src="http://127.0.0.1:9/x.png"><link rel="stylesheet" href="http://127.0.0.1:9/s.css">'
            + PROBE
            + "</body>",
        )
    )
    (probe,) = Dom(_browse(bad, "--dump-dom")).find("pre", id="probe-resources")
    assert sorted(json.loads("".join(probe[2]))) == ["http://127.0.0.1:9/s.css", "http://127.0.0.1:9/x.png"]


@needs_chromium
def test_headless_screenshot(run_page, tmp_path):
    import matplotlib.image as mpimg

    _, page = run_page
    shot = tmp_path / "shot.png"
    _browse(page, f"--screenshot={shot}", "--window-size=1300,1600")
    img = mpimg.imread(shot)
    assert img.shape[:2] == (1600, 1300) and img[..., :3].std() > 0.05


# the README's simulated run made small: `none` serves one request at a time, so its TTFT spreads decades past the
# other modes' (a simulated run: no model is loaded, the numbers repeat to the digit)
SIM_RUN = ["--device", "sim:h200", "--workload", "sharegpt", "--num-prompts", "16", "--max-num-seqs", "4"]
SIM_RUN += ["--batching", "continuous,static,none", "--peers", "none", "--executor", "serial", "--quiet"]
VISIBLE_SHARE = 0.1  # a curve spans at least a tenth of its chart's x axis (53 of the 528 px of the plot area)


@pytest.fixture(scope="module")
def sim_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim-report")
    res = CliRunner().invoke(app, ["perf", *SIM_RUN, "--result-dir", str(out)])
    assert res.exit_code == 0, res.output
    (js,) = out.glob("*.json")
    page = out / "report.html"
    res = CliRunner().invoke(app, ["report", str(js), "-o", str(page)])
    assert res.exit_code == 0, res.output
    return page


def _chart_data(page_text: str) -> dict:
    return json.loads(Dom(page_text).find("script", id="cdf-data")[0][2][0])


def test_the_simulated_runs_ttft_gets_a_log_axis_that_shows_every_mode(sim_page):
    data = _chart_data(sim_page.read_text())
    ttft = data["ttft"]
    axis = Axis(**{k: tuple(v) if isinstance(v, list) else v for k, v in ttft["axis"].items()})
    xs = [x for s in ttft["series"] for x in s["x"]]
    assert axis.scale == "log" and max(xs) / min(xs) > LOG_SPREAD and ttft["xlabel"] == "TTFT (ms, log scale)"
    assert [s["name"] for s in ttft["series"]] == ["refengine continuous", "refengine static", "refengine none"]
    for s in ttft["series"]:
        assert axis.lo <= min(s["x"]) and max(s["x"]) <= axis.hi
        assert axis.position(max(s["x"])) - axis.position(min(s["x"])) >= VISIBLE_SHARE, s["name"]
    itl = [x for s in data["itl"]["series"] for x in s["x"]]
    assert data["itl"]["axis"] == choose_axis(itl).to_json()  # the same rule, whichever scale it gives


def _chart_svg(dumped: str, chart_id: str) -> tuple[dict, Dom]:
    """A drawn chart's div attributes and its contents (from Chromium's DOM dump)."""
    m = re.search(rf'<div class="chart" id="{chart_id}"([^>]*)>(.*?)</div>', dumped, re.S)
    assert m, chart_id
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1))), Dom(m.group(2))


def _path_xs(d: str) -> list[float]:
    return [float(x) for x in re.findall(r"[ML](-?[\d.]+),", d)]


@needs_chromium
def test_headless_chromium_draws_each_curve_where_the_axis_puts_it(sim_page):
    """The page's script draws the axis the data names: a log TTFT axis labelled at the powers of ten, every curve
    inside the plot area and as wide there as axis_scale.py's position says (so the script's log mapping is the
    rule's), each spanning a visible share."""
    data = _chart_data(sim_page.read_text())
    dumped = _browse(sim_page, "--dump-dom")
    for chart_id, key in (("ttft-cdf", "ttft"), ("itl-cdf", "itl")):
        attrs, dom = _chart_svg(dumped, chart_id)
        spec = data[key]["axis"]
        axis = Axis(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})
        assert attrs["data-scale"] == spec["scale"] and attrs["data-rendered"] == "3"
        (svg,) = dom.find("svg")
        assert svg[1]["data-scale"] == spec["scale"]
        labels = {"".join(e[2]) for e in dom.find("text")}
        assert {plain_number(t) for t in axis.ticks} <= labels
        axis_line = next(e for e in dom.elements if e[0] == "line" and "class" not in e[1])  # the x axis, in g.axis
        left, right = float(axis_line[1]["x1"]), float(axis_line[1]["x2"])
        paths = {p[1]["data-series"]: _path_xs(p[1]["d"]) for p in dom.find("path", class_="cdf-line")}
        for s in data[key]["series"]:
            px = paths[s["name"]]
            assert left - 0.5 <= min(px) and max(px) <= right + 0.5
            want = axis.position(max(s["x"])) - axis.position(min(s["x"]))
            assert (max(px) - min(px)) / (right - left) == pytest.approx(want, abs=0.005), s["name"]
            if key == "ttft":
                assert want >= VISIBLE_SHARE, s["name"]
    assert _chart_svg(dumped, "ttft-cdf")[0]["data-scale"] == "log"


def test_rate_sweep_gets_a_latency_throughput_chart(run_page, tmp_path):
    import base64
    import io

    import matplotlib.image as mpimg

    assert "latency-throughput-img" not in run_page[1].read_text()  # one rate: nothing to draw against
    args = [*TINY[:-1], "continuous"]  # TINY ends with --batching's value
    res = CliRunner().invoke(app, ["perf", *args, "--request-rate", "50,100", "--result-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (js,) = tmp_path.glob("*.json")
    (img,) = Dom(render_html(load_run(js))).find("img", id="latency-throughput-img")
    png = mpimg.imread(io.BytesIO(base64.b64decode(img[1]["src"].split(",", 1)[1])), format="png")
    assert png.shape[0] > 300 and png[..., :3].std() > 0.05
