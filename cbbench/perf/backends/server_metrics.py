"""What a client can learn of a server's engine from its vLLM-named Prometheus /metrics.

Scraped once before and once after the measured run (counters are differences), and sampled meanwhile for the KV
usage gauge, whose peak is what the in-process run reports as `peak_kv_usage`: every `FIRST_SAMPLE_S` until a sample
shows the server at work (requests running or waiting, or KV in use) or `FAST_SAMPLING_S` have passed, then every
`SAMPLE_PERIOD_S`. (A sample taken before the server has admitted the first request reads an idle engine; with one
sample at 50 ms and the next at 550 ms, a run shorter than half a second could show a peak of 0.) A server without
/metrics, or without these names, leaves the figures NaN.

| result column         | from                                                                          |
|-----------------------|-------------------------------------------------------------------------------|
| num_preemptions       | vllm:num_preemptions_total (after - before)                                   |
| peak_kv_usage         | max of vllm:kv_cache_usage_perc (vLLM >= 0.10) or vllm:gpu_cache_usage_perc   |
| peak_kv_blocks        | peak_kv_usage x num_gpu_blocks from vllm:cache_config_info, when it has it    |
| prefix_cache_hit_rate | vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total (differences), |
|                       | only where the responses' usage did not report cached tokens                  |

vLLM names its usage gauges "_perc" but exports a fraction in [0, 1]; a value above 1 is read as a percentage.
Series with several label sets (several engines or models) are summed, the KV gauge averaged.

A served simulated GPU's clock (cbbench:sim_*) is kept per scrape too, for sim_time.py to convert the run's times.
Every scrape is also kept as a point of `series` (`SERIES_KEYS`: seconds since the first scrape, KV usage,
vllm:num_requests_running, vllm:num_requests_waiting, preemptions since the first scrape; None for what the server
does not export): the results JSON stores it per run (`server_metrics`) and `cbbench report` draws it.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from cbbench.perf.backends.sim_time import CLOCK, SCALE, WALL

SAMPLE_PERIOD_S = 0.5
FIRST_SAMPLE_S = 0.05  # the period until the server is seen at work, so that even a short run has samples of it
FAST_SAMPLING_S = 2.0  # at most this long at FIRST_SAMPLE_S (scraping costs the server's CPU: ~20 /s, not ~2 /s)
SCRAPE_TIMEOUT_S = 5.0
PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_HITS, PREFIX_QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
CACHE_CONFIG = "vllm:cache_config_info"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
SERIES_KEYS = ("time", "kv_usage", "num_running", "num_waiting", "num_preemptions")

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {metric name: [(labels, value), ...]} (comments and bad lines skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _sum(parsed: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    series = parsed.get(name)
    return sum(v for _, v in series) if series else math.nan


def kv_usage(parsed: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    for name in KV_USAGE:
        series = parsed.get(name)
        if series:
            v = sum(x for _, x in series) / len(series)
            return v / 100.0 if v > 1.0 else v
    return math.nan


def num_gpu_blocks(parsed: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    for labels, _ in parsed.get(CACHE_CONFIG, ()):
        try:
            return float(labels["num_gpu_blocks"])
        except (KeyError, ValueError):
            continue
    return math.nan


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, list[tuple[dict[str, str], float]]] | None:
    """One GET of /metrics; None when the server has none (or it fails): the run goes on without it."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return None
            return parse_prometheus(await resp.text())
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None


@dataclass
class ServerMetrics:
    """Before / after scrapes and the KV usage samples of one run."""

    url: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    kv_samples: list[float] = field(default_factory=list)
    series: list[dict[str, float | None]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    busy_seen: bool = False  # a sample has shown requests running or waiting, or KV in use
    # a served simulated GPU's clock, one point a scrape: (client time, server wall, simulated, scale); sim_time.py
    clock_samples: list[tuple[float, float, float, float]] = field(default_factory=list)

    def next_period(self, elapsed: float) -> float:
        """Seconds to the next sample: FIRST_SAMPLE_S until the server is seen at work or FAST_SAMPLING_S have
        passed since sampling began (`elapsed`), then SAMPLE_PERIOD_S."""
        return SAMPLE_PERIOD_S if self.busy_seen or elapsed >= FAST_SAMPLING_S else FIRST_SAMPLE_S

    def sample(self, parsed: dict[str, Any]) -> None:
        """Keep one scrape taken during the run."""
        self.keep(parsed)
        point = self.series[-1]  # what the server does not export is None there
        self.kv_samples.append(kv_usage(parsed))
        self.busy_seen = self.busy_seen or any((point[k] or 0) > 0 for k in ("kv_usage", "num_running", "num_waiting"))

    def keep(self, parsed: dict[str, Any]) -> None:
        """One scrape as a point of `series` (the first one sets the origin of its time and its preemptions)."""
        now = time.perf_counter()
        if not self.series:
            self.started = now
        first = self.before if self.before is not None else parsed
        clock = [_sum(parsed, name) for name in (WALL, CLOCK, SCALE)]
        if not any(math.isnan(x) for x in clock):
            self.clock_samples.append((now, *clock))  # type: ignore[arg-type]  # (three floats)

        def known(v: float) -> float | None:  # JSON has no NaN: what the server does not export is None
            return None if math.isnan(v) else v

        self.series.append(
            dict(
                zip(
                    SERIES_KEYS,
                    (
                        round(time.perf_counter() - self.started, 4),
                        known(kv_usage(parsed)),
                        known(_sum(parsed, RUNNING)),
                        known(_sum(parsed, WAITING)),
                        known(_sum(parsed, PREEMPTIONS) - _sum(first, PREEMPTIONS)),
                    ),
                )
            )
        )

    async def sample_until(self, session: aiohttp.ClientSession, done: asyncio.Event) -> None:
        """Sample the gauges (at `next_period`'s pace) until `done` is set (only if /metrics answered before)."""
        begun = time.perf_counter()
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), self.next_period(time.perf_counter() - begun))
            except TimeoutError:
                pass
            parsed = await scrape(session, self.url)
            if parsed is not None:
                self.sample(parsed)

    def results(self) -> dict[str, float]:
        """The result columns this server's /metrics fills (NaN for what it does not expose)."""
        nan = math.nan
        out = {"num_preemptions": nan, "peak_kv_usage": nan, "peak_kv_blocks": nan, "server_prefix_hit_rate": nan}
        if self.before is None or self.after is None:
            return out
        b, a = self.before, self.after
        out["num_preemptions"] = _sum(a, PREEMPTIONS) - _sum(b, PREEMPTIONS)
        kv = [x for x in (kv_usage(b), *self.kv_samples, kv_usage(a)) if not math.isnan(x)]
        out["peak_kv_usage"] = max(kv) if kv else nan
        blocks = num_gpu_blocks(a)
        out["peak_kv_blocks"] = round(out["peak_kv_usage"] * blocks) if kv and not math.isnan(blocks) else nan
        queries = _sum(a, PREFIX_QUERIES) - _sum(b, PREFIX_QUERIES)
        if queries > 0:
            out["server_prefix_hit_rate"] = (_sum(a, PREFIX_HITS) - _sum(b, PREFIX_HITS)) / queries
        return out
