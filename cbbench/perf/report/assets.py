"""The CSS and JavaScript inlined into `cbbench report`'s page (no external file, font or URL of any kind).

The script draws each CDF chart as inline SVG from the JSON embedded in the page (`<script id="cdf-data">`), built
as markup through innerHTML, so the page never names an SVG namespace URL. Each drawn chart gets
`data-rendered="<number of series>"` and `data-scale="linear|log"` (the x axis axis_scale.py chose), which the
headless-browser test reads from the DOM.
"""

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1280px;
       padding: 0 16px; color: #1d232a; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
.sub { color: #555; margin: 0 0 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e6e6e6; text-align: right; white-space: nowrap; }
th { background: #f4f6f8; font-weight: 600; white-space: normal; vertical-align: bottom; }
.scroll { overflow-x: auto; }
td.key, th.key { text-align: left; }
tr:hover td { background: #fafbfc; }
.failed { color: #b00020; }
.notes { color: #333; } .notes li { margin: 2px 0; }
.charts { display: flex; flex-wrap: wrap; gap: 24px; }
.chart { width: 600px; } .chart svg { width: 600px; }
.chart .axis line, .chart .axis path { stroke: #888; } .chart text { font-size: 11px; fill: #333; }
.chart .grid { stroke: #eee; } .chart .grid.minor { stroke: #f6f6f6; } .chart .cdf-line { fill: none; stroke-width: 1.8; }
.timeline img { max-width: 100%; border: 1px solid #eee; }
.timeline figure { margin: 8px 0 14px; } .timeline figcaption { font-size: 12px; color: #333; }
.timeline-svg { border: 1px solid #eee; display: block; }
.legend .swatch { display: inline-block; width: 14px; height: 10px; margin: 0 4px 0 12px; border: 1px solid #bbb; }
table.env td { text-align: left; white-space: normal; } table.env td:first-child { color: #555; }
pre { background: #f6f8fa; padding: 10px; overflow-x: auto; font-size: 12px; }
.empty { color: #777; font-style: italic; }
"""

JS = r"""
(function () {
  const data = JSON.parse(document.getElementById("cdf-data").textContent);
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf"];
  const W = 600, PH = 300, M = {l: 56, r: 16, t: 14, b: 44};  // PH: the plot area's bottom edge + margin
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function plain(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : String(+v.toPrecision(3)); }
  function draw(el, chart) {
    const series = chart.series.filter(s => s.x.length > 0);
    if (!series.length) { el.innerHTML = '<p class="empty">no ' + esc(chart.title) + ' values in this run</p>'; return; }
    // the axis (scale, range, ticks) comes with the data: perf/report/axis_scale.py chooses it for the report and
    // for `cbbench plot` alike; a log axis puts zero and below at its low end
    const ax = chart.axis, x0 = ax.lo, x1 = ax.hi, xt = ax.ticks, log = ax.scale === "log";
    const pos = log ? v => (Math.log10(Math.max(v, x0)) - Math.log10(x0)) / (Math.log10(x1) - Math.log10(x0))
                    : v => (v - x0) / (x1 - x0);
    const rows = Math.ceil(series.length / 2), H = PH + 10 + 16 * rows;  // a two-column legend below the axes
    const X = v => M.l + pos(v) * (W - M.l - M.r);
    const Y = p => PH - M.b - p * (PH - M.t - M.b);
    let svg = '<svg viewBox="0 0 ' + W + ' ' + H + '" height="' + H + '" role="img" aria-label="' +
              esc(chart.title) + '" data-scale="' + ax.scale + '">';
    for (const t of ax.minor) {
      svg += '<line class="grid minor" x1="' + X(t) + '" x2="' + X(t) + '" y1="' + Y(0) + '" y2="' + Y(1) + '"/>';
    }
    for (const t of xt) {
      svg += '<line class="grid" x1="' + X(t) + '" x2="' + X(t) + '" y1="' + Y(0) + '" y2="' + Y(1) + '"/>';
      svg += '<text x="' + X(t) + '" y="' + (Y(0) + 16) + '" text-anchor="middle">' + plain(t) + '</text>';
    }
    for (const p of [0, 0.25, 0.5, 0.75, 0.9, 1]) {
      svg += '<line class="grid" x1="' + X(x0) + '" x2="' + X(x1) + '" y1="' + Y(p) + '" y2="' + Y(p) + '"/>';
      svg += '<text x="' + (M.l - 6) + '" y="' + (Y(p) + 4) + '" text-anchor="end">' + p + '</text>';
    }
    svg += '<g class="axis"><line x1="' + X(x0) + '" x2="' + X(x1) + '" y1="' + Y(0) + '" y2="' + Y(0) + '"/>' +
           '<line x1="' + X(x0) + '" x2="' + X(x0) + '" y1="' + Y(0) + '" y2="' + Y(1) + '"/></g>';
    svg += '<text x="' + ((W + M.l) / 2) + '" y="' + (PH - 12) + '" text-anchor="middle">' + esc(chart.xlabel) +
           '</text>';
    svg += '<text transform="translate(14,' + ((PH - M.b) / 2) + ') rotate(-90)" text-anchor="middle">fraction of ' +
           esc(chart.unit) + ' at or below</text>';
    series.forEach((s, i) => {
      let d = "M" + X(s.x[0]).toFixed(1) + "," + Y(0).toFixed(1);
      for (let k = 0; k < s.x.length; k++) { d += "L" + X(s.x[k]).toFixed(1) + "," + Y(s.y[k]).toFixed(1); }
      const c = COLORS[i % COLORS.length];
      svg += '<path class="cdf-line" data-series="' + esc(s.name) + '" stroke="' + c + '" d="' + d + '"/>';
      const ly = PH + 14 + 16 * Math.floor(i / 2), lx = M.l + (i % 2) * (W - M.l) / 2;
      svg += '<rect x="' + lx + '" y="' + (ly - 8) + '" width="14" height="3" fill="' + c + '"/>' +
             '<text class="legend" x="' + (lx + 20) + '" y="' + (ly - 3) + '">' + esc(s.name) + '</text>';
    });
    el.innerHTML = svg + '</svg>';
    el.dataset.rendered = String(series.length);
    el.dataset.scale = ax.scale;
  }
  for (const el of document.querySelectorAll("[data-chart]")) { draw(el, data[el.dataset.chart]); }
  document.body.dataset.chartsDrawn = "yes";
})();
"""
