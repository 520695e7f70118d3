"""A served simulated GPU's clock rebuilt from /metrics samples (perf/backends/sim_time.py), against a known
piecewise-linear mapping; and a server's /metrics text read into clock samples."""

from __future__ import annotations

import pytest

from cbbench.perf.backends.server_metrics import ServerMetrics, parse_prometheus
from cbbench.perf.backends.sim_time import SimClock
from cbbench.perf.records import RequestRecord

EXACT = 1e-9  # float rounding only
OFFSET = 7.0  # the client's clock reads this much more than the server's wall clock
# (server wall, scale from then on): the server slowed to 0.2 at wall 11.3, then sped up to 0.5 at 13.9
CHANGES = [(10.0, 1.0), (11.3, 0.2), (13.9, 0.5)]


def true_sim(w: float) -> float:
    """The server's mapping: simulated 0 at wall 10, slope = the scale in force."""
    v = 0.0
    for (wa, r), (wb, _) in zip(CHANGES, [*CHANGES[1:], (float("inf"), 0.0)]):
        v += r * (min(w, wb) - wa)
        if w <= wb:
            return v
    raise AssertionError


def scale_at(w: float) -> float:
    return [r for wa, r in CHANGES if wa <= w][-1]


def samples(walls: list[float], delay: float = 0.0) -> list[tuple[float, float, float, float]]:
    """What perf keeps per scrape: (client time, server wall, simulated, scale); the reply took `delay` to arrive."""
    return [(w + OFFSET + delay, w, true_sim(w), scale_at(w)) for w in walls]


def test_the_mapping_is_rebuilt_exactly_when_each_change_falls_between_two_samples():
    clock = SimClock.from_samples(samples([10.0 + 0.5 * i for i in range(12)]))
    assert clock is not None and clock.exact and clock.offset == pytest.approx(OFFSET, abs=EXACT)
    for w in (10.0, 10.7, 11.3, 11.31, 12.0, 13.89, 13.95, 15.4, 16.0):  # the last is past the last sample
        assert clock.to_sim(w + OFFSET) == pytest.approx(true_sim(w), abs=EXACT), w


def test_a_constant_reply_delay_shifts_every_time_alike_so_durations_keep_none_of_it():
    clock = SimClock.from_samples(samples([10.0 + 0.5 * i for i in range(12)], delay=0.004))
    assert clock is not None
    t1, t2 = 12.0 + OFFSET, 12.6 + OFFSET  # inside one segment of scale 0.2
    assert clock.to_sim(t2) - clock.to_sim(t1) == pytest.approx(0.2 * 0.6, abs=EXACT)


def test_two_changes_between_samples_are_flagged_and_interpolated():
    clock = SimClock.from_samples(samples([10.0, 11.0, 14.5, 15.0]))  # both changes between 11.0 and 14.5
    assert clock is not None and not clock.exact
    assert clock.to_sim(14.5 + OFFSET) == pytest.approx(true_sim(14.5), abs=EXACT)  # the samples themselves hold


def test_a_record_is_converted_field_by_field_and_a_real_time_clock_is_told_apart():
    clock = SimClock.from_samples(samples([12.0, 12.5, 13.0]))  # all at scale 0.2
    assert clock is not None and not clock.real_time
    rec = RequestRecord("0", 4, 3, 12.0 + OFFSET, None, 12.1 + OFFSET, None, 12.3 + OFFSET, None, None, "length")
    rec.chunk_times = [12.1 + OFFSET, 12.2 + OFFSET, 12.3 + OFFSET]
    out = clock.convert(rec)
    assert out.first_token_time - out.arrival_time == pytest.approx(0.2 * 0.1, abs=EXACT)
    assert out.chunk_times == pytest.approx([true_sim(12.1), true_sim(12.2), true_sim(12.3)], abs=EXACT)
    assert out.finish_time == pytest.approx(true_sim(12.3), abs=EXACT) and out.first_scheduled_time is None
    assert clock.mean_scale(12.0 + OFFSET, 13.0 + OFFSET) == pytest.approx(0.2, abs=EXACT)
    assert SimClock.from_samples(samples([10.0, 10.5])).real_time  # type: ignore[union-attr]
    assert SimClock.from_samples([]) is None


def test_server_metrics_keeps_a_clock_sample_per_scrape_that_has_the_gauges():
    sm = ServerMetrics("http://x/metrics")
    text = "cbbench:sim_time_scale 0.25\ncbbench:sim_clock_seconds 3.5\ncbbench:sim_wall_clock_seconds 1234.5\n"
    sm.keep(parse_prometheus(text))
    sm.keep(parse_prometheus("vllm:num_requests_running 2\n"))  # a real server: no clock
    assert [s[1:] for s in sm.clock_samples] == [(1234.5, 3.5, 0.25)]
