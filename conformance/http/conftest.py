"""The server under test: `--base-url URL` (any OpenAI-compatible server), or else a real `cbbench serve` on a free
local port, started once per session in its own process and killed at teardown."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conformance.engine_helpers import TEST_MODEL
from conformance.http.client import Server, free_port, start_process, stop_process, wait_healthy

# The served engine's knobs (the test suites' small-vocabulary tiny-qwen2, conformance/engine_helpers.py).
# max_num_seqs equals the disconnect test's stream count, so a leaked stream would hold a slot and the next request
# would wait for it: the black-box check then has teeth against this server.
SERVE_ARGS = ["--model", TEST_MODEL, "--max-num-seqs", "32", "--cpu-threads", "1", "--log-level", "warning"]


def cbbench_command() -> list[str]:
    exe = Path(sys.executable).parent / "cbbench"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("cbbench")
    return [found] if found else [sys.executable, "-c", "from cbbench.perf.cli import app; app()"]


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    base_url = request.config.getoption("--base-url")
    if base_url:
        wait_healthy(base_url.rstrip("/"), None, timeout_s=30.0, path="/v1/models")
        yield Server(base_url)
        return
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "cbbench-serve.log"
    proc = start_process(
        [*cbbench_command(), "serve", *SERVE_ARGS, "--host", "127.0.0.1", "--port", str(port)],
        log_path,
        env={"OMP_NUM_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
    except (RuntimeError, TimeoutError) as e:
        stop_process(proc)
        pytest.fail(f"cbbench serve did not start: {e}\n{log_path.read_text()[-3000:]}")
    try:
        yield Server(url)
    finally:
        stop_process(proc)
