"""What the black-box HTTP suite needs of a server, over HTTP only (httpx): completions (whole and streamed, with
the SSE stream parsed strictly), /v1/models, /metrics samples, and starting a server process and waiting for it.

Nothing here imports refengine: the suite must run against any OpenAI-compatible server (vLLM, transformers serve).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REQUEST_TIMEOUT_S = 120.0  # one request on a shared 2-core CPU, queued behind up to 64 others
STARTUP_TIMEOUT_S = 240.0  # imports + model load of a server on a busy 2-core CPU


@dataclass
class Streamed:
    """A parsed SSE completion stream: per-choice text, every chunk, the finish reason, the usage chunk if any."""

    chunks: list[dict] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    usage: dict | None = None
    done: bool = False  # `data: [DONE]` was seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_sse_line(line: str, out: Streamed, chat: bool) -> None:
    """One line of an SSE stream; non-`data:` lines (comments, blank separators) carry nothing."""
    if not line.startswith("data:"):
        return
    payload = line[len("data:") :].strip()
    assert not out.done, f"data after [DONE]: {payload!r}"
    if payload == "[DONE]":
        out.done = True
        return
    chunk = json.loads(payload)
    assert "error" not in chunk, f"the stream reported an error: {chunk}"
    out.chunks.append(chunk)
    if chunk.get("usage"):
        out.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        out.text += piece or ""
        if choice.get("finish_reason") is not None:
            assert out.finish_reason is None, f"two finish reasons in one stream: {chunk}"
            out.finish_reason = choice["finish_reason"]


class Server:
    """A synchronous httpx client bound to one server's base URL, with the calls the tests make."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_S)
        self._model: str | None = None

    @property
    def model(self) -> str:
        """The first model /v1/models lists: the name every request sends."""
        if self._model is None:
            r = self.http.get("/v1/models")
            r.raise_for_status()
            self._model = r.json()["data"][0]["id"]
        return self._model

    @functools.cached_property
    def takes_ignore_eos(self) -> bool:
        """vLLM's `ignore_eos` is not OpenAI's: a server that refuses it (4xx) is driven without it, and a test
        that then meets an early EOS fails, which is what such a server does to a benchmark."""
        r = self.http.post("/v1/completions", json=self.body(prompt="probe", max_tokens=1, ignore_eos=True))
        return r.status_code == 200

    @functools.cached_property
    def simulated(self) -> str | None:
        """What the server says it simulates (refengine's `cbbench serve --device sim:<gpu>` puts a label in
        GET /version), or None: a real model, or a server with no such field or no /version."""
        r = self.http.get("/version")
        label = r.json().get("simulated") if r.status_code == 200 else None
        return str(label) if label else None

    def skip_if_simulated(self, what: str) -> None:
        """A simulated server samples one fixed token whatever the request asks: tests of sampling semantics
        have nothing to observe there."""
        if self.simulated:
            pytest.skip(f"{what}: the server is simulated ({self.simulated}); every sampled token is fixed")

    @property
    def greedy(self) -> dict:
        """Fields of a deterministic request that runs to max_tokens (where the server can be told so)."""
        return {"temperature": 0.0, **({"ignore_eos": True} if self.takes_ignore_eos else {})}

    def body(self, **fields) -> dict:
        return {"model": self.model, **fields}

    def complete(self, **fields) -> dict:
        r = self.http.post("/v1/completions", json=self.body(**fields))
        assert r.status_code == 200, f"{r.status_code}: {r.text}"
        return r.json()

    def chat(self, **fields) -> dict:
        r = self.http.post("/v1/chat/completions", json=self.body(**fields))
        assert r.status_code == 200, f"{r.status_code}: {r.text}"
        return r.json()

    def stream(self, path: str = "/v1/completions", **fields) -> Streamed:
        out = Streamed()
        with self.http.stream("POST", path, json=self.body(stream=True, **fields)) as r:
            assert r.status_code == 200, f"{r.status_code}: {r.read().decode(errors='replace')}"
            assert r.headers.get("content-type", "").startswith("text/event-stream"), r.headers
            for line in r.iter_lines():
                parse_sse_line(line, out, chat="chat" in path)
        return out

    def metrics(self) -> dict[str, float] | None:
        """Samples of /metrics summed over their labels (name -> value), or None if the server has no /metrics."""
        try:
            r = self.http.get("/metrics", timeout=10.0)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return parse_prometheus(r.text)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            samples[m.group(1)] = samples.get(m.group(1), 0.0) + float(m.group(3))
    return samples


def wait_healthy(
    base_url: str, proc: subprocess.Popen | None, timeout_s: float = STARTUP_TIMEOUT_S, path: str = "/health"
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was healthy")
        try:
            if httpx.get(base_url + path, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{base_url}{path} not healthy after {timeout_s:.0f} s")


def start_process(cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """A server in its own process group (so that stop_process ends it and its children), logging to a file."""
    log = open(log_path, "wb")
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
