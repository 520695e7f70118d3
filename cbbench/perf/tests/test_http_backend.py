"""`cbbench perf --backend openai|openai-chat` against a real HTTP server on a free local port.

The server here is `fake_openai_server.FakeOpenAIServer` (deterministic tokens, vLLM-named /metrics), so these
tests check the client alone: request shapes, chunk accounting, usage counts, failures, concurrency caps, rate
sweeps, /metrics scraping and the CSV. The end-to-end check against `cbbench serve` is `test_http_vs_inprocess.py`.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from benchmarks.fake_openai_server import BAD_PROMPT_TOKEN, NUM_GPU_BLOCKS, FakeOpenAIServer
from cbbench.perf.backends.http_client import HttpTarget, build_payload, chunk_content
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.backends.server_metrics import kv_usage, parse_prometheus
from cbbench.perf.cli import app
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.results.files import read_csv
from cbbench.perf.results.run_json import read_run
from cbbench.workloads.workload import Workload, WorkloadRequest

INPUT_LEN, OUTPUT_LEN, NUM_PROMPTS = 8, 5, 6
FIXED = [
    "--workload",
    "fixed",
    "--workload-param",
    f"input_len={INPUT_LEN},output_len={OUTPUT_LEN}",
    "--num-prompts",
    str(NUM_PROMPTS),
    "--warmup",
    "1",
    "--quiet",
]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def server():
    # the KV gauge reads the most requests in flight since its last read: a run's peak reaches the table however slow
    # the machine (a sample timed to land mid-run could not promise that under load)
    with FakeOpenAIServer(kv_high_water=True) as s:
        yield s


def _perf(server, tmp_path, *extra: str):
    res = invoke(
        "perf",
        *FIXED,
        "--backend",
        extra[0] if extra else "openai",
        "--base-url",
        server.base_url,
        "--model",
        "fake-model",
        "--result-dir",
        str(tmp_path),
        *extra[1:],
    )
    assert res.exit_code == 0, res.output
    (csv,) = tmp_path.glob("*.csv")
    (js,) = tmp_path.glob("*.json")
    return read_csv(csv), read_run(js), res.output


def test_payload_is_vllm_bench_serve_shaped():
    t = HttpTarget("openai", "http://127.0.0.1:1/v1", "m")
    p = build_payload(t, [1, 2, 3], 7)
    assert t.url == "http://127.0.0.1:1/v1/completions"
    assert p["prompt"] == [1, 2, 3] and p["max_tokens"] == 7 and p["stream"] is True
    assert p["stream_options"] == {"include_usage": True} and p["ignore_eos"] is True and p["temperature"] == 0.0
    c = build_payload(HttpTarget("openai-chat", "http://h:1", "m"), "hi", 7)
    assert c["messages"] == [{"role": "user", "content": "hi"}] and c["max_completion_tokens"] == 7


def test_chunk_content_rules():
    assert chunk_content("openai", {"text": "", "finish_reason": None}) == ""  # a token with no text yet
    assert chunk_content("openai", {"text": "", "finish_reason": "length"}) is None  # a finish marker
    assert chunk_content("openai", {"text": "x", "finish_reason": "length"}) == "x"
    assert chunk_content("openai-chat", {"delta": {"role": "assistant", "content": ""}}) is None
    assert chunk_content("openai-chat", {"delta": {"content": "a"}, "finish_reason": None}) == "a"


def test_prometheus_parsing():
    text = (
        '# HELP x\nvllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:kv_cache_usage_perc{engine="1"} 0.75\n'
        "vllm:num_preemptions_total 3.0\nbad line\n"
    )
    parsed = parse_prometheus(text)
    assert parsed["vllm:num_preemptions_total"] == [({}, 3.0)]
    assert kv_usage(parsed) == 0.5
    assert kv_usage(parse_prometheus("vllm:gpu_cache_usage_perc 40\n")) == 0.4  # a percentage, read as one
    assert math.isnan(kv_usage({}))


def test_perf_openai_counts_tokens_and_reads_metrics(server, tmp_path):
    df, doc, output = _perf(server, tmp_path)
    (row,) = df.to_dict("records")
    assert row["engine"] == "openai" and row["completed"] == NUM_PROMPTS and row["failed"] == 0
    assert row["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert row["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN
    assert row["num_preemptions"] == NUM_PROMPTS  # the fake counts one per request: warm-up excluded by the delta
    assert 0 < row["peak_kv_usage"] <= 1 and 0 < row["peak_kv_blocks"] <= NUM_GPU_BLOCKS
    assert row["mean_ttft_ms"] > 0 and row["mean_tpot_ms"] > 0 and row["mean_itl_ms"] > 0
    assert math.isnan(row["mean_slot_utilisation"])  # an HTTP client cannot see slots
    (recs,) = doc["records"].values()
    for r in recs:  # every token chunk counts (empty texts included), the finish-only marker does not
        assert r["output_len"] == OUTPUT_LEN and len(r["chunk_times"]) == OUTPUT_LEN
        assert r["output_len_source"] == "usage"
    bodies = [b for b in server.bodies if len(b["prompt"]) == INPUT_LEN]
    assert len(bodies) == NUM_PROMPTS and all(b["max_tokens"] == OUTPUT_LEN and b["ignore_eos"] for b in bodies)
    assert "openai" in output


def test_perf_openai_chat(server, tmp_path):
    df, doc, _ = _perf(server, tmp_path, "openai-chat")
    (row,) = df.to_dict("records")
    assert row["engine"] == "openai-chat" and row["completed"] == NUM_PROMPTS
    assert row["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    (recs,) = doc["records"].values()
    assert all(len(r["chunk_times"]) == OUTPUT_LEN for r in recs)  # the role announcement is not a token
    assert all(isinstance(b["messages"][0]["content"], str) for b in server.bodies)


def _workload(prompts: list[list[int]], output_len: int = 4) -> Workload:
    return Workload("manual", {"num_prompts": len(prompts)}, [WorkloadRequest(p, output_len) for p in prompts])


def test_failed_requests_are_counted_not_fatal(server):
    good = [[1, 2, 3]] * 3
    bad = [[BAD_PROMPT_TOKEN, 2, 3]] * 2
    r = run_http(_workload(good + bad), HttpTarget("openai", server.base_url, "fake-model"), warmup=0)
    assert r.error is None
    m = r.metrics(metric_percentiles=[50], goodput=None)
    assert m["completed"] == 3 and m["failed"] == 2 and m["total_output_tokens"] == 12
    assert all("HTTP 400" in f.error and "prompt" in f.error for f in r.failures)


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_unreachable_server_is_one_line_exit_2_and_no_files(tmp_path, backend):
    """An address where no server accepts a connection: nothing could be measured, so nothing runs and nothing is
    written (no CSV or JSON of a run that never started), and one line says where no server answered."""
    with FakeOpenAIServer() as s:
        url = s.base_url  # a port that was free a moment ago and is closed now
    res = invoke("perf", *FIXED, "--backend", backend, "--base-url", url, "--result-dir", str(tmp_path))
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert line == (
        f"cbbench perf: error: --base-url {url}: no server answers there (connection refused); start one "
        "(`cbbench serve`) or fix the address"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cap", [1, 2])
def test_max_concurrency_caps_requests_in_flight(cap):
    """The cap holds, and /metrics is still read mid-run while every connection of the cap is busy: each request's
    last chunk waits until a read has seen it in flight (a sampler sharing the requests' connections never did)."""
    with FakeOpenAIServer(hold_for_busy_scrape=True) as server:
        r = run_http(
            _workload([[1, 2, 3]] * 6, output_len=6),
            HttpTarget("openai", server.base_url, "fake-model"),
            max_concurrency=cap,
            warmup=0,
        )
    m = r.metrics(metric_percentiles=[50], goodput=None)
    assert m["completed"] == 6 and server.peak_in_flight == cap
    assert m["peak_kv_usage"] > 0, "no /metrics read saw a request in flight"


def test_request_rate_sweep_is_one_row_per_rate(server, tmp_path):
    df, _, _ = _perf(server, tmp_path, "openai", "--request-rate", "200,inf", "--max-concurrency", "2")
    assert sorted(df["request_rate"].astype(float)) == [200.0, math.inf]
    assert (df["completed"] == NUM_PROMPTS).all()
    params = [json.loads(p) for p in df["workload_params"]]
    assert all(p["max_concurrency"] == 2 for p in params)
    assert invoke("compare", *[str(p) for p in tmp_path.glob("*.csv")] * 2).exit_code == 0


def test_engine_knobs_are_refused_with_an_http_backend(server, tmp_path):
    res = invoke(
        "perf",
        *FIXED,
        "--backend",
        "openai",
        "--base-url",
        server.base_url,
        "--max-num-seqs",
        "4",
        "--result-dir",
        str(tmp_path),
    )
    assert res.exit_code == 2 and "max-num-seqs" in res.output and "server" in res.output
    res = invoke("perf", *FIXED, "--backend", "openai", "--result-dir", str(tmp_path))
    assert res.exit_code == 2 and "base-url" in res.output


def test_in_process_max_concurrency_caps_requests_in_flight():
    """The same --max-concurrency in-process: never more than `cap` requests in the engine, all finish."""
    from cbbench.perf.backends.in_process import run_refengine

    cap = 2
    w = _workload([[7 + i] * 8 for i in range(5)], output_len=4)
    knobs = EngineKnobs(max_num_seqs=4)
    args = knobs.engine_args(model="tiny-qwen2", device="cpu", dtype=None, seed=0, batching="continuous")
    r = run_refengine(w, engine_args=args, knobs=knobs, warmup=0, max_concurrency=cap)
    assert [rec.output_len for rec in r.records] == [4] * 5
    assert max(s.num_running + s.num_waiting for s in r.steps) == cap


def test_compare_in_process_against_http(server, tmp_path):
    """The server's overhead is a `compare` of an in-process run and an HTTP run of the same workload: with
    `--ignore-key server` their rows match on the model and the load; without it they are different configs."""
    from cbbench.perf.results.compare import compare

    inproc_dir, http_dir = tmp_path / "inproc", tmp_path / "http"
    common = [*FIXED, "--model", "tiny-qwen2", "--max-concurrency", "3"]
    res = invoke(
        "perf",
        *common,
        "--batching",
        "continuous,static",
        "--peers",
        "none",
        "--cpu-threads",
        "0",
        "--result-dir",
        str(inproc_dir),
    )
    assert res.exit_code == 0, res.output
    res = invoke("perf", *common, "--backend", "openai", "--base-url", server.base_url, "--result-dir", str(http_dir))
    assert res.exit_code == 0, res.output
    (inproc_csv,), (http_csv,) = inproc_dir.glob("*.csv"), http_dir.glob("*.csv")
    inproc = read_csv(inproc_csv)

    rows, _ = compare(inproc[inproc.batching == "continuous"], read_csv(http_csv), ignore_key=["server"])
    assert rows and {r["status"] for r in rows} <= {"ok", "improved", "regressed", "n/a"}
    assert {r["metric"] for r in rows} >= {"output_throughput", "mean_ttft_ms"}
    from cbbench.perf.results.compare import NoCommonConfigs

    with pytest.raises(NoCommonConfigs, match="0 configurations in common"):  # the full key: nothing matches
        compare(inproc_csv, http_csv)
    res = invoke("compare", str(inproc_csv), str(http_csv), "--ignore-key", "server")  # two modes become one
    assert res.exit_code == 2 and "ignore-key" in res.output and "--where" in res.output
    res = invoke(
        "compare",
        str(inproc_csv),
        str(http_csv),
        "--ignore-key",
        "server",
        "--where",
        "batching=continuous",
        "--format",
        "json",
    )  # the HTTP row's unknown mode matches
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["configurations_in_common"] == 1
    assert invoke("compare", str(inproc_csv), str(http_csv), "--ignore-key", "colour").exit_code == 2


def test_no_ignore_eos_leaves_the_field_out(server, tmp_path):
    """For servers that refuse vLLM's extra fields (transformers serve answers 422 to ignore_eos)."""
    df, _, _ = _perf(server, tmp_path, "openai", "--no-ignore-eos", "--request-timeout", "60")
    assert df["completed"].iloc[0] == NUM_PROMPTS
    assert server.bodies and all("ignore_eos" not in b for b in server.bodies)
    assert json.loads(df["extra"].iloc[0])["ignore_eos"] is False


class _WordTokenizer:
    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]


def test_without_usage_counts_fall_back_to_the_tokenizer_then_chunks():
    n = 6  # tokens 2 and 5 stream empty text: 4 words, 6 chunks
    w = _workload([[1, 2, 3]] * 2, output_len=n)
    with FakeOpenAIServer(with_usage=False) as s:
        by_tok = run_http(w, HttpTarget("openai", s.base_url, "fake-model"), tokenizer=_WordTokenizer(), warmup=0)
        by_chunk = run_http(w, HttpTarget("openai", s.base_url, "fake-model"), tokenizer=None, warmup=0)
    assert {(r.output_len, r.output_len_source) for r in by_tok.records} == {(4, "tokenizer")}
    assert {(r.output_len, r.output_len_source) for r in by_chunk.records} == {(n, "chunks")}
