"""The two generation endpoints: prompts -> engine requests -> OpenAI response bodies or SSE chunks.

A completion request may carry several prompts (a list of strings or of token-id lists): each is one engine request
and one choice, with `index` the prompt's position. Streams send `data: {chunk}` per engine step that produced text,
the finish reason on the last chunk of each choice, a usage chunk (`choices: []`) when
`stream_options.include_usage` is set, then `data: [DONE]`. Chunks whose text is empty (held back for a possible
stop string, or an incomplete UTF-8 character) are not sent. If the client goes away, every request of the call is
aborted, which frees its KV blocks at the engine's next step.

A call's prompts reach the engine together, all or nothing (one command to the engine thread), so a many-prompt
call costs one engine step to admit, not one step per prompt. Chat rendering, tokenising and detokenising run in a
worker thread, never on the event loop, and list lengths are checked before anything walks a list. Error texts say
what the client sent wrong; an engine failure is logged and reported without its internals.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from refengine.entrypoints.async_engine import AsyncLLMEngine, BatchRefused, EngineError
from refengine.entrypoints.chat import render_messages
from refengine.entrypoints.limits import MAX_PROMPTS_PER_CALL
from refengine.entrypoints.protocol import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    new_id,
    now,
    usage,
)
from refengine.outputs import RequestOutput
from refengine.sampling_params import SamplingParams

log = logging.getLogger("refengine.server")
_PROMPT_WORDS = ("prompt", "prompt_token_ids")
ENGINE_FAILED = "the engine failed while running this request (see the server log)"


class ShutdownAbort(Exception):
    """The server stopped before the call finished: streams end with finish_reason "abort", calls get a 503."""


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
        self.vocab_size = engine.engine.model_config.vocab_size
        self.live: dict[str, Call] = {}  # calls submitted and not yet ended, by id: what a shutdown aborts
        self.closed: str | None = None  # set by abort_all: a call still being built is refused with it

    # ---- building calls -------------------------------------------------------------------------------------
    def _encode_all(self, prompts: list, param: str) -> list[list[int]]:
        """(in a worker thread) Text prompts -> ids; id lists are checked for length first, then copied."""
        out = []
        for p in prompts:
            if isinstance(p, str):
                try:
                    out.append(self.tokenizer.encode(p))
                except ValueError as e:  # a model folder without a tokenizer: text prompts are refused
                    raise BadRequest(str(e), param) from None
                continue
            if len(p) > self.max_model_len:  # before anything walks a (possibly huge) list
                raise BadRequest(
                    f"{param}: {len(p)} token ids is longer than the maximum model length ({self.max_model_len})", param
                )
            out.append(list(p))
        return out

    async def _tokenize(self, prompts: list, param: str) -> list[list[int]]:
        return await asyncio.to_thread(self._encode_all, prompts, param)

    async def completion_call(self, req: CompletionRequest) -> Call:
        prompts = req.prompts()
        if len(prompts) > MAX_PROMPTS_PER_CALL:
            raise BadRequest(
                f"prompt: {len(prompts)} prompts in one call is more than this server's limit of "
                f"{MAX_PROMPTS_PER_CALL}",
                "prompt",
            )
        prompt_ids = await self._tokenize(prompts, "prompt")
        params = self._params(req, req.max_tokens, "max_tokens", {})
        return Call("completion", new_id("cmpl"), self.model_name, now(), prompt_ids, params, req.include_usage)

    async def chat_call(self, req: ChatCompletionRequest) -> Call:
        req.check()
        text = await asyncio.to_thread(render_messages, self.chat_render, req.messages, req.add_generation_prompt)
        [ids] = await self._tokenize([text], "messages")
        requested = req.requested_max_tokens()
        # OpenAI's default for chat: as many tokens as the context leaves
        max_tokens = requested if requested is not None else max(1, self.max_model_len - len(ids))
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        params = self._params(req, max_tokens, name, {"max_tokens": name})
        return Call("chat", new_id("chatcmpl"), self.model_name, now(), [ids], params, req.include_usage)

    async def tokenize(self, req: TokenizeRequest) -> dict:
        """vLLM's /tokenize answer: the ids the engine would get for this prompt (or these chat messages)."""
        req.check()
        if req.messages is not None:
            text = await asyncio.to_thread(render_messages, self.chat_render, req.messages, req.add_generation_prompt)
            [ids] = await self._tokenize([text], "messages")
        else:
            [ids] = await self._tokenize([req.prompt], "prompt")
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None}

    def _decode(self, tokens: list[int]) -> str:
        """(in a worker thread) The vocabulary check walks the list, so it runs here too."""
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"tokens: ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}", "tokens")
        return self.tokenizer.decode(tokens)

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        return {"prompt": await asyncio.to_thread(self._decode, req.tokens)}

    def _params(self, req, max_tokens: int | None, name: str, renames: dict[str, str]) -> SamplingParams:
        if max_tokens is None:
            max_tokens = 16
        try:
            return req.sampling_params(max_tokens)
        except ValueError as e:
            raise BadRequest(
                str(e), param_of(str(e), set(SamplingParams.__dataclass_fields__), "prompt", renames)
            ) from None

    async def submit(self, call: Call, priority: int) -> None:
        """Queue every prompt of the call at once, all or nothing; a refused one is a 400 naming its field."""
        if self.closed:  # it was still tokenising when the server aborted everything
            raise ShutdownAbort(self.closed)
        prompt_param = "prompt" if call.kind == "completion" else "messages"
        items = [(f"{call.id}-{i}", ids, i) for i, ids in enumerate(call.prompt_ids)]
        try:
            await self.engine.add_requests(items, call.params, call.queue, priority=priority)
        except ValueError as e:
            cause = e.error if isinstance(e, BatchRefused) else e
            raise BadRequest(
                str(e), param_of(str(cause), set(SamplingParams.__dataclass_fields__) | {"priority"}, prompt_param)
            ) from None
        call.request_ids = [rid for rid, _, _ in items]
        self.live[call.id] = call

    def abort(self, call: Call) -> None:
        self.live.pop(call.id, None)
        pending = [rid for i, rid in enumerate(call.request_ids) if i not in call.done]
        self.engine.abort(pending)

    def abort_all(self, reason: str) -> int:
        """Server stop: end every live call now (its requests aborted, its stream closed with `reason`)."""
        self.closed = reason
        calls = list(self.live.values())
        for call in calls:
            call.queue.put_nowait((None, ShutdownAbort(reason)))
            self.abort(call)
        return len(calls)

    async def outputs(self, call: Call) -> AsyncIterator[tuple[int, RequestOutput]]:
        while len(call.done) < len(call.prompt_ids):
            index, out = await call.queue.get()
            if isinstance(out, ShutdownAbort):
                raise out
            if isinstance(out, EngineError):
                call.done = set(range(len(call.prompt_ids)))
                raise out
            if out.finished:
                call.done.add(index)
                if out.outputs[0].error:  # the engine aborted this request because something failed inside it
                    log.error("request %s failed: %s", out.request_id, out.outputs[0].error)
                    raise EngineError(ENGINE_FAILED)
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
        return {
            "id": call.id,
            "object": call.object,
            "created": call.created,
            "model": call.model,
            "choices": choices,
            "usage": usage(sum(map(len, call.prompt_ids)), sum(counts)),
        }

    async def stream(self, call: Call) -> AsyncIterator[str]:
        counts = [0] * len(call.prompt_ids)
        obj = "text_completion" if call.kind == "completion" else "chat.completion.chunk"
        extra = {"usage": None} if call.include_usage else {}

        def chunk(choices: list) -> str:
            body = {
                "id": call.id,
                "object": obj,
                "created": call.created,
                "model": call.model,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        try:
            if call.kind == "chat":  # OpenAI opens every chat choice with the role
                yield chunk(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        for i in range(len(call.prompt_ids))
                    ]
                )
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
        except ShutdownAbort as e:  # a final chunk for each unfinished choice, then why
            for i in sorted(set(range(len(call.prompt_ids))) - call.done):
                choice = {"index": i, "logprobs": None, "finish_reason": "abort", "stop_reason": None}
                choice.update({"text": ""} if call.kind == "completion" else {"delta": {}})
                yield chunk([choice])
            err = {"error": {"message": str(e), "type": "ServiceUnavailableError", "param": None, "code": 503}}
            yield f"data: {json.dumps(err)}\n\n"
        except EngineError:
            err = {"error": {"message": ENGINE_FAILED, "type": "InternalServerError", "param": None, "code": 500}}
            yield f"data: {json.dumps(err)}\n\n"
        finally:  # normal end, client disconnect (cancellation) or error: nothing of this call keeps running
            self.abort(call)
        yield "data: [DONE]\n\n"
