"""The perf table fits the terminal: no line wider than COLUMNS, empty columns gone, least important columns dropped
first on a narrow terminal (and named), goodput shown only with --goodput, the request rate in the title."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from cbbench.perf.report.table import COLUMNS, PREFIX_HIT_SHOWN, print_perf_table
from cbbench.workloads.workload import Workload, WorkloadRequest

NARROW, WIDE = 80, 200


def _row(tp: float, **extra) -> dict:
    row = {
        "output_throughput": tp,
        "total_token_throughput": 3 * tp,
        "request_throughput": tp / 50,
        "mean_ttft_ms": 3000.0,
        "p99_ttft_ms": 6000.0,
        "mean_tpot_ms": 31.5,
        "mean_itl_ms": 30.2,
        "num_preemptions": 0,
        "peak_kv_blocks": None,
        "mean_slot_utilisation": 0.87,
        "slot_waste": math.nan,
        "request_goodput": tp / 100,
    }
    row.update(extra)
    return row


def _entries(with_peer: bool = False) -> list:
    e = [
        (("refengine", "continuous", "-"), _row(110.2), None),
        (("refengine", "sequence", "-"), _row(123.4), None),
        (("refengine", "static", "-"), _row(99.9, slot_waste=1.23), None),
    ]
    if with_peer:
        e.append((("hf-static", "static", "-"), _row(76.0, slot_waste=1.23), None))
    return e


def _workload(**params) -> Workload:
    reqs = [WorkloadRequest([1] * 100, 50), WorkloadRequest([1] * 120, 60)]
    return Workload("sharegpt", {"request_rate": math.inf, "burstiness": 1.0, **params}, reqs)


def _print(monkeypatch, columns: int | None, entries, workload=None, **kw) -> str:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, color_system=None)  # width from COLUMNS, as in a shell
    print_perf_table(console, entries, workload or _workload(), **kw)
    return buf.getvalue()


def _header_lines(text: str) -> str:
    """The table's header block: from the top rule to the rule under the headers."""
    lines = text.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("┏"))
    end = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("┡"))
    return "\n".join(lines[top:end])


def _shown(text: str, header: str) -> bool:
    """A header is shown when its words appear in order in the header block (it may wrap)."""
    block = " ".join(_header_lines(text).replace("┃", " ").split())
    words = " ".join(_header_lines(text).replace("┃", "\n").split())
    return header in block or all(w in words.split() for w in header.split())


@pytest.mark.parametrize("columns", [NARROW, WIDE])
def test_every_line_fits_the_terminal(monkeypatch, columns):
    out = _print(monkeypatch, columns, _entries(with_peer=True))
    assert max(len(line) for line in out.splitlines()) <= columns
    assert "…" not in out  # nothing was cut short to fit
    for h in ("engine", "batching", "out tok/s"):
        assert _shown(out, h)


def test_narrow_terminal_drops_the_least_important_columns_and_says_so(monkeypatch):
    narrow = _print(monkeypatch, NARROW, _entries(with_peer=True))
    wide = _print(monkeypatch, WIDE, _entries(with_peer=True))
    gone = [h for h, *_ in COLUMNS if _shown(wide, h) and not _shown(narrow, h)]
    assert gone, "an 80-column terminal cannot hold every column"
    dropped = " ".join(narrow.split("too narrow for: ")[-1].split())  # (the note wraps at the terminal's width)
    assert "too narrow for: " in narrow and all(h in dropped for h in gone)
    # what is kept is the most important: out tok/s and the ratio to static outlive ITL and peak KV
    assert _shown(narrow, "÷ static") and _shown(narrow, "out tok/s")
    assert not _shown(narrow, "ITL mean ms")
    assert "too narrow" not in wide


def test_empty_columns_are_left_out(monkeypatch):
    out = _print(monkeypatch, WIDE, _entries())
    assert not _shown(out, "peak KV blk")  # no row has a value
    assert not _shown(out, "cont ÷ this")  # no peer ran
    assert not _shown(out, "knobs")  # nothing swept: every label is "-"
    assert _shown(out, "slot waste")  # static has one
    with_peer = _print(monkeypatch, WIDE, _entries(with_peer=True))
    assert _shown(with_peer, "cont ÷ this")
    assert "1.45x" in with_peer  # 110.2 / 76.0


def test_goodput_only_with_the_option(monkeypatch):
    assert not _shown(_print(monkeypatch, WIDE, _entries()), "goodput req/s")
    out = _print(monkeypatch, WIDE, _entries(), goodput={"ttft": 500.0, "tpot": 50.0})
    assert _shown(out, "goodput req/s")
    assert "1.10" in out  # continuous: 110.2 / 100
    assert "ttft <= 500 ms and tpot <= 50 ms" in out


@pytest.mark.parametrize(
    "params, want",
    [
        ({}, "request rate inf (all at t0)"),
        ({"request_rate": 4.0}, "request rate 4/s (Poisson)"),
        ({"request_rate": 2.5, "burstiness": 0.5}, "request rate 2.5/s (gamma, burstiness 0.5)"),
    ],
)
def test_title_has_the_request_rate(monkeypatch, params, want):
    out = _print(monkeypatch, WIDE, _entries(), workload=_workload(**params))
    assert want in " ".join(out.split())


def test_a_log_keeps_the_whole_table(monkeypatch):
    """No terminal and no COLUMNS (CI): natural width, no column dropped."""
    out = _print(monkeypatch, None, _entries(with_peer=True))
    assert "too narrow" not in out
    assert max(len(line) for line in out.splitlines()) > NARROW
    for h, metric, *_ in COLUMNS:
        # no value: left out; the prefix hit rate is shown only where it is not near zero (its own test)
        if metric not in ("peak_kv_blocks", "peak_kv_usage", "request_goodput", "prefix_cache_hit_rate"):
            assert _shown(out, h), h


@pytest.mark.parametrize("rates, shown", [((0.0, 0.01), False), ((0.0, PREFIX_HIT_SHOWN), True), ((0.9, 0.9), True)])
def test_the_prefix_hit_column_shows_only_a_rate_not_near_zero(monkeypatch, rates, shown):
    entries = [
        (("refengine", "continuous", "-"), _row(110.2, prefix_cache_hit_rate=rates[0]), None),
        (("refengine", "static", "-"), _row(99.9, prefix_cache_hit_rate=rates[1]), None),
    ]
    out = _print(monkeypatch, None, entries)
    assert _shown(out, "prefix hit") == shown, out


def test_failed_run_is_a_row_and_a_line(monkeypatch):
    entries = [*_entries(), (("refengine", "none", "-"), None, "out of memory")]
    out = _print(monkeypatch, NARROW, entries)
    assert "failed" in out and "refengine none failed: out of memory" in " ".join(out.split())


def test_a_long_sweep_label_wraps_instead_of_overflowing(monkeypatch):
    label = "max_num_batched_tokens=8192 long_prefill_token_threshold=2048 enable_prefix_caching=True"
    entries = [(("refengine", mode, label), _row(100.0 + i), None) for i, mode in enumerate(("continuous", "static"))]
    out = _print(monkeypatch, NARROW, entries)
    assert max(len(line) for line in out.splitlines()) <= NARROW
    assert "…" not in out
    flat = " ".join(out.replace("│", " ").split())
    for word in label.split():
        assert word in flat


def test_title_of_a_rate_sweep_lists_the_rates(monkeypatch):
    entries = [
        (("refengine", "continuous", f"request_rate={r}"), _row(100.0, request_rate=r), None)
        for r in (4.0, 1.0, math.inf)
    ]
    out = _print(monkeypatch, WIDE, entries, workload=_workload(request_rate=4.0))
    assert "request rates 1, 4, inf /s" in " ".join(out.split())
