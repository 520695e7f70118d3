"""Multi-turn workloads through the runners: turn k is sent after turn k - 1's answer, with the history as prefix.

In process (refengine, prefix caching on: the later turns hit the cache), over HTTP against the fake server
(openai-chat: the history as messages; openai: as token ids), the peers' refusal, and the turn metrics and note.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from benchmarks.fake_openai_server import FakeOpenAIServer
from cbbench.perf.backends.conversations import TurnFeeder, conversation_metrics
from cbbench.perf.backends.hf import MULTI_TURN_REFUSED, run_hf_static
from cbbench.perf.backends.http_client import HttpTarget
from cbbench.perf.backends.http_run import run_http
from cbbench.perf.cli import app
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.results.run_json import read_run
from cbbench.workloads.catalog import get_workload
from cbbench.workloads.workload import Workload, WorkloadRequest

USER_LEN, OUTPUT_LEN, TURNS = 20, 3, 3


class WordTokenizer:
    """One id per word (100 + its length): enough to check that an answer's text becomes the history's ids."""

    def encode(self, text: str) -> list[int]:
        return [100 + len(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"u{i}" for i in ids)


def _conversations(n: int = 2) -> Workload:
    reqs = [
        WorkloadRequest([10 + c * 10 + k] * 4, OUTPUT_LEN, 0.0, f"c{c}k{k} ", conversation_id=c, turn=k)
        for c in range(n)
        for k in range(TURNS)
    ]
    return Workload("multiturn", {}, reqs)


def test_feeder_holds_each_turn_until_the_previous_answer():
    w = _conversations(1)
    f = TurnFeeder(w.requests)
    assert f.pop_due(0.0) == (0, 0.0) and f.pop_due(100.0) is None and f.next_due() is None
    f.finished(0, 1.5, [7, 8], "a0 ")
    assert f.pop_due(1.5) == (1, 1.5)
    assert f.prompt_ids(1) == [10] * 4 + [7, 8] + [11] * 4
    assert f.prompt_text(1, lambda r: r.prompt_text) == "c0k0 a0 c0k1 "
    assert f.messages(1, lambda r: r.prompt_text) == [
        {"role": "user", "content": "c0k0 "},
        {"role": "assistant", "content": "a0 "},
        {"role": "user", "content": "c0k1 "},
    ]


def test_in_process_turns_carry_the_history_and_hit_the_prefix_cache():
    from cbbench.perf.backends.in_process import run_refengine

    w = get_workload("multiturn", num_prompts=2, num_turns=TURNS, user_len=USER_LEN, output_len=OUTPUT_LEN)
    knobs = EngineKnobs(max_num_seqs=4, enable_prefix_caching=True, block_size=16)
    args = knobs.engine_args(model="tiny-qwen2", device="cpu", dtype=None, seed=0, batching="continuous")
    r = run_refengine(w, engine_args=args, knobs=knobs, warmup=0)
    by = {(rec.conversation_id, rec.turn): rec for rec in r.records}
    assert sorted(by) == [(c, k) for c in range(2) for k in range(TURNS)]
    for c in range(2):
        for k in range(TURNS):
            assert by[c, k].prompt_len == (k + 1) * USER_LEN + k * OUTPUT_LEN
            if k:  # sent only once the previous answer was back; its history's full blocks were cached
                assert by[c, k].arrival_time >= by[c, k - 1].finish_time
                assert by[c, k].num_cached_tokens > 0
    assert all(by[c, 0].num_cached_tokens == 0 for c in range(2))
    m = r.metrics(metric_percentiles=[50], goodput=None)
    assert m["num_conversations"] == 2 and len(m["ttft_by_turn_ms"]) == TURNS
    assert m["mean_conversation_latency_ms"] > 0
    assert by[0, 0].to_dict()["conversation_id"] == 0 and by[0, 2].to_dict()["turn"] == 2


@pytest.fixture
def server():
    with FakeOpenAIServer() as s:
        yield s


def test_chat_sends_the_history_as_messages(server):
    t = HttpTarget("openai-chat", server.base_url, "fake-model")
    r = run_http(_conversations(), t, tokenizer=WordTokenizer(), warmup=0)
    assert len(r.records) == 2 * TURNS and not r.failures
    turn2 = [b["messages"] for b in server.bodies if b["messages"][-1]["content"] == "c1k2 "]
    assert len(turn2) == 1
    roles = [m["role"] for m in turn2[0]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    answers = {rec.request_id: rec.text for rec in r.records}
    assert turn2[0][1]["content"] == answers["3"] and turn2[0][3]["content"] == answers["4"]
    assert [(rec.conversation_id, rec.turn) for rec in r.records] == [(c, k) for c in range(2) for k in range(3)]


def test_completions_send_the_history_as_token_ids(server):
    tok = WordTokenizer()
    t = HttpTarget("openai", server.base_url, "fake-model")
    r = run_http(_conversations(1), t, tokenizer=tok, warmup=0)
    answers = [rec.text for rec in r.records]
    prompts = [b["prompt"] for b in server.bodies]
    assert prompts[0] == [10] * 4
    assert prompts[1] == [10] * 4 + tok.encode(answers[0]) + [11] * 4
    assert prompts[2] == prompts[1] + tok.encode(answers[1]) + [12] * 4
    assert r.records[2].arrival_time >= r.records[1].finish_time


def test_a_failed_turn_ends_its_conversation():
    t = HttpTarget("openai", "http://127.0.0.1:9", "fake-model")  # nothing listens on the discard port
    r = run_http(_conversations(1), t, tokenizer=WordTokenizer(), warmup=0)
    assert [rec.finish_reason for rec in r.records] == ["error"] * TURNS
    assert "earlier turn" in r.records[1].error


def test_hf_peers_refuse_multi_turn_in_one_line():
    r = run_hf_static(_conversations(1), "tiny-qwen2", device="cpu", dtype=None, max_num_seqs=2)
    assert r.error == MULTI_TURN_REFUSED and "\n" not in r.error


def test_conversation_metrics_skip_plain_runs():
    assert conversation_metrics([]) == {}


def test_cli_prints_the_turn_line_and_writes_turns_to_the_json(server, tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "perf",
            "--workload",
            "multiturn",
            "--workload-param",
            f"num_turns={TURNS},user_len=4,output_len={OUTPUT_LEN}",
            "--num-prompts",
            "2",
            "--warmup",
            "1",
            "--backend",
            "openai-chat",
            "--base-url",
            server.base_url,
            "--model",
            "fake-model",
            "--tokenizer",
            "qwen",
            "--result-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "mean TTFT by turn (ms)" in res.output and "conversation latency" in res.output
    (js,) = tmp_path.glob("*.json")
    doc = read_run(js)
    (recs,) = doc["records"].values()
    assert sorted((x["conversation_id"], x["turn"]) for x in recs) == [(c, k) for c in range(2) for k in range(3)]
    extra = json.loads(doc["rows"][0]["extra"])
    assert len(extra["ttft_by_turn_ms"]) == TURNS and not math.isnan(extra["mean_conversation_latency_ms"])
