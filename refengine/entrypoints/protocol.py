"""Request and response shapes of the OpenAI-compatible API (the fields vLLM's server takes), and their mapping onto
SamplingParams.

Unknown request fields are accepted and ignored, as OpenAI clients send many optional ones; fields the engine
cannot honour (n > 1, logprobs, echo, suffix, best_of > 1, tools, and vLLM's logit_bias, bad_words, ... at other
than their defaults) are rejected with a 400 naming the field rather than silently ignored, so that a client never
mistakes an unsupported answer for a real one. The penalties and min_p pass through to SamplingParams, whose
ValueError (naming the field) is the 400.

Types are strict, as the Python API has them: "5" is not an int, "no" not a bool, true not a token id (pydantic's
strict mode; an int is still a float). Ranges are SamplingParams' own, which are vLLM's.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from refengine.sampling_params import SamplingParams


class BadRequest(ValueError):
    """Client input the server refuses: HTTP 400 (or `status`) with an OpenAI-style error naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


# The error `type` per status: the OpenAI SDK's exception names where it has one, so a client can tell its own
# mistake (4xx) from the server's (5xx) by the type alone.
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "BadRequestError" if 400 <= status < 500 else "InternalServerError")


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": status}}


LONE_SURROGATE = "lone_surrogate"  # the pydantic error type of a string UTF-8 cannot hold (api_server names the field)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_path(value: Any, path: str) -> tuple[str, str] | None:
    """(the dotted field path, the code point) of the first string in `value` (a dict's keys included) holding a
    lone surrogate, or None. JSON's `\\ud800` escape parses to one; UTF-8 cannot encode it, so no answer naming it
    could be sent. It runs on the event loop for every request, so it costs no Python step per character or per
    token id: strings are searched by the regex engine, and a list of numbers (a prompt's 450k token ids) is
    skipped (a string inside one fails the field's strict type instead)."""
    if isinstance(value, str):
        bad = _SURROGATE.search(value)
        return (path, f"U+{ord(bad.group()):04X}") if bad is not None else None
    if isinstance(value, list):
        if value and isinstance(value[0], (int, float)):
            return None
        items: Any = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, item in items:
        where = f"{path}.{key}" if path else str(key)
        found = (_surrogate_path(key, path or "body") if isinstance(key, str) else None) or _surrogate_path(item, where)
        if found is not None:
            return found
    return None


class _Utf8Body(BaseModel):
    """A request body whose every string (any field, known or not, and the keys) is valid Unicode: a lone surrogate
    is a 400 naming its field, not the codec error that encoding an answer with it in would raise."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        found = _surrogate_path(data, "") if isinstance(data, dict) else None
        if found is not None:
            field, char = found
            raise PydanticCustomError(
                LONE_SURROGATE,
                "{field}: holds a lone surrogate ({char}), which is not text UTF-8 can carry; send valid Unicode",
                {"field": field, "char": char},
            )
        return data


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(_Utf8Body):
    """Fields both endpoints share: OpenAI's and vLLM's extra sampling parameters."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    n: int = 1
    best_of: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    # vLLM's sampling extras that refengine does not implement: SamplingParams refuses them unless at the default
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None
    user: str | None = None
    priority: int = 0
    # vLLM's: requests share cached prefixes only under the same salt (refengine/kv_cache/block_pool.py)
    cache_salt: str | None = None

    def _check_common(self) -> None:
        if self.n != 1:
            raise BadRequest(f"n must be 1 (this server returns one choice per prompt), got {self.n}", "n")
        if self.best_of not in (None, 1):
            raise BadRequest(f"best_of must be 1 or unset, got {self.best_of}", "best_of")
        if self.stream_options is not None and not self.stream:
            raise BadRequest("stream_options is only allowed when stream is true", "stream_options")
        if self.cache_salt is not None and not self.cache_salt:  # (a non-string fails the field's strict type)
            raise BadRequest("cache_salt must be a non-empty string if provided", "cache_salt")

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """Defaults as vLLM's server: temperature 1, top_p 1, top_k off. A ValueError names its field."""
        kw: dict[str, Any] = dict(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop=[self.stop] if isinstance(self.stop, str) else self.stop,
            stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output,
            seed=self.seed,
        )
        for name, default in (
            ("temperature", 1.0),
            ("top_p", 1.0),
            ("top_k", 0),
            ("presence_penalty", 0.0),
            ("frequency_penalty", 0.0),
            ("repetition_penalty", 1.0),
            ("min_p", 0.0),
        ):
            value = getattr(self, name)
            kw[name] = default if value is None else value
        for name in _PASSED_THROUGH:
            kw[name] = getattr(self, name)
        return SamplingParams(**kw)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


_PASSED_THROUGH = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "prompt_logprobs",
)

Prompt = str | list[int] | list[str] | list[list[int]]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    max_tokens: int | None = 16  # OpenAI's default for /v1/completions
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string or a list of token ids (a batch of either is a list of them)."""
        self._check_common()
        for name in ("echo", "suffix"):
            if getattr(self, name):
                raise BadRequest(f"{name} is not supported", name)
        if self.logprobs is not None:
            raise BadRequest("logprobs is not supported", "logprobs")
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise BadRequest("prompt must not be empty", "prompt")
        if isinstance(p[0], int):  # pydantic has checked the list is all ids: one look, not a walk
            return [p]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """String content, or the text parts of a content list (other part types are refused)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(
                    f"messages: only text content parts are supported, got {part.get('type')!r}", "messages"
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    add_generation_prompt: bool = True

    def check(self) -> None:
        self._check_common()
        if self.logprobs or self.top_logprobs:
            raise BadRequest("logprobs is not supported", "logprobs")
        if self.tools:
            raise BadRequest("tools are not supported", "tools")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class TokenizeRequest(_Utf8Body):
    """vLLM's POST /tokenize: a completion `prompt`, or chat `messages` (rendered with the chat template as
    /v1/chat/completions renders them); the tokens are the ones the engine would get."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # (the engine's tokenizer adds what it always adds; accepted for vLLM clients)
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise BadRequest("give exactly one of prompt and messages", "prompt")
        if self.return_token_strs:
            raise BadRequest("return_token_strs is not supported", "return_token_strs")


class DetokenizeRequest(_Utf8Body):
    """vLLM's POST /detokenize: token ids -> text, as the engine decodes its outputs."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    tokens: list[int]
