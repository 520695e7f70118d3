"""The OpenAI bodies of a generation call, built from its engine outputs: the whole response, or the stream.

Streams send `data: {chunk}` per engine step that produced text, the finish reason on the last chunk of each
choice, a usage chunk (`choices: []`) when `stream_options.include_usage` is set, then `data: [DONE]`. Chunks
whose text is empty (held back for a possible stop string, or an incomplete UTF-8 character) are not sent. A
server stop ends each unfinished choice with finish_reason "abort" and a 503 error event; an engine failure with
a 500 error event. Whatever ends a call, its requests are aborted (OpenAIServing.abort).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from refengine.entrypoints.async_engine import EngineError
from refengine.entrypoints.protocol import usage
from refengine.entrypoints.serving import ENGINE_FAILED, Call, OpenAIServing, ShutdownAbort


async def full_response(serving: OpenAIServing, call: Call) -> dict[str, Any]:
    """The whole body of a call that did not ask to stream (every choice, the usage)."""
    texts = [""] * len(call.prompt_ids)
    counts = [0] * len(call.prompt_ids)
    reasons: list[str | None] = [None] * len(call.prompt_ids)
    stops: list[int | str | None] = [None] * len(call.prompt_ids)
    try:
        async for i, out in serving.outputs(call):
            c = out.outputs[0]
            texts[i] += c.text
            counts[i] += len(c.token_ids)
            reasons[i], stops[i] = c.finish_reason, c.stop_reason
    finally:  # an error in one prompt of the call ends the others too
        serving.abort(call)
    choices = []
    for i, text in enumerate(texts):
        choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": reasons[i], "stop_reason": stops[i]}
        if call.kind == "completion":
            choice["text"] = text
        else:
            choice["message"] = {"role": "assistant", "content": text}
        choices.append(choice)
    return {
        "id": call.id,
        "object": call.object,
        "created": call.created,
        "model": call.model,
        "choices": choices,
        "usage": usage(sum(map(len, call.prompt_ids)), sum(counts)),
    }


async def stream_response(serving: OpenAIServing, call: Call) -> AsyncIterator[str]:
    """The SSE events of a streaming call, ending with `data: [DONE]` (see the module docstring)."""
    counts = [0] * len(call.prompt_ids)
    obj = "text_completion" if call.kind == "completion" else "chat.completion.chunk"
    extra: dict[str, dict[str, int] | None] = {"usage": None} if call.include_usage else {}

    def chunk(choices: list[dict[str, Any]]) -> str:
        body = {"id": call.id, "object": obj, "created": call.created, "model": call.model, "choices": choices, **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    try:
        if call.kind == "chat":  # OpenAI opens every chat choice with the role
            yield chunk(
                [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                    for i in range(len(call.prompt_ids))
                ]
            )
        async for i, out in serving.outputs(call):
            c = out.outputs[0]
            counts[i] += len(c.token_ids)
            if not c.text and not out.finished:
                continue
            finish = c.finish_reason if out.finished else None
            choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": finish}
            if out.finished:
                choice["stop_reason"] = c.stop_reason
            if call.kind == "completion":
                choice["text"] = c.text
            else:
                choice["delta"] = {"content": c.text} if c.text else {}
            yield chunk([choice])
        if call.include_usage:
            extra["usage"] = usage(sum(map(len, call.prompt_ids)), sum(counts))
            yield chunk([])
    except ShutdownAbort as e:  # a final chunk for each unfinished choice, then why
        for i in sorted(set(range(len(call.prompt_ids))) - call.done):
            choice = {"index": i, "logprobs": None, "finish_reason": "abort", "stop_reason": None}
            if call.kind == "completion":
                choice["text"] = ""
            else:
                choice["delta"] = {}
            yield chunk([choice])
        err = {"error": {"message": str(e), "type": "ServiceUnavailableError", "param": None, "code": 503}}
        yield f"data: {json.dumps(err)}\n\n"
    except EngineError:
        err = {"error": {"message": ENGINE_FAILED, "type": "InternalServerError", "param": None, "code": 500}}
        yield f"data: {json.dumps(err)}\n\n"
    finally:  # normal end, client disconnect (cancellation) or error: nothing of this call keeps running
        serving.abort(call)
    yield "data: [DONE]\n\n"
