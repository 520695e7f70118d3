"""`--backend openai-embeddings` against the fake server's /v1/embeddings: vLLM's request body, one record per
request with its end-to-end latency and input tokens, no token timings, failures counted, and the CLI's CSV row."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from benchmarks.fake_openai_server import BAD_PROMPT_TOKEN, FakeOpenAIServer
from cbbench.perf.backends.http_client import HttpTarget
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.backends.openai_embeddings import OpenAIEmbeddingsBackend
from cbbench.perf.cli import app
from cbbench.perf.results.files import read_csv
from cbbench.workloads.workload import Workload, WorkloadRequest

DELAY_S = 0.02  # the fake server's wait before it answers: every latency is at least this
INPUT_LEN, NUM_PROMPTS = 8, 5


def _run(prompts: list[list[int]], server: FakeOpenAIServer, **kw):
    wl = Workload("manual", {"num_prompts": len(prompts)}, [WorkloadRequest(p, 1) for p in prompts])
    return run_http(
        wl,
        HttpTarget("openai-embeddings", server.base_url, "fake-model"),
        warmup=0,
        send=OpenAIEmbeddingsBackend.send,
        **kw,
    )


def test_records_hold_latency_and_input_tokens_only():
    with FakeOpenAIServer(token_delay_s=DELAY_S) as s:
        r = _run([[1, 2, 3, 4]] * 3 + [[BAD_PROMPT_TOKEN, 2]], s)
        assert s.bodies[0] == {"model": "fake-model", "input": [1, 2, 3, 4], "encoding_format": "float"}
    assert r.error is None
    good = [x for x in r.records if x.finish_reason != "error"]
    assert len(good) == 3 and all(x.output_len == 0 and x.prompt_len == 4 for x in good)
    assert all(x.finish_time - x.arrival_time >= DELAY_S for x in good)
    m = r.metrics(metric_percentiles=[50], goodput=None)
    assert m["completed"] == 3 and m["failed"] == 1 and m["total_input_tokens"] == 12
    assert m["median_e2el_ms"] >= DELAY_S * 1000 and math.isnan(m["median_ttft_ms"])
    assert m["total_token_throughput"] == m["total_input_tokens"] / m["duration"]


def test_two_client_workers_serve_embeddings_too():
    with FakeOpenAIServer(token_delay_s=DELAY_S) as s:
        r = _run([[1, 2, 3 + i] for i in range(6)], s, client_workers=2)
    assert [x.request_id for x in r.records] == [str(i) for i in range(6)]
    assert all(x.finish_reason == "stop" for x in r.records)


def test_cli_row(tmp_path):
    with FakeOpenAIServer(token_delay_s=DELAY_S) as s:
        res = CliRunner().invoke(
            app,
            [
                "perf",
                "--workload",
                "fixed",
                "--workload-param",
                f"input_len={INPUT_LEN},output_len=1",
                "--num-prompts",
                str(NUM_PROMPTS),
                "--warmup",
                "1",
                "--quiet",
                "--backend",
                "openai-embeddings",
                "--base-url",
                s.base_url,
                "--model",
                "fake-model",
                "--result-dir",
                str(tmp_path),
            ],
        )
    assert res.exit_code == 0, res.output
    (csv,) = tmp_path.glob("*.csv")
    (row,) = read_csv(csv).to_dict("records")
    assert row["engine"] == "openai-embeddings" and row["completed"] == NUM_PROMPTS and row["failed"] == 0
    assert row["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN and row["total_output_tokens"] == 0
    assert row["request_throughput"] > 0 and row["median_e2el_ms"] >= DELAY_S * 1000
    (js,) = tmp_path.glob("*.json")
    assert json.loads(js.read_text())  # the run JSON is written as for the other backends
