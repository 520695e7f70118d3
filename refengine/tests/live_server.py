"""A real `cbbench serve` stack (launch.make_server: uvicorn, the server's limits, the graceful stop) on a free
127.0.0.1 port, in a background thread of the test process, for tests that need real sockets and real streaming
clients; and an SSE reader that keeps every event, errors included (the black-box client refuses error events)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from conformance.http.client import free_port
from refengine.engine.llm_engine import LLMEngine
from refengine.entrypoints.address import bind_socket
from refengine.entrypoints.api_server import build_app
from refengine.entrypoints.launch import make_server
from refengine.tests.waiting import wait_for


@dataclass
class Live:
    url: str
    app: object
    server: object

    def metric(self, name: str) -> float:
        """One vLLM metric from /metrics, summed over its label sets."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + "{", name + " "))
        )


@contextlib.contextmanager
def live_server(engine: LLMEngine, grace_s: float = 5.0, **build_kwargs) -> Iterator[Live]:
    app = build_app(engine, **build_kwargs)
    sock = bind_socket("127.0.0.1", free_port())
    server = make_server(app, sock, log_level="warning", grace_s=grace_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    # a server thread that died is a failure at once; a slow start is only load (the hang guard, not a time limit)
    wait_for(lambda: server.started or not thread.is_alive(), "the server's start")
    assert thread.is_alive(), "the server thread ended before it started serving"
    try:
        yield Live(url, app, server)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


@dataclass
class Events:
    """Everything one SSE stream sent: chunks, error events, whether [DONE] came, and when each event arrived."""

    status: int = 0
    chunks: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    done: bool = False
    failure: str | None = None  # a transport error (the stream did not end cleanly)

    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for ch in self.chunks for c in ch["choices"] if c.get("finish_reason")]


def read_stream(url: str, body: dict, out: Events, headers: dict | None = None, timeout_s: float = 120.0) -> None:
    """POST a streaming completion and record its events into `out` (for a thread: never raises)."""
    try:
        with httpx.stream(
            "POST", url + "/v1/completions", json={**body, "stream": True}, headers=headers, timeout=timeout_s
        ) as r:
            out.status = r.status_code
            if r.status_code != 200:
                r.read()
                return
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                out.times.append(time.monotonic())
                if payload == "[DONE]":
                    out.done = True
                    continue
                event = json.loads(payload)
                (out.errors if "error" in event else out.chunks).append(event)
    except Exception as e:  # noqa: BLE001 - recorded; the test asserts on it
        out.failure = f"{type(e).__name__}: {e}"
