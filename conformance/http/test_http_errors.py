"""Bad requests get a 4xx with an OpenAI-style error body, an unknown model a 404, and the server keeps serving:
the next good request, and a stream that was running while the bad ones came in, still complete correctly."""

from __future__ import annotations

import threading

import pytest

from conformance.http.client import Server

GOOD = dict(prompt="Hello there", max_tokens=4)  # plus Server.greedy

# (endpoint, body fields replacing or adding to a good request, the field the error is about)
BAD = {
    "max_tokens_negative": ("/v1/completions", {"max_tokens": -1}, "max_tokens"),
    "max_tokens_not_a_number": ("/v1/completions", {"max_tokens": "many"}, "max_tokens"),
    "temperature_negative": ("/v1/completions", {"temperature": -0.5}, "temperature"),
    "top_p_zero": ("/v1/completions", {"top_p": 0.0}, "top_p"),
    "top_p_above_one": ("/v1/completions", {"top_p": 1.5}, "top_p"),
    "stop_not_a_string": ("/v1/completions", {"stop": 5}, "stop"),
    "prompt_missing": ("/v1/completions", {"prompt": None}, "prompt"),
    "prompt_token_out_of_vocab": ("/v1/completions", {"prompt": [10**9]}, "prompt"),
    "prompt_too_long": ("/v1/completions", {"prompt": [11] * 200_000}, "prompt"),
    "messages_empty": ("/v1/chat/completions", {"messages": []}, "messages"),
    "messages_not_a_list": ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    "message_without_role": ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages"),
}


@pytest.fixture(scope="module")
def srv(server: Server) -> Server:
    return server


def _body(srv: Server, path: str, fields: dict) -> dict:
    base = {**GOOD, **srv.greedy}
    if "chat" in path:
        base.pop("prompt")
        base["messages"] = [{"role": "user", "content": "Hello there"}]
    base.update(fields)
    return srv.body(**{k: v for k, v in base.items() if v is not None})


def _assert_openai_error(r, status_range=(400, 499), about: str | None = None) -> dict:
    assert status_range[0] <= r.status_code <= status_range[1], f"{r.status_code}: {r.text[:300]}"
    err = r.json().get("error")
    assert isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"], r.text[:300]
    if about is not None and err.get("param"):  # servers that name the field must name the right one
        assert about in str(err["param"]), f"error names {err['param']!r}, not {about!r}"
    return err


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_is_a_4xx_and_the_server_keeps_serving(srv, case):
    path, fields, about = BAD[case]
    r = srv.http.post(path, json=_body(srv, path, fields))
    _assert_openai_error(r, about=about)
    assert srv.complete(**GOOD, **srv.greedy)["usage"]["completion_tokens"] == GOOD["max_tokens"]


def test_invalid_json_is_a_4xx(srv):
    r = srv.http.post(
        "/v1/completions", content=b'{"prompt": "unterminated', headers={"content-type": "application/json"}
    )
    _assert_openai_error(r)
    assert srv.complete(**GOOD, **srv.greedy)["choices"][0]["finish_reason"] == "length"


def test_unknown_model_is_a_404(srv):
    r = srv.http.post("/v1/completions", json={**GOOD, "model": "no-such-model-anywhere"})
    _assert_openai_error(r, status_range=(404, 404))


def test_a_running_stream_survives_bad_requests(srv):
    result: dict = {}

    def run() -> None:
        result["out"] = srv.stream(prompt="A long story", max_tokens=48, **srv.greedy)

    t = threading.Thread(target=run)
    t.start()
    for case in sorted(BAD):
        path, fields, _ = BAD[case]
        assert 400 <= srv.http.post(path, json=_body(srv, path, fields)).status_code < 500
    t.join(timeout=120)
    out = result.get("out")
    assert out is not None, "the stream failed (see the thread's exception above)"
    assert out.done and out.finish_reason == "length"
    whole = srv.complete(prompt="A long story", max_tokens=48, **srv.greedy)
    assert out.text == whole["choices"][0]["text"]
