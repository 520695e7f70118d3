"""`cbbench perf --backend openai` against a real `cbbench serve` subprocess on a free local port.

- The HTTP run agrees with the in-process run of the same workload (greedy, ignore_eos): the same prompt and output
  token counts per request, the same totals, and the same generated text (all that the wire carries of the tokens).
- 64 concurrent streams all finish, and the server's /metrics are read into the result.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from cbbench.perf.backends.http_client import HttpTarget
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.cli import app
from cbbench.perf.results.files import read_csv
from cbbench.perf.results.run_json import read_run
from cbbench.workloads.workload import Workload, WorkloadRequest
from refengine.models.presets import TEST_MODEL

MAX_NUM_SEQS = 64
NUM_STREAMS = 64
STARTUP_TIMEOUT_S = 120.0  # loading tiny-qwen2 and importing torch on a busy 2-core machine
RANDOM = [
    "--workload",
    "random",
    "--workload-param",
    "input_len_min=8,input_len_max=40,output_len_min=2,output_len_max=12",
    "--num-prompts",
    "10",
    "--warmup",
    "1",
    "--quiet",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [
        sys.executable,
        "-c",
        "from cbbench.perf.cli import app; app()",
        "serve",
        "--model",
        TEST_MODEL,
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--cpu-threads",
        "1",
        "--log-level",
        "warning",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"cbbench serve exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"cbbench serve did not answer /health in {STARTUP_TIMEOUT_S} s")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(tmp_path, *args: str):
    res = CliRunner().invoke(app, ["perf", *args, "--result-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (csv,), (js,) = tmp_path.glob("*.csv"), tmp_path.glob("*.json")
    return read_csv(csv).to_dict("records"), read_run(js)


def test_http_run_agrees_with_in_process_run(served, tmp_path):
    (inproc,), doc_in = _run(
        tmp_path / "inproc",
        *RANDOM,
        "--model",
        TEST_MODEL,
        "--batching",
        "continuous",
        "--peers",
        "none",
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--cpu-threads",
        "0",
    )
    (http,), doc_http = _run(
        tmp_path / "http", *RANDOM, "--backend", "openai", "--base-url", served, "--model", TEST_MODEL
    )
    for k in ("completed", "total_input_tokens", "total_output_tokens"):
        assert http[k] == inproc[k], k
    assert http["failed"] == 0 and json.loads(http["workload_params"]) == json.loads(inproc["workload_params"])
    (rin,), (rhttp,) = doc_in["records"].values(), doc_http["records"].values()
    assert [(r["request_id"], r["prompt_len"], r["output_len"]) for r in rin] == [
        (r["request_id"], r["prompt_len"], r["output_len"]) for r in rhttp
    ]
    assert all(r["output_len_source"] == "usage" for r in rhttp)

    from refengine import LLM, SamplingParams  # the same prompts through the engine: the same tokens come back

    w = doc_http["workload"]["params"]
    from cbbench.workloads.catalog import get_workload

    wl = get_workload(
        "random",
        num_prompts=w["num_prompts"],
        seed=w["seed"],
        **{k: w[k] for k in ("input_len_min", "input_len_max", "output_len_min", "output_len_max", "token_id_range")},
    )
    llm = LLM(model=TEST_MODEL, device="cpu", max_num_seqs=MAX_NUM_SEQS)
    outs = [
        llm.generate([r.prompt_token_ids], SamplingParams(max_tokens=r.output_len, temperature=0.0, ignore_eos=True))[0]
        for r in wl.requests
    ]
    assert [o.outputs[0].text for o in outs] == [r["text"] for r in rhttp]


def test_64_concurrent_streams_all_finish(served):
    reqs = [WorkloadRequest([100 + i] + [7] * 15, 8) for i in range(NUM_STREAMS)]
    r = run_http(
        Workload("streams", {"num_prompts": NUM_STREAMS}, reqs), HttpTarget("openai", served, TEST_MODEL), warmup=1
    )
    assert r.error is None, r.error
    m = r.metrics(metric_percentiles=[50], goodput=None)
    assert m["completed"] == NUM_STREAMS and m["failed"] == 0
    assert [rec.output_len for rec in r.records] == [8] * NUM_STREAMS
    assert m["num_preemptions"] == 0 and 0 < m["peak_kv_usage"] <= 1  # read from the server's /metrics
    assert not math.isnan(m["mean_itl_ms"])


def test_chat_backend_against_cbbench_serve(served, tmp_path):
    rows, doc = _run(tmp_path, *RANDOM, "--backend", "openai-chat", "--base-url", served, "--model", TEST_MODEL)
    (row,) = rows
    (recs,) = doc["records"].values()
    assert row["completed"] == 10 and row["failed"] == 0
    assert [r["output_len"] for r in recs] == [r["requested_output_len"] for r in recs]
