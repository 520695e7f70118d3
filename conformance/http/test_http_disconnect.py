"""A client that disconnects frees its capacity. Black-box: after NUM_STREAMS long streams are opened, read for one
chunk and closed (or as many non-streaming requests are sent and given up on), a new short request completes, and
the streams given up on were stopped, not run to their end. (The suite's own server has exactly NUM_STREAMS slots, so
streams that kept running would hold them all and the new request would wait for them.)

How "stopped" is told, without timing the machine: where the server exports vLLM's counters, by a count: the tokens
it generated from the first long request to the new request's answer are far fewer than the streams would have run
to (NUM_STREAMS x LONG_MAX_TOKENS), and its running-requests and KV-usage gauges fall back to zero. A server without
/metrics can only be timed: its new request must answer within NO_METRICS_DEADLINE_S (a leaked stream runs about
100 s here), the one wall-clock bound, which the suite's own server never reaches."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from conformance.http.client import REQUEST_TIMEOUT_S, Server

NUM_STREAMS = 32
LONG_MAX_TOKENS = 1024  # at ~0.1 s per 32-wide CPU step, leaked streams would run ~100 s
# Leaked streams would generate NUM_STREAMS x LONG_MAX_TOKENS tokens before the new request is served; stopped ones
# a few steps' worth each (one chunk read, or HANG_UP_AFTER_S of steps). Half the leaked total tells them apart at any
# machine speed: both counts are of engine steps, not seconds.
LEAKED_TOKENS_SHOWN = NUM_STREAMS * LONG_MAX_TOKENS // 2
NO_METRICS_DEADLINE_S = 30.0  # only for a server without /metrics: a 8-token request alone takes under 2 s here
HANG_GUARD_S = (
    300.0  # a wait no load reaches (a server that never answers fails here; how fast it answers is not checked)
)
HANG_UP_AFTER_S = 3.0  # long enough for the requests to be admitted, far shorter than they take
POLL_S = 0.5


@pytest.fixture(scope="module")
def srv(server: Server) -> Server:
    return server


async def _open_read_one_close(srv: Server) -> int:
    """Open the streams, read each one's first data chunk, then hang up on all of them; returns chunks read."""
    limits = httpx.Limits(max_connections=NUM_STREAMS + 4)
    read = 0
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=REQUEST_TIMEOUT_S, limits=limits) as http:

        async def one(i: int) -> int:
            body = srv.body(
                prompt=f"Tell me a very long story, number {i}", max_tokens=LONG_MAX_TOKENS, **srv.greedy, stream=True
            )
            async with http.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        return 1  # leaving the block closes the connection mid-stream
            return 0

        read = sum(await asyncio.gather(*(one(i) for i in range(NUM_STREAMS))))
    return read


async def _send_and_hang_up(srv: Server) -> int:
    """Non-streaming: send the long requests and give up on each after HANG_UP_AFTER_S; returns how many timed out."""
    limits = httpx.Limits(max_connections=NUM_STREAMS + 4)
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=HANG_UP_AFTER_S, limits=limits) as http:

        async def one(i: int) -> int:
            body = srv.body(prompt=f"Write a very long essay, number {i}", max_tokens=LONG_MAX_TOKENS, **srv.greedy)
            try:
                await http.post("/v1/completions", json=body)
            except httpx.TimeoutException:
                return 1
            return 0

        return sum(await asyncio.gather(*(one(i) for i in range(NUM_STREAMS))))


def _generated(srv: Server) -> float | None:
    m = srv.metrics()
    return None if m is None or "vllm:generation_tokens_total" not in m else m["vllm:generation_tokens_total"]


def _gauges(srv: Server) -> dict[str, float]:
    m = srv.metrics() or {}
    return {k: m[k] for k in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc") if k in m}


def _wait_gauges_zero(srv: Server) -> dict[str, float]:
    """The gauges once they read zero, or as they stand after the hang guard."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        gauges = _gauges(srv)
        if all(v == 0 for v in gauges.values()) or time.monotonic() > deadline:
            return gauges
        time.sleep(POLL_S)


def _check_capacity_is_back(srv: Server, generated_before: float | None) -> None:
    body = srv.body(prompt="Are you still there?", max_tokens=8, **srv.greedy)
    counted = generated_before is not None
    r = srv.http.post("/v1/completions", json=body, timeout=HANG_GUARD_S if counted else NO_METRICS_DEADLINE_S)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    if not counted:
        return
    generated = (_generated(srv) or 0.0) - generated_before
    assert generated < LEAKED_TOKENS_SHOWN, (
        f"{generated:.0f} tokens generated before the new request's answer: the {NUM_STREAMS} streams given up on "
        f"ran on (stopped ones make a few each; run to their end, {NUM_STREAMS * LONG_MAX_TOKENS})"
    )
    gauges = _wait_gauges_zero(srv)
    assert all(v == 0 for v in gauges.values()), f"after the disconnects: {gauges}"


def test_disconnect_frees_capacity(srv):
    before = _generated(srv)
    assert asyncio.run(_open_read_one_close(srv)) == NUM_STREAMS
    _check_capacity_is_back(srv, before)


def test_hanging_up_on_a_non_streaming_request_frees_capacity(srv):
    before = _generated(srv)
    assert asyncio.run(_send_and_hang_up(srv)) == NUM_STREAMS, "some long requests finished before the hang-up"
    _check_capacity_is_back(srv, before)


def test_metrics_use_vllm_names(srv):
    m = srv.metrics()
    if m is None:
        pytest.skip("the server has no /metrics")
    if not any(k.startswith("vllm:") for k in m):
        pytest.skip("the server's /metrics has no vllm: metrics")
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert name in m, f"/metrics lacks {name}"
    before = m["vllm:generation_tokens_total"], m["vllm:e2e_request_latency_seconds_count"]
    srv.complete(prompt="count me", max_tokens=5, **srv.greedy)
    after = srv.metrics()
    assert after["vllm:generation_tokens_total"] - before[0] >= 5
    assert after["vllm:e2e_request_latency_seconds_count"] - before[1] >= 1
