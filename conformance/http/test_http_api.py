"""OpenAI API conformance over HTTP: response shapes, exact max_tokens, stop strings, streaming = non-streaming,
usage counts. Greedy requests (temperature 0), with vLLM's ignore_eos where the server takes it (`Server.greedy`),
so that every answer is deterministic and its length known; a random-weight model makes the text gibberish, which
is all these checks need."""

from __future__ import annotations

import re

import pytest

from conformance.http.client import Server

PROMPTS = ["The quick brown fox", "Once upon a time in a land far away", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def srv(server: Server) -> Server:
    return server


def _messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_lists_the_served_model(srv):
    body = srv.http.get("/v1/models").json()
    assert body["object"] == "list"
    assert body["data"] and isinstance(body["data"][0]["id"], str)
    assert body["data"][0]["object"] == "model"


def test_completion_response_shape(srv):
    body = srv.complete(prompt=PROMPTS[0], max_tokens=5, **srv.greedy)
    assert body["object"] == "text_completion" and isinstance(body["id"], str) and body["id"]
    assert isinstance(body["created"], int) and body["model"] == srv.model
    [choice] = body["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length"
    u = body["usage"]
    assert u["completion_tokens"] == 5 and u["prompt_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_chat_response_shape(srv):
    body = srv.chat(messages=_messages(PROMPTS[1]), max_tokens=5, **srv.greedy)
    assert body["object"] == "chat.completion" and body["model"] == srv.model
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("n", [1, 7, 33])
def test_max_tokens_is_exact_with_ignore_eos(srv, n):
    body = srv.complete(prompt=PROMPTS[1], max_tokens=n, **srv.greedy)
    assert body["usage"]["completion_tokens"] == n
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_max_tokens_is_exact_with_ignore_eos(srv, field):
    body = srv.chat(messages=_messages(PROMPTS[0]), **{field: 9}, **srv.greedy)
    assert body["usage"]["completion_tokens"] == 9
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_deltas_concatenate_to_the_whole_text(srv, prompt):
    whole = srv.complete(prompt=prompt, max_tokens=24, **srv.greedy)
    streamed = srv.stream(prompt=prompt, max_tokens=24, **srv.greedy)
    assert streamed.done, "the stream did not end with data: [DONE]"
    assert streamed.text == whole["choices"][0]["text"]
    assert streamed.finish_reason == whole["choices"][0]["finish_reason"] == "length"
    assert {c["id"] for c in streamed.chunks} == {streamed.chunks[0]["id"]}, "one id for every chunk of a stream"
    assert all(c["object"] == "text_completion" for c in streamed.chunks)


def test_chat_stream_concatenates_to_the_whole_message(srv):
    msgs = _messages(PROMPTS[2])
    whole = srv.chat(messages=msgs, max_tokens=20, **srv.greedy)
    streamed = srv.stream("/v1/chat/completions", messages=msgs, max_tokens=20, **srv.greedy)
    assert streamed.done
    assert streamed.text == whole["choices"][0]["message"]["content"]
    assert streamed.finish_reason == "length"
    assert all(c["object"] == "chat.completion.chunk" for c in streamed.chunks)
    roles = [ch["delta"].get("role") for c in streamed.chunks for ch in c["choices"] if ch["delta"].get("role")]
    assert roles and set(roles) == {"assistant"}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_usage_counts(srv, path):
    n, chat = 12, "chat" in path
    fields = dict(max_tokens=n, **srv.greedy)
    if chat:
        fields["messages"] = _messages(PROMPTS[1])
    else:
        fields["prompt"] = PROMPTS[1]
    whole = srv.chat(**fields) if chat else srv.complete(**fields)
    streamed = srv.stream(path, stream_options={"include_usage": True}, **fields)
    assert streamed.usage is not None, "stream_options.include_usage gave no usage chunk"
    last = streamed.chunks[-1]
    assert last["choices"] == [] and last["usage"] == streamed.usage, "usage comes last, in a chunk of its own"
    assert streamed.usage["prompt_tokens"] == whole["usage"]["prompt_tokens"] > 0
    assert streamed.usage["completion_tokens"] == whole["usage"]["completion_tokens"] == n
    assert streamed.usage["total_tokens"] == streamed.usage["prompt_tokens"] + n


def test_token_id_prompt_counts_its_tokens(srv):
    ids = [40, 1079, 264, 2632, 315, 279, 1879, 13]  # small ids: inside any real vocabulary
    body = srv.complete(prompt=ids, max_tokens=4, **srv.greedy)
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 4


def test_no_usage_in_a_stream_unless_asked(srv):
    streamed = srv.stream(prompt=PROMPTS[0], max_tokens=4, **srv.greedy)
    assert streamed.usage is None and all(c.get("usage") is None for c in streamed.chunks)


def _stop_word(srv) -> tuple[str, str, str]:
    """(prompt, greedy text of 32 tokens, an ASCII word whose first occurrence is inside it, not at the start)."""
    for prompt in PROMPTS:
        full = srv.complete(prompt=prompt, max_tokens=32, **srv.greedy)["choices"][0]["text"]
        for m in re.finditer(r"[A-Za-z]{3,}", full):
            if m.start() > 0 and full.find(m.group()) == m.start():
                return prompt, full, m.group()
    pytest.skip("the model's greedy text holds no ASCII word to stop on")


@pytest.mark.parametrize("as_list", [True, False])
def test_stop_string_cuts_the_text(srv, as_list):
    prompt, full, word = _stop_word(srv)
    stop = [word] if as_list else word
    body = srv.complete(prompt=prompt, max_tokens=32, stop=stop, **srv.greedy)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == full[: full.find(word)], "the text ends just before the stop string"
    assert 0 < body["usage"]["completion_tokens"] < 32
    streamed = srv.stream(prompt=prompt, max_tokens=32, stop=stop, **srv.greedy)
    assert streamed.text == choice["text"] and streamed.finish_reason == "stop"


def test_include_stop_str_in_output(srv):
    """vLLM's extra field: the stop string stays in the text."""
    prompt, full, word = _stop_word(srv)
    r = srv.http.post(
        "/v1/completions",
        json=srv.body(prompt=prompt, max_tokens=32, stop=[word], include_stop_str_in_output=True, **srv.greedy),
    )
    if 400 <= r.status_code < 500:
        pytest.skip(f"the server refuses include_stop_str_in_output ({r.status_code})")
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == full[: full.find(word) + len(word)]
