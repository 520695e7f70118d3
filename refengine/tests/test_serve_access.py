"""Who may call `cbbench serve` and what its error bodies say, against a real server on 127.0.0.1: the API key
(vLLM's --api-key; /health and /metrics stay open), 4xx bodies typed as client errors, no server internals in an
error body, /docs that loads nothing from a CDN (and vLLM's --disable-fastapi-docs), vllm:cache_config_info, and the
serve exit codes for a bad argument or a busy port (refused before torch or the model loads)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import httpx
import pytest

pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")

from conformance.engine_helpers import TEST_MODEL
from refengine.engine.llm_engine import LLMEngine  # noqa: E402
from refengine.tests.live_server import live_server  # noqa: E402

MODEL = TEST_MODEL
KEY = "s3cret-key"
GOOD = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(MODEL, max_num_seqs=8, stats_log_size=1)


def test_api_key_is_required_except_on_health_and_metrics(engine):
    with live_server(engine, api_key=KEY) as live:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.post(live.url + "/v1/completions", json=GOOD, headers=headers, timeout=60)
            assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError", (headers, r.text)
            assert httpx.get(live.url + "/v1/models", headers=headers).status_code == 401
        ok = {"Authorization": f"Bearer {KEY}"}
        assert httpx.post(live.url + "/v1/completions", json=GOOD, headers=ok, timeout=60).status_code == 200
        assert httpx.get(live.url + "/v1/models", headers=ok).status_code == 200
        assert httpx.get(live.url + "/health").status_code == 200
        assert httpx.get(live.url + "/metrics").status_code == 200


def test_serve_binds_loopback_by_default():
    import typer

    from cbbench.perf.cli import app
    from refengine.entrypoints.launch import run_server

    serve = typer.main.get_command(app).commands["serve"]
    assert {p.name: p.default for p in serve.params}["host"] == "127.0.0.1"
    assert run_server.__defaults__[0] == "127.0.0.1"


def test_every_4xx_body_is_a_client_error_and_no_body_echoes_internals(engine, monkeypatch):
    with live_server(engine) as live:
        serving = live.app.state.serving
        cases = [
            ("GET", "/v1/completions", None, 405),
            ("DELETE", "/health", None, 405),
            ("GET", "/nowhere", None, 404),
            ("POST", "/v1/completions", {**GOOD, "model": "other"}, 404),
            ("POST", "/v1/completions", {**GOOD, "max_tokens": 0}, 400),
        ]
        for method, path, body, status in cases:
            r = httpx.request(method, live.url + path, json=body, timeout=60)
            err = r.json()["error"]
            assert r.status_code == status and err["code"] == status, (path, r.text)
            assert err["type"].endswith("Error") and err["type"] != "InternalServerError", (path, err)

        def planted(*args, **kwargs):
            raise RuntimeError("planted bug at /srv/secret/path.py")

        monkeypatch.setattr(serving, "tokenize", planted)
        r = httpx.post(live.url + "/tokenize", json={"model": MODEL, "prompt": "x"}, timeout=60)
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        assert "secret" not in r.text and "RuntimeError" not in r.text, r.text


def test_docs_load_nothing_from_outside_and_can_be_disabled(engine):
    with live_server(engine) as live:
        page = httpx.get(live.url + "/docs")
        assert page.status_code == 200 and "/v1/completions" in page.text
        # nothing fetched from elsewhere: no script or style source, no absolute URL at all
        assert not re.search(r"<script|<link|https?://", page.text), page.text[:500]
        assert httpx.get(live.url + "/openapi.json").json()["paths"]
    with live_server(engine, disable_docs=True) as live:
        for path in ("/docs", "/openapi.json", "/redoc"):
            assert httpx.get(live.url + path).status_code == 404, path


def test_cache_config_info_names_the_kv_pool(engine):
    with live_server(engine) as live:
        text = httpx.get(live.url + "/metrics").text
    [line] = [x for x in text.splitlines() if x.startswith("vllm:cache_config_info{")]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    config = engine.scheduler.config
    assert labels["num_gpu_blocks"] == str(config.num_gpu_blocks) and labels["block_size"] == str(config.block_size)
    assert line.endswith(" 1.0")


# `cbbench serve` in a fresh interpreter; it then prints whether torch was imported.
SERVE = """
import sys
from cbbench.perf.cli import app
try:
    app(sys.argv[1:], prog_name="cbbench")
finally:
    print("torch" in sys.modules)
"""
SUBPROCESS_TIMEOUT_S = 120  # a cold interpreter on a shared 2-core machine; a refusal takes well under 1 s


def _serve(*args: str) -> tuple[subprocess.CompletedProcess, bool]:
    # A model folder that does not exist: if an argument were checked after loading, the error would name the model.
    cmd = [sys.executable, "-c", SERVE, "serve", "--model", "/no/such/model", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=False)
    return done, done.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize(
    "args, named",
    [
        (["--port", "70000"], ["port", "70000"]),
        (["--block-size", "0"], ["--block-size"]),  # the CLI names the flag as typed
        (["--policy", "lifo"], ["policy"]),
        (["--shutdown-timeout", "-1"], ["--shutdown-timeout"]),
        (["--cpu-threads", "-1"], ["cpu-threads"]),
        (["--host", "no.such.host.invalid"], ["host"]),
    ],
)
def test_bad_argument_is_one_line_and_exit_2_before_torch_loads(args, named):
    r, torch_loaded = _serve(*args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in named), r.stderr
    assert not torch_loaded, f"serve {args} imported torch before refusing"


def test_port_in_use_is_one_line_and_exit_2_before_torch_loads():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        r, torch_loaded = _serve("--host", "127.0.0.1", "--port", str(busy.getsockname()[1]))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "in use" in lines[0], r.stderr
    assert not torch_loaded


def test_the_api_key_defaults_to_vllm_api_key(monkeypatch):
    from conformance.http.client import free_port
    from refengine.entrypoints import launch

    class Built(Exception):
        pass

    seen: dict = {}

    def build(engine, name, **kwargs):
        seen.update(kwargs)
        raise Built

    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    monkeypatch.setattr(launch, "LLMEngine", lambda **kw: object())
    monkeypatch.setattr(launch, "build_app", build)
    with pytest.raises(Built):
        launch.run_server({"model": MODEL}, port=free_port())
    assert seen["api_key"] == "from-env"
    with pytest.raises(Built):
        launch.run_server({"model": MODEL}, port=free_port(), api_key="flag")
    assert seen["api_key"] == "flag"


def test_served_connections_have_nagle_off():
    """Each accepted connection writes its chunks at once (TCP_NODELAY). With Nagle on, a chunk written while the
    previous one was unacknowledged waited for the client's delayed ACK: a request sent right after another finished
    on a keep-alive connection got its first token ~35 ms late."""
    import asyncio

    from conformance.http.client import free_port
    from refengine.entrypoints.address import bind_socket

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                s = transport.get_extra_info("socket")
                seen.set_result(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        sock = bind_socket("127.0.0.1", free_port())
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        value = await asyncio.wait_for(seen, 10)
        writer.close()
        server.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0
