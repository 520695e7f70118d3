"""SIGTERM drains `cbbench serve` as vLLM and uvicorn do, checked with real streaming clients against a real server
process: new requests are a 503 at once, the streams in flight that can finish within the grace period end with
their final chunk and [DONE], the rest end with finish_reason "abort", an error event and [DONE]; nothing is a 500
and no connection is cut mid-stream."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from conformance.engine_helpers import TEST_MODEL
from conformance.http.client import free_port, start_process, stop_process, wait_healthy
from conformance.http.conftest import cbbench_command
from refengine.tests.live_server import Events, read_stream
from refengine.tests.waiting import HANG_GUARD_S, wait_for

pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")

# The drain test's grace period: a time scale the test fixes so long that only a hang outlasts it (the short streams
# need SHORT_TOKENS engine steps after SIGTERM: under a second here, seconds on a loaded machine). Nothing is checked
# against it: the short streams finish inside it, then a second SIGTERM (the order of events) ends it and aborts the
# long ones, which the model's 4096 positions bound to LONG_TOKENS steps, 40x the short ones' in the same batch.
# SHORT_TOKENS is long enough that the short streams are still running when SIGTERM is sent: at 12 tokens a quiet
# machine finished them first (a clean clone's CI, 2026-12-03), and the test then checked nothing.
GRACE_S = HANG_GUARD_S
# The grace-expiry test's period: short, since it only bounds from below when the aborts may come (load only makes
# them later); its stream needs LONG_TOKENS steps (~24 s here), far past it on any machine.
EXPIRY_GRACE_S = 1.0
SHORT_TOKENS, LONG_TOKENS = 100, 4000
FIRST_CHUNK_TIMEOUT_S = HANG_GUARD_S  # every stream has started (model load excluded: the server is healthy by then)
EXIT_TIMEOUT_S = HANG_GUARD_S  # a hang guard: the drain, aborts, uvicorn's last wait, engine stop
# The second-stop test's grace period: so long that only the second stop can end the stream within the hang guard
SECOND_STOP_GRACE_S = 12 * HANG_GUARD_S


def _wait(cond, timeout_s: float, what: str) -> None:
    wait_for(cond, what, timeout_s)  # a hang guard (refengine/tests/waiting.py), not a timing check


def test_sigterm_drains_finishes_in_flight_and_aborts_the_rest(tmp_path):
    port = free_port()
    args = [
        "serve",
        "--model",
        TEST_MODEL,
        "--max-num-seqs",
        "16",
        "--cpu-threads",
        "1",
        "--log-level",
        "warning",
        "--port",
        str(port),
        "--shutdown-timeout",
        str(GRACE_S),
    ]
    proc = start_process([*cbbench_command(), *args], tmp_path / "serve.log", env={"OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        body = {"model": TEST_MODEL, "prompt": "Hello", "temperature": 0.0, "ignore_eos": True}
        short = [Events() for _ in range(3)]
        long = [Events() for _ in range(3)]
        plain: dict = {}

        def call_plain() -> None:
            try:
                r = httpx.post(url + "/v1/completions", json={**body, "max_tokens": LONG_TOKENS}, timeout=300)
                plain.update(status=r.status_code, body=r.json())
            except Exception as e:  # noqa: BLE001 - recorded; asserted below
                plain.update(failure=f"{type(e).__name__}: {e}")

        threads = [
            threading.Thread(target=read_stream, args=(url, {**body, "max_tokens": n}, ev), daemon=True)
            for n, evs in ((SHORT_TOKENS, short), (LONG_TOKENS, long))
            for ev in evs
        ]
        threads.append(threading.Thread(target=call_plain, daemon=True))
        for t in threads:
            t.start()
        _wait(lambda: all(ev.chunks for ev in short + long), FIRST_CHUNK_TIMEOUT_S, "every stream's first chunk")
        in_flight_short = sum(not ev.done for ev in short)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.5)  # the signal handler runs on the server's next bytecode; the drain starts from it

        refused = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["type"] == "ServiceUnavailableError"
        assert httpx.get(url + "/health", timeout=30).status_code == 503  # a load balancer stops routing here

        # the in-flight short streams finish during the drain (the grace period is hang-scale: only a hang outlasts
        # it), while the long ones, 40x longer in the same batch, are still running
        _wait(lambda: all(ev.done or ev.failure for ev in short), EXIT_TIMEOUT_S, "the short streams ending")
        assert in_flight_short, "every short stream finished before SIGTERM: the test checked nothing"
        for ev in short:
            assert ev.failure is None and ev.done and ev.finish_reasons() == ["length"] and not ev.errors, ev
        assert not any(ev.done for ev in long), "a long stream finished inside the drain: nothing left to abort"
        os.kill(proc.pid, signal.SIGTERM)  # the second signal ends the grace period: what is left is aborted
        for t in threads:
            t.join(timeout=EXIT_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads), "a client was still waiting after the drain"
        for ev in long:
            assert ev.failure is None, ev.failure
            assert ev.finish_reasons() == ["abort"] and ev.done, ev
            assert [e["error"]["type"] for e in ev.errors] == ["ServiceUnavailableError"], ev.errors
            assert "shutting down" in ev.errors[0]["error"]["message"]
        assert "failure" not in plain and plain["status"] == 503, plain
        assert plain["body"]["error"]["type"] == "ServiceUnavailableError"
        proc.wait(timeout=EXIT_TIMEOUT_S)
        assert proc.returncode == 0, proc.returncode  # a drained SIGTERM is a clean stop, not a death by signal
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        stop_process(proc)


def test_a_second_stop_ends_the_grace_period_at_once():
    from refengine.engine.llm_engine import LLMEngine
    from refengine.tests.live_server import live_server

    engine = LLMEngine(TEST_MODEL, max_num_seqs=4, stats_log_size=1)
    with live_server(engine, grace_s=SECOND_STOP_GRACE_S) as live:
        ev = Events()
        body = {
            "model": TEST_MODEL,
            "prompt": "Hello",
            "temperature": 0.0,
            "ignore_eos": True,
            "max_tokens": LONG_TOKENS,
        }
        reader = threading.Thread(target=read_stream, args=(live.url, body, ev), daemon=True)
        reader.start()
        _wait(lambda: bool(ev.chunks), FIRST_CHUNK_TIMEOUT_S, "the stream's first chunk")
        live.server.request_stop()
        _wait(lambda: live.app.state.drain.draining, HANG_GUARD_S, "the drain")
        assert httpx.get(live.url + "/health", timeout=30).status_code == 503
        live.server.request_stop()  # the grace period is cut short
        # the order of events, not a time: the stream ends (aborted) long before the grace period could have ended
        # it; the join's limit is only a hang guard, a fraction of that period
        reader.join(timeout=HANG_GUARD_S)
        assert not reader.is_alive(), "the second stop did not end the grace period"
        assert ev.failure is None and ev.done and ev.finish_reasons() == ["abort"], ev
        assert [e["error"]["type"] for e in ev.errors] == ["ServiceUnavailableError"]


def test_the_end_of_the_grace_period_aborts_what_is_left():
    from refengine.engine.llm_engine import LLMEngine
    from refengine.tests.live_server import live_server

    engine = LLMEngine(TEST_MODEL, max_num_seqs=4, stats_log_size=1)
    with live_server(engine, grace_s=EXPIRY_GRACE_S) as live:
        ev = Events()
        body = {"model": TEST_MODEL, "prompt": "Hello", "temperature": 0.0, "ignore_eos": True}
        reader = threading.Thread(
            target=read_stream, args=(live.url, {**body, "max_tokens": LONG_TOKENS}, ev), daemon=True
        )
        reader.start()
        _wait(lambda: bool(ev.chunks), FIRST_CHUNK_TIMEOUT_S, "the stream's first chunk")
        sent = time.monotonic()
        live.server.request_stop()
        reader.join(timeout=HANG_GUARD_S)  # a hang guard: without the aborts the stream runs LONG_TOKENS steps
        assert not reader.is_alive(), "the stream was not ended by the grace period's end"
        assert ev.failure is None and ev.done and ev.finish_reasons() == ["abort"], ev
        assert [e["error"]["type"] for e in ev.errors] == ["ServiceUnavailableError"], ev.errors
        # a lower bound only (load makes the abort later, never earlier): the grace period was given
        assert ev.times[-1] - sent >= EXPIRY_GRACE_S, "aborted before the grace period was over"
        assert len(ev.chunks) < LONG_TOKENS  # ended by the abort, not by running to its end
