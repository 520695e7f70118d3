"""`cbbench serve` takes vLLM's `cache_salt` request field and POST /reset_prefix_cache, against a real server on
127.0.0.1: the salt keeps prefixes apart across calls and shares them within one salt (completions and chat), a bad
salt is a 400 naming the field, the reset forgets every cached prefix, stands behind the API key, and is refused
(409) while a request holds KV blocks. Hits are read as a client reads them: vLLM's prefix-cache counters on
/metrics."""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")

from conformance.engine_helpers import TEST_MODEL, make_prompts  # noqa: E402
from refengine.engine.llm_engine import LLMEngine  # noqa: E402
from refengine.tests.live_server import live_server  # noqa: E402

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BLOCK = 16
PROMPT = make_prompts((3 * BLOCK + 5,), seed=11)[0]  # three full blocks: a hit is 48 tokens
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
LONG_OUTPUT = 2000  # tokens: the request still runs when the reset arrives (it is cancelled right after)


@pytest.fixture(scope="module")
def live():
    """One server for the module (its stop shuts its engine down); each test starts from an empty prefix cache."""
    with live_server(LLMEngine(TEST_MODEL, max_num_seqs=4, block_size=BLOCK, stats_log_size=1), api_key=KEY) as live:
        yield live


@pytest.fixture
def url(live) -> str:
    assert httpx.post(live.url + "/reset_prefix_cache", headers=AUTH, timeout=60).status_code == 200
    return live.url


def _complete(url: str, salt: str | None = None, prompt: object = PROMPT) -> httpx.Response:
    body = {"model": TEST_MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0.0, "ignore_eos": True}
    if salt is not None:
        body["cache_salt"] = salt
    return httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=60)


def _hits_of(live, send) -> float:
    """The prefix-cache hit tokens the server counted for what `send()` sent."""
    before = live.metric(HITS)
    r = send()
    assert r.status_code == 200, r.text
    return live.metric(HITS) - before


def test_the_salt_keeps_prefixes_apart_and_one_salt_shares_them(live, url):
    full = 3 * BLOCK
    assert _hits_of(live, lambda: _complete(live.url)) == 0
    assert _hits_of(live, lambda: _complete(live.url, "run-a")) == 0
    assert _hits_of(live, lambda: _complete(live.url, "run-b")) == 0
    assert _hits_of(live, lambda: _complete(live.url, "run-a")) == full
    assert _hits_of(live, lambda: _complete(live.url)) == full
    queries = live.metric(QUERIES)
    assert queries >= 5 * len(PROMPT)  # every admitted prompt is counted as queried

    def chat(salt: str) -> httpx.Response:
        body = {
            "model": TEST_MODEL,
            "messages": [{"role": "user", "content": "a question long enough to fill a few KV blocks " * 6}],
            "max_tokens": 2,
            "cache_salt": salt,
        }
        return httpx.post(live.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)

    assert _hits_of(live, lambda: chat("chat-1")) == 0
    assert _hits_of(live, lambda: chat("chat-2")) == 0
    assert _hits_of(live, lambda: chat("chat-1")) > 0


@pytest.mark.parametrize("salt", ["", 5, ["a"]], ids=["empty", "int", "list"])
def test_a_bad_salt_is_a_400_naming_the_field(url, salt):
    r = _complete(url, salt)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "cache_salt", r.text


def test_the_reset_forgets_every_prefix_and_needs_the_api_key(live, url):
    _complete(live.url)
    assert _hits_of(live, lambda: _complete(live.url)) == 3 * BLOCK  # warm
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert httpx.post(live.url + "/reset_prefix_cache", headers=headers).status_code == 401
    assert _hits_of(live, lambda: _complete(live.url)) == 3 * BLOCK  # a refused caller reset nothing
    r = httpx.post(live.url + "/reset_prefix_cache", headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    assert _hits_of(live, lambda: _complete(live.url)) == 0  # cold again
    r = httpx.post(live.url + "/reset_prefix_cache?reset_running_requests=true", headers=AUTH, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reset_running_requests", r.text


def test_the_reset_is_refused_while_a_request_holds_blocks(live, url):
    body = {"model": TEST_MODEL, "prompt": PROMPT, "max_tokens": LONG_OUTPUT, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, headers=AUTH, timeout=120) as stream:
        lines = stream.iter_lines()  # (held: a dropped line iterator closes the stream, which aborts the request)
        for line in lines:  # the first token: the request is running and holds its blocks
            if line.startswith("data:") and json.loads(line[5:])["choices"]:
                break
        r = httpx.post(live.url + "/reset_prefix_cache", headers=AUTH, timeout=60)
        assert r.status_code == 409 and r.json()["error"]["type"] == "ConflictError", r.text
    # the stream is closed: the server aborts the request; once its blocks are back the reset goes through
    for _ in range(200):
        r = httpx.post(live.url + "/reset_prefix_cache", headers=AUTH, timeout=60)
        if r.status_code == 200:
            break
        time.sleep(0.05)
    assert r.status_code == 200, r.text
