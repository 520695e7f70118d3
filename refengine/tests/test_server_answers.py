"""Two answers of `cbbench serve` that must be vLLM's: a prompt that leaves room for fewer tokens than `max_tokens`
is a 400 naming both numbers (not a 200 cut short at the context's end; the offline `LLM` API still stops there, as
vLLM's does), and a lone surrogate in any string field is a 400 naming that field (not Python's codec error)."""

from __future__ import annotations

import json

import httpx
import pytest

from conformance.engine_helpers import TEST_MODEL
from refengine import LLM, SamplingParams
from refengine.engine.llm_engine import LLMEngine
from refengine.tests.live_server import live_server

pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")


@pytest.fixture(scope="module")
def live():
    engine = LLMEngine(TEST_MODEL, max_num_seqs=4, stats_log_size=1)
    with live_server(engine) as server:
        yield server, engine.max_model_len


def post(url: str, path: str, body: str | dict) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=120)


def test_max_tokens_past_the_context_is_a_400_naming_both_numbers(live):
    server, ctx = live
    prompt = [1] * (ctx - 1)
    r = post(server.url, "/v1/completions", {"model": TEST_MODEL, "prompt": prompt, "max_tokens": 5})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "max_tokens" and err["type"] == "BadRequestError"
    assert err["message"] == (
        f"'max_tokens' or 'max_completion_tokens' is too large: 5. This model's maximum context length is {ctx} "
        f"tokens and your request has {ctx - 1} input tokens (5 > {ctx} - {ctx - 1}). (parameter=max_tokens, value=5)"
    )
    ok = post(server.url, "/v1/completions", {"model": TEST_MODEL, "prompt": prompt, "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1  # exactly the room there is


def test_chat_names_max_completion_tokens_when_that_was_sent(live):
    server, ctx = live
    body = {"model": TEST_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": ctx}
    r = post(server.url, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens", r.text
    assert f"is too large: {ctx}." in r.json()["error"]["message"]


def test_the_offline_api_still_stops_at_the_contexts_end():
    llm = LLM(model=TEST_MODEL, device="cpu")
    ctx = llm.llm_engine.max_model_len
    (out,) = llm.generate([[1] * (ctx - 1)], SamplingParams(max_tokens=5, temperature=0.0))
    assert len(out.outputs[0].token_ids) == 1 and out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", '{"model": "\\ud800", "prompt": "hi", "max_tokens": 2}', "model"),
        ("/v1/completions", '{"model": "M", "prompt": "hi\\udfff", "max_tokens": 2}', "prompt"),
        ("/v1/completions", '{"model": "M", "prompt": "hi", "stop": ["a", "\\ud800"], "max_tokens": 2}', "stop.1"),
        ("/v1/completions", '{"model": "M", "prompt": "hi", "user": "\\udc00x", "max_tokens": 2}', "user"),
        (
            "/v1/chat/completions",
            '{"model": "M", "messages": [{"role": "user", "content": "\\ud83d"}]}',
            "messages.0.content",
        ),
        ("/tokenize", '{"model": "M", "prompt": "\\ud800"}', "prompt"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_its_field(live, path, body, param):
    server, _ = live
    r = post(server.url, path, body.replace('"M"', json.dumps(TEST_MODEL)))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(f"{param}: holds a lone surrogate"), err
    assert "codec" not in err["message"]
