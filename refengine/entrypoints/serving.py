"""The two generation endpoints: prompts -> engine requests -> OpenAI response bodies or SSE chunks.

A completion request may carry several prompts (a list of strings or of token-id lists): each is one engine request
and one choice, with `index` the prompt's position. The bodies built from its outputs (whole, or streamed as
SSE chunks) are refengine/entrypoints/responses.py's. If the client goes away, every request of the call is
aborted, which frees its KV blocks at the engine's next step.

A call's prompts reach the engine together, all or nothing (one command to the engine thread), so a many-prompt
call costs one engine step to admit, not one step per prompt. Chat rendering, tokenising and detokenising run in a
worker thread, never on the event loop, and list lengths are checked before anything walks a list. Error texts say
what the client sent wrong; an engine failure is logged and reported without its internals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from refengine.entrypoints.async_engine import AsyncLLMEngine, BatchRefused, EngineError, NewItem, StreamItem
from refengine.entrypoints.chat import ChatRender, render_messages
from refengine.entrypoints.protocol import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    new_id,
    now,
)
from refengine.entrypoints.server_limits import MAX_PROMPTS_PER_CALL
from refengine.outputs import CompletionOutput, RequestOutput
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


def merged(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """Two successive delta outputs of one request as one: the new tokens and text of both, `b`'s ending."""
    ca, cb = a.outputs[0], b.outputs[0]
    both = CompletionOutput(
        cb.index, ca.text + cb.text, ca.token_ids + cb.token_ids, cb.finish_reason, cb.stop_reason, cb.error
    )
    return RequestOutput(b.request_id, b.prompt, b.prompt_token_ids, [both], b.finished, b.metrics)


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
    cache_salt: str | None = None  # vLLM's request field: the call's prompts share cached prefixes only under it
    queue: asyncio.Queue[StreamItem] = field(default_factory=asyncio.Queue)
    request_ids: list[str] = field(default_factory=list)
    done: set[int] = field(default_factory=set)

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion"


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, model_name: str, chat_render: ChatRender) -> None:
        self.engine, self.model_name, self.chat_render = engine, model_name, chat_render
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len = engine.engine.max_model_len
        self.vocab_size = engine.engine.model_config.vocab_size
        self.live: dict[str, Call] = {}  # calls submitted and not yet ended, by id: what a shutdown aborts
        self.closed: str | None = None  # set by abort_all: a call still being built is refused with it

    # ---- building calls -------------------------------------------------------------------------------------
    def _encode_all(self, prompts: Sequence[str | list[int]], param: str) -> list[list[int]]:
        """(in a worker thread) Text prompts -> ids; id lists are checked for length first, then copied."""
        out: list[list[int]] = []
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

    async def _tokenize(self, prompts: Sequence[str | list[int]], param: str) -> list[list[int]]:
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
        for ids in prompt_ids:
            self._check_room(len(ids), req.max_tokens, "max_tokens")
        params = self._params(req, req.max_tokens, "max_tokens", {})
        return Call(
            "completion", new_id("cmpl"), self.model_name, now(), prompt_ids, params, req.include_usage, req.cache_salt
        )

    async def chat_call(self, req: ChatCompletionRequest) -> Call:
        req.check()
        text = await asyncio.to_thread(render_messages, self.chat_render, req.messages, req.add_generation_prompt)
        [ids] = await self._tokenize([text], "messages")
        requested = req.requested_max_tokens()
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        self._check_room(len(ids), requested, name)
        # OpenAI's default for chat: as many tokens as the context leaves
        max_tokens = requested if requested is not None else max(1, self.max_model_len - len(ids))
        params = self._params(req, max_tokens, name, {"max_tokens": name})
        return Call(
            "chat", new_id("chatcmpl"), self.model_name, now(), [ids], params, req.include_usage, req.cache_salt
        )

    def _check_room(self, prompt_len: int, max_tokens: int | None, param: str) -> None:
        """A prompt must leave room for the `max_tokens` asked for: a 400 naming both numbers, as vLLM's server words
        it, where the engine would stop at the context's end (a prompt that alone fills the context is the
        engine's refusal, and the offline `LLM` API keeps stopping at the context's end, as vLLM's does)."""
        if max_tokens is None or not isinstance(max_tokens, int) or prompt_len >= self.max_model_len:
            return
        if prompt_len + max_tokens > self.max_model_len:
            raise BadRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
                f"length is {self.max_model_len} tokens and your request has {prompt_len} input tokens "
                f"({max_tokens} > {self.max_model_len} - {prompt_len}). (parameter={param}, value={max_tokens})",
                param,
            )

    async def tokenize(self, req: TokenizeRequest) -> dict[str, Any]:
        """vLLM's /tokenize answer: the ids the engine would get for this prompt (or these chat messages)."""
        req.check()
        if req.messages is not None:
            text = await asyncio.to_thread(render_messages, self.chat_render, req.messages, req.add_generation_prompt)
            [ids] = await self._tokenize([text], "messages")
        else:
            assert req.prompt is not None, "check(): exactly one of prompt and messages"
            [ids] = await self._tokenize([req.prompt], "prompt")
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None}

    def _decode(self, tokens: list[int]) -> str:
        """(in a worker thread) The vocabulary check walks the list, so it runs here too."""
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"tokens: ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}", "tokens")
        return self.tokenizer.decode(tokens)

    async def detokenize(self, req: DetokenizeRequest) -> dict[str, str]:
        return {"prompt": await asyncio.to_thread(self._decode, req.tokens)}

    def _params(
        self, req: CompletionRequest | ChatCompletionRequest, max_tokens: int | None, name: str, renames: dict[str, str]
    ) -> SamplingParams:
        if max_tokens is None:
            max_tokens = 16
        try:
            return req.sampling_params(max_tokens)
        except ValueError as e:
            raise BadRequest(
                str(e), param_of(str(e), set(SamplingParams.__dataclass_fields__), "prompt", renames)
            ) from None

    async def reset_prefix_cache(self) -> bool:
        """vLLM's POST /reset_prefix_cache: True once every cached prefix is forgotten; False (nothing changed)
        while a request holds KV blocks, as vLLM's engine refuses without reset_running_requests."""
        return await self.engine.reset_prefix_cache()

    async def submit(self, call: Call, priority: int) -> None:
        """Queue every prompt of the call at once, all or nothing; a refused one is a 400 naming its field."""
        if self.closed:  # it was still tokenising when the server aborted everything
            raise ShutdownAbort(self.closed)
        prompt_param = "prompt" if call.kind == "completion" else "messages"
        salt = call.cache_salt
        items: list[NewItem] = [
            (f"{call.id}-{i}", ids if salt is None else {"prompt_token_ids": ids, "cache_salt": salt}, i)
            for i, ids in enumerate(call.prompt_ids)
        ]
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
        """Each output of the call's requests as (prompt index, output); the outputs of one request already
        queued together (the loop fell behind the engine) come as one, so a stream writes one chunk for them."""
        held: StreamItem | None = None
        while len(call.done) < len(call.prompt_ids):
            tag, out = held if held is not None else await call.queue.get()
            held = None
            while isinstance(out, RequestOutput) and not out.finished and not call.queue.empty():
                nxt = call.queue.get_nowait()
                if nxt[0] != tag or not isinstance(nxt[1], RequestOutput):
                    held = nxt
                    break
                out = merged(out, nxt[1])
            if isinstance(out, ShutdownAbort):
                raise out
            if isinstance(out, Exception):  # (an EngineError: the engine thread failed every request in flight)
                call.done = set(range(len(call.prompt_ids)))
                raise out
            index = cast(int, tag)  # submit() tags each request with its prompt's index
            if out.finished:
                call.done.add(index)
                if out.outputs[0].error:  # the engine aborted this request because something failed inside it
                    log.error("request %s failed: %s", out.request_id, out.outputs[0].error)
                    raise EngineError(ENGINE_FAILED)
            yield index, out
