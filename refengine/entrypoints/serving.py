"""The two generation endpoints: prompts -> engine requests -> OpenAI response bodies or SSE chunks.

A completion request may carry several prompts (a list of strings or of token-id lists): each is one engine request
and one choice, with `index` the prompt's position. Streams send `data: {chunk}` per engine step that produced text,
the finish reason on the last chunk of each choice, a usage chunk (`choices: []`) when
`stream_options.include_usage` is set, then `data: [DONE]`. Chunks whose text is empty (held back for a possible
stop string, or an incomplete UTF-8 character) are not sent. If the client goes away, every request of the call is
aborted, which frees its KV blocks at the engine's next step.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from refengine.entrypoints.async_engine import AsyncLLMEngine, EngineError
from refengine.entrypoints.chat import render_messages
from refengine.entrypoints.protocol import (BadRequest, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                            TokenizeRequest, new_id, now, usage)
from refengine.outputs import RequestOutput
from refengine.sampling_params import SamplingParams

_PROMPT_WORDS = ("prompt", "prompt_token_ids")


def param_of(message: str, fields: set[str], prompt_param: str, renames: dict[str, str] | None = None) -> str | None:
    """The request field a ValueError from SamplingParams / the engine is about (its message starts with it)."""
    word = message.split(" ", 1)[0].strip("(:,")
    if word in _PROMPT_WORDS:
        return prompt_param
    if word in fields:
        return (renames or {}).get(word, word)
    return None


@dataclass
class Call:
    """One HTTP generation call: its engine requests (one per prompt) and where their outputs arrive."""

    kind: str  # "completion" | "chat"
    id: str
    model: str
    created: int
    prompt_ids: list[list[int]]
    params: SamplingParams
    include_usage: bool = False
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    request_ids: list[str] = field(default_factory=list)
    done: set[int] = field(default_factory=set)

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion"


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, model_name: str, chat_render: Callable) -> None:
        self.engine, self.model_name, self.chat_render = engine, model_name, chat_render
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len = engine.engine.max_model_len

    # ---- building calls -------------------------------------------------------------------------------------
    def _tokenize(self, prompt: str | list, param: str) -> list[int]:
        if isinstance(prompt, str):
            try:
                return self.tokenizer.encode(prompt)
            except ValueError as e:  # a model folder without a tokenizer: text prompts are refused
                raise BadRequest(str(e), param) from None
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise BadRequest("prompt must be a string, a list of token ids, or a list of either", param)
        return list(prompt)

    def completion_call(self, req: CompletionRequest) -> Call:
        prompt_ids = [self._tokenize(p, "prompt") for p in req.prompts()]
        params = self._params(req, req.max_tokens, "max_tokens", {})
        return Call("completion", new_id("cmpl"), self.model_name, now(), prompt_ids, params, req.include_usage)

    def chat_call(self, req: ChatCompletionRequest) -> Call:
        req.check()
        text = render_messages(self.chat_render, req.messages, req.add_generation_prompt)
        ids = self._tokenize(text, "messages")
        requested = req.requested_max_tokens()
        # OpenAI's default for chat: as many tokens as the context leaves
        max_tokens = requested if requested is not None else max(1, self.max_model_len - len(ids))
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        params = self._params(req, max_tokens, name, {"max_tokens": name})
        return Call("chat", new_id("chatcmpl"), self.model_name, now(), [ids], params, req.include_usage)

    def tokenize(self, req: TokenizeRequest) -> dict:
        """vLLM's /tokenize answer: the ids the engine would get for this prompt (or these chat messages)."""
        req.check()
        if req.messages is not None:
            ids = self._tokenize(render_messages(self.chat_render, req.messages, req.add_generation_prompt),
                                 "messages")
        else:
            ids = self._tokenize(req.prompt, "prompt")
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None}

    def detokenize(self, req: DetokenizeRequest) -> dict:
        vocab = self.engine.engine.model_config.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"tokens: ids outside the vocabulary [0, {vocab}): {bad[:5]}", "tokens")
        return {"prompt": self.tokenizer.decode(req.tokens)}

    def _params(self, req, max_tokens: int | None, name: str, renames: dict[str, str]) -> SamplingParams:
        if max_tokens is None:
            max_tokens = 16
        try:
            return req.sampling_params(max_tokens)
        except ValueError as e:
            raise BadRequest(str(e), param_of(str(e), set(SamplingParams.__dataclass_fields__), "prompt",
                                              renames)) from None

    async def submit(self, call: Call, priority: int) -> None:
        """Queue every prompt of the call; if one is refused, abort those already queued and re-raise (400)."""
        prompt_param = "prompt" if call.kind == "completion" else "messages"
        for i, ids in enumerate(call.prompt_ids):
            rid = f"{call.id}-{i}"
            try:
                await self.engine.add_request(rid, ids, call.params, call.queue, tag=i, priority=priority)
            except ValueError as e:
                self.engine.abort(call.request_ids)
                msg = str(e) if len(call.prompt_ids) == 1 else f"prompt {i}: {e}"
                raise BadRequest(msg, param_of(str(e), set(SamplingParams.__dataclass_fields__) | {"priority"},
                                               prompt_param)) from None
            call.request_ids.append(rid)

    def abort(self, call: Call) -> None:
        pending = [rid for i, rid in enumerate(call.request_ids) if i not in call.done]
        self.engine.abort(pending)

    async def outputs(self, call: Call) -> AsyncIterator[tuple[int, RequestOutput]]:
        while len(call.done) < len(call.prompt_ids):
            index, out = await call.queue.get()
            if isinstance(out, EngineError):
                call.done = set(range(len(call.prompt_ids)))
                raise out
            if out.finished:
                call.done.add(index)
                if out.outputs[0].error:  # the engine aborted this request because something failed inside it
                    raise EngineError(out.outputs[0].error)
            yield index, out

    # ---- bodies ---------------------------------------------------------------------------------------------
    async def full_response(self, call: Call) -> dict:
        texts = [""] * len(call.prompt_ids)
        counts = [0] * len(call.prompt_ids)
        reasons: list = [None] * len(call.prompt_ids)
        stops: list = [None] * len(call.prompt_ids)
        try:
            async for i, out in self.outputs(call):
                c = out.outputs[0]
                texts[i] += c.text
                counts[i] += len(c.token_ids)
                reasons[i], stops[i] = c.finish_reason, c.stop_reason
        finally:  # an error in one prompt of the call ends the others too
            self.abort(call)
        choices = []
        for i, text in enumerate(texts):
            choice = {"index": i, "logprobs": None, "finish_reason": reasons[i], "stop_reason": stops[i]}
            if call.kind == "completion":
                choice["text"] = text
            else:
                choice["message"] = {"role": "assistant", "content": text}
            choices.append(choice)
        return {"id": call.id, "object": call.object, "created": call.created, "model": call.model,
                "choices": choices, "usage": usage(sum(map(len, call.prompt_ids)), sum(counts))}

    async def stream(self, call: Call) -> AsyncIterator[str]:
        counts = [0] * len(call.prompt_ids)
        obj = "text_completion" if call.kind == "completion" else "chat.completion.chunk"
        extra = {"usage": None} if call.include_usage else {}

        def chunk(choices: list) -> str:
            body = {"id": call.id, "object": obj, "created": call.created, "model": call.model,
                    "choices": choices, **extra}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        try:
            if call.kind == "chat":  # OpenAI opens every chat choice with the role
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(len(call.prompt_ids))])
            async for i, out in self.outputs(call):
                c = out.outputs[0]
                counts[i] += len(c.token_ids)
                if not c.text and not out.finished:
                    continue
                choice = {"index": i, "logprobs": None, "finish_reason": c.finish_reason if out.finished else None}
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
        except EngineError as e:
            err = {"error": {"message": str(e), "type": "InternalServerError", "param": None, "code": 500}}
            yield f"data: {json.dumps(err)}\n\n"
        finally:  # normal end, client disconnect (cancellation) or error: nothing of this call keeps running
            self.abort(call)
        yield "data: [DONE]\n\n"
