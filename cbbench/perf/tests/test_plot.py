"""`cbbench plot`: several CSVs with labels, latency against throughput across request rates, plain tick labels,
min-max error bars from repeats. Checked on the Axes (lines, labels, error bar containers, formatters), not just
on a file existing."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from cbbench.perf.cli import app  # noqa: E402
from cbbench.perf.report.axis_scale import Axis
from cbbench.perf.report.plot import make_figure
from cbbench.perf.report.plot_data import plain_number
from cbbench.perf.results.files import write_csv
from cbbench.perf.results.schema import make_row

RATES = (1.0, 2.0, 4.0, math.inf)
MODES = ("continuous", "static")
# throughputs near a million tok/s: matplotlib's default formatter would write them with an offset (+1e6)
BASE_TP = 1_000_000.0


def _metrics(rate: float, mode: str, rep: int, scale: float) -> dict:
    r = 8.0 if math.isinf(rate) else rate
    tp = BASE_TP + scale * 10 * r + (5 if mode == "continuous" else 0) + rep  # repeats differ by 0, 1, 2
    ttft = scale * (100 + 50 * r) + 10 * rep
    return {
        "output_throughput": tp,
        "request_throughput": tp / 100,
        "mean_ttft_ms": ttft,
        "p99_ttft_ms": 2 * ttft,
        "mean_tpot_ms": 20 + r + rep,
        "p99_tpot_ms": 40 + r,
        "mean_e2el_ms": ttft + 1000,
        "p99_e2el_ms": 2 * ttft + 1000,
    }


def _csv(path, *, scale: float = 1.0, repeats: int = 3, rates=RATES, knob_values=(None,), label: str = "") -> str:
    rows = []
    for rate in rates:
        for mnbt in knob_values:
            for mode in MODES:
                for rep in range(repeats):
                    wl = {"num_prompts": 16, "seed": 0, "request_rate": rate, "burstiness": 1.0}
                    m = _metrics(rate, mode, rep, scale)
                    if mnbt is not None:
                        m["output_throughput"] = 100 + mnbt / 100 + rep
                        m["mean_ttft_ms"] = 10 + mnbt / 10 + rep
                    rows.append(
                        make_row(
                            metrics=m,
                            engine="refengine",
                            batching=mode,
                            repeat=rep,
                            workload=type("W", (), {"name": "fixed", "params": wl})(),
                            config={"max_num_seqs": 4, "max_num_batched_tokens": mnbt},
                            model="tiny-qwen2",
                            device="cpu",
                            git_sha="x",
                            label=label,
                        )
                    )
    write_csv(path, rows)
    return str(path)


@pytest.fixture
def two_csvs(tmp_path):
    return _csv(tmp_path / "base.csv"), _csv(tmp_path / "fast.csv", scale=0.5)


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_latency_against_throughput_across_rates(two_csvs):
    fig, kind = make_figure(two_csvs, labels=["x", "y"])
    try:
        assert kind == "latency"
        axes = fig.axes
        assert [ax.get_ylabel() for ax in axes] == ["TTFT (ms)", "TPOT (ms)", "end-to-end latency (ms)"]
        assert all(ax.get_xlabel() == "output throughput (tok/s)" for ax in axes)
        want = {f"{lab} {mode} {stat}" for lab in "xy" for mode in MODES for stat in ("mean", "p99")}
        assert set(_legend(axes[0])) == want
        ttft = axes[0]
        bars = [c for c in ttft.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == 4  # 2 labels x 2 modes, each with error bars
        # the x mean curve of continuous: one point per rate, in rate order, at the median of the repeats
        bar = next(c for c in bars if c.get_label() == "x continuous mean")
        line = bar.lines[0]
        want_x = [BASE_TP + 10 * (8 if math.isinf(r) else r) + 5 + 1 for r in RATES]
        want_y = [100 + 50 * (8 if math.isinf(r) else r) + 10 for r in RATES]
        np.testing.assert_allclose(line.get_xdata(), want_x)
        np.testing.assert_allclose(line.get_ydata(), want_y)
        # its error bars span min..max of the repeats (10 ms between repeats: -10 / +10 around the median)
        segs = [seg for coll in bar.lines[2] for seg in coll.get_segments()]
        spans = sorted(round(abs(s[1][1] - s[0][1]), 6) for s in segs if s[0][0] == s[1][0])  # vertical segments
        assert spans == [20.0] * len(RATES)
        notes = {t.get_text() for t in ttft.texts}
        assert {"1/s", "2/s", "4/s", "inf"} <= notes
    finally:
        plt.close(fig)


def test_tick_labels_are_plain(two_csvs):
    fig, _ = make_figure(two_csvs)
    try:
        fig.canvas.draw()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                assert axis.get_major_formatter().func is plain_number
                assert axis.get_offset_text().get_text() == ""
                labels = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
                assert labels and not any("e" in s or "×" in s or "$" in s for s in labels), labels
        x_labels = [t.get_text() for t in fig.axes[0].xaxis.get_ticklabels() if t.get_text()]
        assert any(int(s) >= BASE_TP for s in x_labels)  # the full number, not an offset from 1e6
    finally:
        plt.close(fig)


def test_labels_default_to_file_stems_or_the_label_column(two_csvs, tmp_path):
    fig, _ = make_figure(two_csvs)
    assert {t.split()[0] for t in _legend(fig.axes[0])} == {"base", "fast"}
    plt.close(fig)
    # CSVs made with `cbbench perf --label`: their label column names the curves
    labelled = [_csv(tmp_path / "a.csv", label="run-A"), _csv(tmp_path / "b.csv", scale=0.5, label="run-B")]
    fig, _ = make_figure(labelled)
    assert {t.split()[0] for t in _legend(fig.axes[0])} == {"run-A", "run-B"}
    plt.close(fig)
    fig, _ = make_figure(labelled, labels=["x", "y"])  # --label wins over the column
    assert {t.split()[0] for t in _legend(fig.axes[0])} == {"x", "y"}
    plt.close(fig)
    with pytest.raises(ValueError, match="label: 1 labels for 2 CSVs"):
        make_figure(two_csvs, labels=["only-one"])


def test_knob_sweep_has_error_bars_and_plain_log_ticks(tmp_path):
    csv = _csv(tmp_path / "sweep.csv", rates=(math.inf,), knob_values=(512, 2048, 8192))
    fig, kind = make_figure([csv], knob="max_num_batched_tokens")
    try:
        assert kind == "sweep"
        ax_t, ax_p = fig.axes
        assert ax_t.get_xscale() == "log"
        assert sum(isinstance(c, ErrorbarContainer) for c in ax_p.containers) == len(MODES)
        line = next(c for c in ax_p.containers if c.get_label() == "continuous").lines[0]
        np.testing.assert_allclose(line.get_xdata(), [512, 2048, 8192])
        np.testing.assert_allclose(line.get_ydata(), [100 + v / 100 + 1 for v in (512, 2048, 8192)])
        fig.canvas.draw()
        ticks = [t.get_text() for t in ax_t.xaxis.get_ticklabels() if t.get_text()]
        assert {"512", "2048", "8192"} <= set(ticks)  # not 2^9, 2^11, 2^13
    finally:
        plt.close(fig)


def test_a_latency_axis_over_two_decades_is_log_so_both_csvs_show(tmp_path):
    """The report's axis rule (axis_scale.py) in `cbbench plot`: a CSV a thousand times slower than the other puts
    TTFT and end-to-end latency (150 ms to a million) on log axes from a round value past each end, with a label per
    decade, so the fast CSV's curve spans a visible share; TPOT (20 to 29 ms) and the throughputs stay linear."""
    fast, slow = _csv(tmp_path / "fast.csv"), _csv(tmp_path / "slow.csv", scale=1000.0)
    fig, _ = make_figure([fast, slow], labels=["fast", "slow"])
    try:
        ttft, tpot, e2el = fig.axes
        assert [ax.get_yscale() for ax in fig.axes] == ["log", "linear", "log"]
        assert [ax.get_xscale() for ax in fig.axes] == ["linear"] * 3
        assert ttft.get_ylim() == (100.0, 2_000_000.0)  # 150 ms (fast, rate 1, repeat 0) to 1000020 (slow p99, inf)
        assert list(ttft.get_yticks()) == [100.0, 1000.0, 10000.0, 100000.0, 1000000.0]
        fig.canvas.draw()
        assert [t.get_text() for t in ttft.yaxis.get_ticklabels()] == ["100", "1000", "10000", "100000", "1000000"]
        bars = next(c for c in ttft.containers if c.get_label() == "fast continuous mean")
        top = max(line.get_ydata().max() for line in ttft.get_lines() if line.get_label().startswith("fast"))
        low = bars.lines[0].get_ydata().min()
        axis = Axis("log", *ttft.get_ylim(), ())
        assert axis.position(top) - axis.position(low) >= 0.1  # on a linear axis to 2e6: under 0.1%
    finally:
        plt.close(fig)


def test_single_runs_have_no_error_bars(tmp_path):
    csv = _csv(tmp_path / "once.csv", repeats=1)
    fig, _ = make_figure([csv])
    try:
        assert not any(isinstance(c, ErrorbarContainer) for ax in fig.axes for c in ax.containers)
        assert len(fig.axes[0].get_lines()) == 2 * len(MODES)  # mean + p99 per mode
    finally:
        plt.close(fig)


def test_cli_writes_a_readable_png_into_a_folder(two_csvs, tmp_path):
    out_dir = tmp_path / "plots"
    out_dir.mkdir()
    res = CliRunner().invoke(app, ["plot", *two_csvs, "--label", "x", "--label", "y", "--out", str(out_dir)])
    assert res.exit_code == 0, res.output
    png = out_dir / "base.latency-throughput.png"
    assert png.is_file() and not (tmp_path / "plots.png").exists()
    img = mpimg.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 1000
    assert img[..., :3].std() > 0.05  # not a blank canvas


def test_cli_bad_input_is_one_line(two_csvs):
    res = CliRunner().invoke(app, ["plot", *two_csvs, "--label", "x"])
    assert res.exit_code == 2
    assert "label: 1 labels for 2 CSVs" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["plot", two_csvs[0], "--kind", "pie"])
    assert res.exit_code == 2 and "kind" in res.output


def test_plain_number():
    assert [plain_number(v) for v in (16384.0, 0.25, 1e6, 2.5e-5, -3.0)] == [
        "16384",
        "0.25",
        "1000000",
        "0.000025",
        "-3",
    ]
    assert pd.isna(float("nan")) and plain_number(float("nan")) == ""


def test_curves_apart_by_a_workload_param_are_named_by_it(tmp_path):
    """A --max-concurrency sweep at each rate: one curve per concurrency, named by it."""
    rows = []
    for conc in (4, 16):
        for rate in (1.0, 2.0):
            wl = {"num_prompts": 16, "seed": 0, "request_rate": rate, "burstiness": 1.0, "max_concurrency": conc}
            rows.append(
                make_row(
                    metrics=_metrics(rate, "continuous", 0, conc),
                    engine="refengine",
                    batching="continuous",
                    workload=type("W", (), {"name": "fixed", "params": wl})(),
                    config={"max_num_seqs": 4},
                    model="tiny-qwen2",
                    device="cpu",
                    git_sha="x",
                )
            )
    write_csv(tmp_path / "conc.csv", rows)
    fig, kind = make_figure([tmp_path / "conc.csv"])
    try:
        assert kind == "latency"
        assert set(_legend(fig.axes[0])) == {
            f"continuous max_concurrency={c} {s}" for c in (4, 16) for s in ("mean", "p99")
        }
    finally:
        plt.close(fig)


def test_not_a_sweep_is_one_line_exit_2(tmp_path):
    """Every row at one max_num_batched_tokens and one rate: no x to draw against, so say so."""
    flat = _csv(tmp_path / "flat.csv", rates=(math.inf,), knob_values=(1024,))
    res = CliRunner().invoke(app, ["plot", flat, "--out", str(tmp_path / "x.png")])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1
    assert "not a sweep (every row has max_num_batched_tokens=1024)" in res.output
    assert not (tmp_path / "x.png").exists()


def test_peers_without_the_knob_are_drawn_not_dropped(tmp_path):
    csv = tmp_path / "peers.csv"
    _csv(csv, rates=(math.inf,), knob_values=(512, 2048), repeats=1)
    rows = pd.read_csv(csv).to_dict("records")
    peer = make_row(
        metrics=_metrics(math.inf, "static", 0, 1.0),
        engine="hf-static",
        batching=None,
        repeat=0,
        workload=type("W", (), {"name": "fixed", "params": {"num_prompts": 16, "seed": 0}})(),
        config={"max_num_seqs": 4},
        model="tiny-qwen2",
        device="cpu",
        git_sha="x",
    )
    write_csv(csv, [*rows, peer])
    fig, kind = make_figure([csv], labels=["mine"])
    try:
        assert kind == "sweep"
        names = _legend(fig.axes[0])
        assert "mine hf-static (no max_num_batched_tokens)" in names, names
        assert not any("nan" in n for n in names), names
        assert {"mine continuous mean", "mine static mean"} <= set(names)  # --label names a single CSV's curves
    finally:
        plt.close(fig)


def test_out_with_a_slash_writes_into_a_new_folder(two_csvs, tmp_path):
    res = CliRunner().invoke(app, ["plot", *two_csvs, "--out", f"{tmp_path / 'new'}/"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "new" / "base.latency-throughput.png").is_file()
