"""`cbbench perf --backend openai|openai-chat`: replay a workload against an OpenAI-compatible HTTP server.

The request shapes are those of vLLM's `bench serve` (`vllm/benchmarks/lib/endpoint_request_func.py`):
- openai: POST /v1/completions with the prompt as token ids (`--prompt-format ids`, the default: the server sees
  exactly the in-process run's prompt) or as text, `max_tokens` = the workload's output length;
- openai-chat: POST /v1/chat/completions, one user message holding the prompt's text (a multi-turn run's later
  turns: the history's user / assistant messages, `http_turns.py`), `max_completion_tokens`;
- both: `stream: true`, `stream_options.include_usage`, `temperature: 0` (greedy) and vLLM's `ignore_eos: true`, so
  an engine that honours it generates exactly the workload's output lengths; `ignore_eos=False` leaves the field
  out for servers that refuse unknown fields (transformers serve answers 422), and outputs may then be shorter;
  vLLM's `cache_salt` where the run has one (`--prefix-cache-isolation`, cache_isolation.py).

What is measured (one clock, `time.perf_counter()`, per request):
- arrival_time: when the request is sent (after `--max-concurrency`'s wait, as vLLM measures);
- a *content chunk* is a streamed choice that carries a token: a non-empty text / delta content, or (completions)
  an empty text that is not only a finish marker (vLLM: "text could be empty here, e.g. for special tokens");
  the chat role announcement and a trailing finish-only chunk are not content;
- first_token_time = the first content chunk (TTFT), `chunk_times` = every content chunk (ITL = their gaps),
  finish_time = the last content chunk;
- output_len = the server's `usage.completion_tokens`, else the count of the token ids its chunks carried (vLLM's
  `token_ids` on each choice, where the server sends them), else the tokenizer's count of the generated text (vLLM's
  fallback; never chunk by chunk: inference-perf issue 564 counted a BOS per chunk, nearly twice the tokens), else
  one per content chunk; `output_len_source` says which; prompt_len = `usage.prompt_tokens`, else the workload's; num_cached_tokens =
  `usage.prompt_tokens_details.cached_tokens` where the server reports it.
A request that fails (connection error, HTTP error, a stream without content, a usage whose counts are not whole
numbers >= 0 or disagree with the stream: `usage_counts`) is a record with finish_reason
"error" and its message: it is counted in `failed` and left out of every statistic; the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from cbbench.perf.records import HTTP_ERROR_KEYS, HTTP_REQUEST_KEYS, RequestRecord

ENDPOINTS = {
    "openai": "/v1/completions",
    "openai-chat": "/v1/chat/completions",
    "openai-embeddings": "/v1/embeddings",
}  # the last: openai_embeddings.py sends its own requests
PROMPT_FORMATS = ("ids", "text")
ERROR_TEXT_CHARS = 300  # how much of a failed response body a record keeps


@dataclass(frozen=True)
class HttpTarget:
    """Where and how to send requests."""

    backend: str  # "openai" | "openai-chat"
    base_url: str  # http://host:port (a trailing /v1 is accepted)
    model: str  # the served model name
    prompt_format: str = "ids"  # "ids" | "text" (openai-chat always sends text)
    ignore_eos: bool = True  # send vLLM's ignore_eos (exact output lengths)
    timeout_s: float = 6 * 3600  # per request, as vLLM's AIOHTTP_TIMEOUT
    cache_salt: str | None = None  # vLLM's request field, one per measured run (cache_isolation.py); None: not sent

    def __post_init__(self) -> None:
        if self.backend not in ENDPOINTS:
            raise ValueError(f"backend: unknown {self.backend!r}; expected refengine, {', '.join(ENDPOINTS)}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected http://HOST:PORT, got {self.base_url!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format: expected one of {PROMPT_FORMATS}, got {self.prompt_format!r}")
        if self.backend == "openai-chat" and self.prompt_format == "ids":
            object.__setattr__(self, "prompt_format", "text")  # a chat message has no token-id form
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/").removesuffix("/v1")

    @property
    def url(self) -> str:
        return self.root + ENDPOINTS[self.backend]


def build_payload(
    target: HttpTarget, prompt: str | list[int] | list[dict[str, str]], output_len: int
) -> dict[str, Any]:
    """One streaming request body, in vLLM `bench serve`'s shape (see the module docstring)."""
    common = {
        "model": target.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        **({"ignore_eos": True} if target.ignore_eos else {}),
        **({"cache_salt": target.cache_salt} if target.cache_salt is not None else {}),
    }
    if target.backend == "openai":
        return {**common, "prompt": prompt, "max_tokens": output_len}
    # a list of messages is a conversation's history and new turn; max_tokens too: servers that predate
    # max_completion_tokens read only that
    messages = (
        prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
        else [{"role": "user", "content": prompt}]
    )
    return {**common, "messages": messages, "max_completion_tokens": output_len, "max_tokens": output_len}


def auth_headers() -> dict[str, str]:
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def chunk_content(backend: str, choice: dict[str, Any]) -> str | None:
    """The text of a streamed choice if it is a content chunk (see the module docstring), else None."""
    finished = choice.get("finish_reason") is not None
    if backend == "openai":
        text: str | None = choice.get("text")
        if text is None or (text == "" and finished):
            return None
        return text
    delta = choice.get("delta") or {}
    text = delta.get("content") or delta.get("reasoning_content") or ""
    return text if text else None  # an empty chat delta is the role announcement or the finish marker


def error_record(request_id: str, prompt_len: int, output_len: int, arrival: float, error: str) -> RequestRecord:
    return RequestRecord(
        request_id,
        prompt_len,
        0,
        arrival,
        None,
        None,
        None,
        None,
        None,
        None,
        "error",
        requested_output_len=output_len,
        chunk_times=[],
        error=error[:ERROR_TEXT_CHARS],
        layout=HTTP_ERROR_KEYS,
    )


async def stream_request(
    session: aiohttp.ClientSession,
    target: HttpTarget,
    request_id: str,
    prompt: str | list[int],
    prompt_len: int,
    output_len: int,
    tokenizer: Any = None,
) -> RequestRecord:
    """Send one streaming request and return its record (never raises for a failed request)."""
    payload = build_payload(target, prompt, output_len)
    st = time.perf_counter()
    chunk_times: list[float] = []
    texts: list[str] = []
    n_ids: int | None = None  # token ids the chunks carried, where the server sends them
    usage: dict[str, Any] = {}
    finish_reason = None
    try:
        async with session.post(target.url, json=payload, headers=auth_headers()) as resp:
            if resp.status != 200:
                body = (await resp.text()).strip().replace("\n", " ")
                return error_record(request_id, prompt_len, output_len, st, f"HTTP {resp.status}: {body}")
            async for raw in resp.content:  # SSE: one `data: ...` line per event, blank lines between
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # a blank separator, a comment / ping (":"), or another field
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                now = time.perf_counter()
                if event.get("error"):
                    raise RuntimeError(f"server error in stream: {event['error']}")
                for choice in event.get("choices") or ():
                    text = chunk_content(target.backend, choice)
                    if text is not None:
                        chunk_times.append(now)
                        texts.append(text)
                    if isinstance(choice.get("token_ids"), list):
                        n_ids = (n_ids or 0) + len(choice["token_ids"])
                    finish_reason = choice.get("finish_reason") or finish_reason
                if event.get("usage"):
                    usage = event["usage"]
    except Exception as e:  # a failed request is a record, never the end of the run
        why = str(e) or f"no complete response after {time.perf_counter() - st:.0f} s"  # a timeout says nothing
        return error_record(request_id, prompt_len, output_len, st, f"{type(e).__name__}: {why}")
    return _stream_record(
        request_id, prompt_len, output_len, st, chunk_times, "".join(texts), usage, finish_reason, tokenizer, n_ids
    )


def _stream_record(
    request_id: str,
    prompt_len: int,
    output_len: int,
    st: float,
    chunk_times: list[float],
    text: str,
    usage: dict[str, Any],
    finish_reason: str | None,
    tokenizer: Any,
    n_ids: int | None = None,
) -> RequestRecord:
    """The record of a stream that ended well: its output length from the usage, else from the token ids streamed,
    else as vLLM's client counts it."""
    if not chunk_times:
        return error_record(request_id, prompt_len, output_len, st, "the stream held no content chunk")
    try:
        counts = usage_counts(usage, len(chunk_times), output_len)
    except ValueError as e:  # a server's impossible usage fails this request, never the run
        return error_record(request_id, prompt_len, output_len, st, str(e))
    n_out, source = counts["completion_tokens"], "usage"
    if not n_out and n_ids:
        n_out, source = n_ids, "token_ids"
    elif not n_out and tokenizer is not None and text:  # no usage: vLLM's fallback, the text re-tokenized
        n_out, source = len(tokenizer.encode(text)), "tokenizer"
    elif not n_out:  # nor a tokenizer: one token per content chunk
        n_out, source = len(chunk_times), "chunks"
    cached = counts["cached_tokens"]
    return RequestRecord(
        request_id,
        int(counts["prompt_tokens"] or prompt_len),
        int(n_out),
        st,
        None,
        chunk_times[0],
        None,
        chunk_times[-1],
        None,
        cached,
        finish_reason or "unknown",
        requested_output_len=output_len,
        output_len_source=source,
        chunk_times=chunk_times,
        text=text,
        layout=HTTP_REQUEST_KEYS,
    )


def _count(value: Any, field: str) -> int | None:
    """A token count of a server's usage: None when absent, else a whole number >= 0 (ValueError naming `field`)."""
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or value != int(value):
        raise ValueError(f"the server's {field} is {value!r}, not a token count")
    return int(value)


def usage_counts(usage: Any, chunks: int, max_tokens: int) -> dict[str, int | None]:
    """The counts of a stream's `usage` (prompt_tokens, completion_tokens, cached_tokens; None where absent), checked
    against what was streamed: ValueError naming the field when a count is not a whole number >= 0, or when
    completion_tokens is fewer than the content chunks streamed (each carries at least one token) or more than the
    request's max_tokens (no server may generate past it). A usage that lies makes every throughput a lie."""
    if usage is None or usage == {}:
        usage = {}
    if not isinstance(usage, dict):
        raise ValueError(f"the server's usage is {usage!r}, not an object")
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise ValueError(f"the server's usage.prompt_tokens_details is {details!r}, not an object")
    out = {
        "prompt_tokens": _count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
        "completion_tokens": _count(usage.get("completion_tokens"), "usage.completion_tokens"),
        "cached_tokens": _count((details or {}).get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens"),
    }
    n = out["completion_tokens"]
    if n is not None and n > 0 and not chunks <= n <= max_tokens:
        raise ValueError(
            f"the server's usage.completion_tokens is {n}, but it streamed {chunks} content chunk(s) for "
            f"max_tokens {max_tokens}: a count outside {chunks}..{max_tokens} is impossible"
        )
    return out


def make_session(max_concurrency: int | None, timeout_s: float) -> aiohttp.ClientSession:
    # one connection per in-flight request (keep-alive reuses them); no total cap when concurrency is unbounded
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s), read_bufsize=1 << 16
    )


class Slots:
    """`--max-concurrency`'s cap, which says when each slot it hands out was freed: a request that waited for one
    was due then, not at its arrival, so that the wait (the cap's by design, vLLM's "client queue time") is not
    counted as the client's lateness. Taken in FIFO order, as asyncio's semaphore hands out its slots."""

    def __init__(self, cap: int | None) -> None:
        self._free: asyncio.Queue[float] | None = None
        if cap:
            self._free = asyncio.Queue()
            for _ in range(cap):
                self._free.put_nowait(-math.inf)  # never held: free from the start

    async def take(self) -> float:
        """Wait for a slot; the time it was freed (-inf: free from the start; also without a cap)."""
        return -math.inf if self._free is None else await self._free.get()

    def give(self) -> None:
        if self._free is not None:
            self._free.put_nowait(time.perf_counter())


def scheduled(rec: RequestRecord, due: float) -> RequestRecord:
    """The record with its `scheduled_time` (the moment it was due and a slot was free) in its layout."""
    rec.scheduled_time = due
    if "scheduled_time" not in rec.layout:
        rec.layout = (*rec.layout, "scheduled_time")
    return rec


async def replay(
    target: HttpTarget,
    prompts: Sequence[str | list[int]],
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    arrivals: Sequence[float],
    *,
    max_concurrency: int | None = None,
    tokenizer: Any = None,
    progress: Any = None,
    ids: Sequence[str] | None = None,
    session: aiohttp.ClientSession | None = None,
    t0: float | None = None,
    send: Any = None,
) -> tuple[list[RequestRecord], float, float]:
    """Send request i at t0 + arrivals[i] (waiting for a free slot under `max_concurrency`); t0 defaults to now
    (a `time.perf_counter()` value: client workers share one); `send` is `stream_request` unless another
    endpoint's request function (same arguments) is given; returns (records in request order, each with its
    `scheduled_time`, t0, the time the last request ended)."""
    own = session is None
    send = send or stream_request
    session = session or make_session(max_concurrency, target.timeout_s)
    slots = Slots(max_concurrency)
    ids = list(ids) if ids is not None else [str(i) for i in range(len(prompts))]

    async def one(i: int, due: float) -> RequestRecord:
        try:
            rec = await send(session, target, ids[i], prompts[i], prompt_lens[i], output_lens[i], tokenizer)
        finally:
            slots.give()
        rec = scheduled(rec, due)
        if progress:
            progress(1, [rec])
        return rec

    try:
        order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
        t0 = time.perf_counter() if t0 is None else t0
        tasks: dict[int, asyncio.Task[RequestRecord]] = {}
        for i in order:
            delay = t0 + arrivals[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            freed = await slots.take()
            tasks[i] = asyncio.create_task(one(i, max(t0 + arrivals[i], freed)))
        records = [await tasks[i] for i in range(len(prompts))]
        end = time.perf_counter()
    finally:
        if own:
            await session.close()
    return records, t0, end


def run_duration(records: Sequence[RequestRecord], t0: float, end: float) -> float:
    """First send to the last finish (as the in-process runner); the whole wall time if nothing completed."""
    finishes = [r.finish_time for r in records if r.finish_reason != "error" and r.finish_time is not None]
    d = (max(finishes) if finishes else end) - t0
    return d if d > 0 else math.ulp(1.0)
