"""`cbbench serve` in-process and refengine-specific: what the black-box HTTP suite (conformance/http) cannot ask of
every server. Every engine knob is a serve option; a bad knob is one line on stderr and exit 2; refused input is
exactly a 400 naming the field; unsupported OpenAI fields are refused, not ignored; several prompts give one choice
each; a failing engine step is a 500 for the requests in it and the server goes on; chat prompts use the folder's
template, else ChatML."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

# The serving extras (fastapi, pydantic) are pyproject dependencies, but a GPU box's own image may lack them:
# `pytest -m gpu conformance/` there must still collect.
pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")
from fastapi.testclient import TestClient  # noqa: E402

from conformance.http.test_http_errors import BAD
from refengine import LLM, SamplingParams
from refengine.engine.llm_engine import LLMEngine
from refengine.entrypoints.api_server import build_app
from refengine.entrypoints.chat import chat_renderer, chatml

MODEL = "tiny-qwen2"
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def served_engine() -> LLMEngine:
    return LLMEngine(MODEL, max_num_seqs=8, stats_log_size=1)  # (finished_requests keeps the last request)


@pytest.fixture(scope="module")
def client(served_engine):
    with TestClient(build_app(served_engine)) as c:  # runs the lifespan: the engine thread starts and stops with it
        yield c


def _post(client, path: str, **body):
    return client.post(path, json={"model": MODEL, **body})


def test_every_engine_knob_is_a_serve_option():
    from dataclasses import fields

    from cbbench.perf.cli import app
    from refengine.config import EngineConfig, SchedulerConfig

    serve = typer.main.get_command(app).commands["serve"]
    flags = {opt for p in serve.params for opt in p.opts}
    plumbing = {"scheduler", "stats_log_size"}  # SchedulerConfig.max_model_len is EngineConfig's, also checked
    for f in [*fields(SchedulerConfig), *fields(EngineConfig)]:
        if f.name not in plumbing:
            assert "--" + f.name.replace("_", "-") in flags, f"cbbench serve lacks --{f.name}"


@pytest.mark.parametrize("case", sorted(BAD))
def test_refused_input_is_a_400_naming_the_field(client, case):
    path, fields, about = BAD[case]
    body = (
        {"prompt": "Hello", "max_tokens": 4, **GREEDY}
        if "chat" not in path
        else {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, **GREEDY}
    )
    body.update(fields)
    r = _post(client, path, **{k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert err["param"] is not None and about in err["param"], err


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 2),
        ("logprobs", 1),
        ("echo", True),
        ("best_of", 3),
        ("suffix", "x"),
        ("logit_bias", {"100": 5.0}),
        ("presence_penalty", 2.5),
        ("repetition_penalty", 0),
        ("min_p", 1.5),
    ],
)
def test_unsupported_openai_fields_are_refused(client, field, value):
    r = _post(client, "/v1/completions", prompt="Hi", max_tokens=2, **{field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


PENALTIES = dict(frequency_penalty=1.2, presence_penalty=0.4, repetition_penalty=1.3)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_penalties_pass_through_to_the_same_tokens_as_in_process(client, served_engine, path, monkeypatch):
    """The served request's tokens (and text) equal an in-process LLM's on the same prompt ids and penalties, and
    differ from the penalty-free run (so the penalties did reach the sampler)."""
    served: dict[str, tuple[list[int], list[int]]] = {}  # request id -> (prompt ids, output ids), from the steps
    step = served_engine.step

    def recording_step():
        outs = step()
        for o in outs:
            served.setdefault(o.request_id, (list(o.prompt_token_ids), []))[1].extend(o.outputs[0].token_ids)
        return outs

    monkeypatch.setattr(served_engine, "step", recording_step)
    body = {"prompt": [9707, 1879, 11, 40]} if "chat" not in path else {"messages": [{"role": "user", "content": "Hi"}]}
    r = _post(client, path, max_tokens=10, **GREEDY, **PENALTIES, **body)
    assert r.status_code == 200, r.text
    ((prompt, tokens),) = served.values()
    choice = r.json()["choices"][0]
    text = choice["text"] if "chat" not in path else choice["message"]["content"]
    llm = LLM(MODEL)
    mine = llm.generate([prompt], SamplingParams(max_tokens=10, **GREEDY, **PENALTIES))[0]
    free = llm.generate([prompt], SamplingParams(max_tokens=10, **GREEDY))[0]
    assert tokens == mine.outputs[0].token_ids != free.outputs[0].token_ids
    assert text == mine.outputs[0].text and r.json()["usage"]["completion_tokens"] == 10


def test_unknown_model_is_404_and_extra_fields_are_ignored(client):
    r = client.post("/v1/completions", json={"model": "gpt-4", "prompt": "Hi"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = _post(client, "/v1/completions", prompt="Hi", max_tokens=2, some_future_field={"a": 1})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("prompts", [["The cat", "A dog and a"], [[9707, 1879, 11], [40, 1079]]])
def test_several_prompts_give_one_choice_each(client, prompts):
    whole = _post(client, "/v1/completions", prompt=prompts, max_tokens=6, **GREEDY).json()
    singles = [_post(client, "/v1/completions", prompt=p, max_tokens=6, **GREEDY).json() for p in prompts]
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert [c["text"] for c in whole["choices"]] == [s["choices"][0]["text"] for s in singles]
    assert whole["usage"]["completion_tokens"] == 12
    assert whole["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)


def test_vllm_extra_fields_are_honoured(client):
    """min_tokens holds off EOS / stop ids; stop_token_ids ends the request at the first sampled id listed."""
    first = _post(client, "/v1/completions", prompt="Hi there", max_tokens=8, **GREEDY).json()
    tokens = client.app.state.engine.engine.tokenizer.encode(first["choices"][0]["text"])
    stop_id = tokens[2]  # the text re-encodes to the same ids for this BPE's plain words
    r = _post(
        client, "/v1/completions", prompt="Hi there", max_tokens=8, stop_token_ids=[stop_id], temperature=0.0
    ).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] <= 3
    r = _post(
        client,
        "/v1/completions",
        prompt="Hi there",
        max_tokens=8,
        stop_token_ids=[stop_id],
        min_tokens=8,
        temperature=0.0,
    ).json()
    assert r["usage"]["completion_tokens"] == 8


def test_engine_failure_is_a_500_and_the_server_keeps_serving(client, monkeypatch):
    runner = client.app.state.engine.engine.model_runner
    real = runner.execute_model
    calls = {"n": 0}

    def fail_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("planted failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "execute_model", fail_once)
    r = _post(client, "/v1/completions", prompt="Hello", max_tokens=4, **GREEDY)
    err = r.json()["error"]  # a 500, and the body does not echo the server's exception text (that is logged)
    assert r.status_code == 500 and err["type"] == "InternalServerError", r.text
    assert "planted failure" not in err["message"] and "RuntimeError" not in err["message"], err
    r = _post(client, "/v1/completions", prompt="Hello", max_tokens=4, **GREEDY)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    sched = client.app.state.engine.engine.scheduler
    assert not sched.running and not sched.waiting and sched.kv_cache_manager.block_pool.num_used_blocks == 0


def test_chat_template_from_the_folder_else_chatml(tmp_path: Path):
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}"
        "[assistant]{% endif %}"
    )
    render, kind = chat_renderer(str(tmp_path))
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert kind == "folder" and render(msgs, True) == "[system]S[user]U[assistant]"
    render, kind = chat_renderer(MODEL)
    assert kind == "chatml" and render is chatml
    assert chatml(msgs, True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tokenize_and_detokenize_as_vllm(client, served_engine):
    """vLLM's /tokenize and /detokenize (what `vllm bench serve` and other vLLM clients call): the ids are the
    engine's own, chat messages render as /v1/chat/completions renders them, and bad input is a 400."""
    tok = served_engine.tokenizer
    r = _post(client, "/tokenize", prompt="Hello world")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode("Hello world") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == served_engine.max_model_len
    messages = [{"role": "user", "content": "Hi"}]
    chat = _post(client, "/tokenize", messages=messages).json()
    assert chat["tokens"] == tok.encode(chatml(messages))
    back = _post(client, "/detokenize", tokens=body["tokens"])
    assert back.status_code == 200 and back.json()["prompt"] == "Hello world"
    for path, fields, param in (
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": messages}, "prompt"),
        ("/tokenize", {"prompt": "a", "return_token_strs": True}, "return_token_strs"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "x"}, "tokens"),
    ):
        bad = _post(client, path, **fields)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (path, fields, bad.text)
    assert client.post("/tokenize", json={"model": "nope", "prompt": "a"}).status_code == 404
    assert client.get("/version").json()["version"]
