"""The /metrics sampler's pace: fast until the server is seen at work, so that a short run's KV peak is seen.

Driven on a fake clock (the sampler's waits advance it; no real time passes), against a fake /metrics whose
gauges depend on that clock: what these tests check is which moments the sampler looks at, deterministically.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from cbbench.perf.backends import server_metrics as sm_mod
from cbbench.perf.backends.server_metrics import FAST_SAMPLING_S, FIRST_SAMPLE_S, SAMPLE_PERIOD_S, ServerMetrics

IDLE = "vllm:kv_cache_usage_perc 0.0\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
BUSY = "vllm:kv_cache_usage_perc 0.4\nvllm:num_requests_running 64\nvllm:num_requests_waiting 0\n"


class FakeServer:
    """A clock the sampler's waits advance, and a /metrics that is busy on [busy_from, busy_until)."""

    def __init__(self, busy_from: float, busy_until: float, done_at: float, idle_text: str = IDLE) -> None:
        self.now, self.busy, self.done_at, self.idle_text = 0.0, (busy_from, busy_until), done_at, idle_text
        self.waits: list[float] = []
        self.done = asyncio.Event()

    async def wait_for(self, aw, timeout: float) -> None:
        aw.close()  # the sampler's `done.wait()`, never awaited here
        self.waits.append(timeout)
        self.now += timeout
        if self.now >= self.done_at:  # the replay ended during this wait
            self.done.set()
            return
        raise TimeoutError

    async def scrape(self, session, url):
        lo, hi = self.busy
        return sm_mod.parse_prometheus(BUSY if lo <= self.now < hi else self.idle_text)

    def run(self, monkeypatch: pytest.MonkeyPatch) -> ServerMetrics:
        monkeypatch.setattr(sm_mod, "asyncio", types.SimpleNamespace(wait_for=self.wait_for))
        monkeypatch.setattr(sm_mod, "time", types.SimpleNamespace(perf_counter=lambda: self.now))
        monkeypatch.setattr(sm_mod, "scrape", self.scrape)
        m = ServerMetrics("http://fake/metrics")
        m.before = m.after = sm_mod.parse_prometheus(IDLE)
        asyncio.run(m.sample_until(None, self.done))  # type: ignore[arg-type]
        return m


def test_a_short_run_that_starts_late_still_has_its_kv_peak_seen(monkeypatch):
    # the server admits the first request 80 ms in and is done by 300 ms: one sample at 50 ms and the next at
    # 550 ms (the sampler's pace before this test) both read an idle engine and report a peak of 0
    fake = FakeServer(busy_from=0.08, busy_until=0.30, done_at=0.35)
    m = fake.run(monkeypatch)
    assert m.results()["peak_kv_usage"] == pytest.approx(0.4)
    assert fake.waits[:3] == [FIRST_SAMPLE_S, FIRST_SAMPLE_S, SAMPLE_PERIOD_S]  # slow once the work was seen


def test_a_server_never_seen_at_work_is_sampled_fast_only_for_a_while(monkeypatch):
    fake = FakeServer(busy_from=99.0, busy_until=99.0, done_at=5.0)
    fake.run(monkeypatch)
    fast = [w for w in fake.waits if w == FIRST_SAMPLE_S]
    assert len(fast) == pytest.approx(FAST_SAMPLING_S / FIRST_SAMPLE_S, abs=1)
    assert fake.waits[len(fast) :] and set(fake.waits[len(fast) :]) == {SAMPLE_PERIOD_S}


def test_a_server_without_the_gauges_is_never_seen_at_work(monkeypatch):
    # /metrics answers but names none of the gauges: nothing reads as work, so the fast pace ends only by time
    fake = FakeServer(busy_from=99.0, busy_until=99.0, done_at=0.18, idle_text="other_metric 1\n")
    m = fake.run(monkeypatch)
    assert not m.busy_seen and fake.waits == [FIRST_SAMPLE_S] * 4
