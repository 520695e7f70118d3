"""A small, deterministic OpenAI-compatible streaming server for the HTTP client's tests (aiohttp.web, in a thread).

It streams `max_tokens` tokens per request (token k's text is "t<k> ", except every `EMPTY_TEXT_EVERY`-th token,
whose text is "" as a detokenizer that holds back a partial character sends), then a finish-only chunk, the usage
chunk and `[DONE]`, so the tests see every shape of chunk a real server sends. It keeps what the tests check:
the peak number of requests in flight and every request body. Its /metrics speaks vLLM's names: one preemption
per completed request, KV usage = in-flight requests / `KV_SLOTS`, running = in flight, none waiting, and a
`cache_config_info` with num_gpu_blocks. /v1/models lists its one model.
`chunk_tokens` > 1 streams that many tokens per chunk (one chunk per `token_delay_s`, as a server that batches its
detokenised output or speculates several tokens a step), and `with_token_ids` puts each chunk's token ids in its
choice (`token_ids`, as vLLM's `return_token_ids`), so that the client's output token count can be told from its
chunk count and from a re-tokenisation of the text.
Two switches make the order of events, not the machine's speed, decide what a client's /metrics sampler sees:
`kv_high_water` reports KV usage as the most requests in flight since the last read (a gauge that never misses a
peak between two reads), and `hold_for_busy_scrape` holds each request's last chunk, once /metrics has been read,
until a read has seen requests in flight since the last read that saw none, or HOLD_GUARD_S has passed (for a client
that reads /metrics before its requests, and none between warm-up requests).
Broken on purpose, for the gate's tests: `fail_every` answers every k-th completion request HTTP 500, `usage_lie`
reports another completion_tokens than it streamed. A prompt whose first token id is `BAD_PROMPT_TOKEN` gets HTTP 400 with an OpenAI-style error. /v1/embeddings
answers after one token delay with an `EMBEDDING_DIM`-long vector that depends on the prompt.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

EMPTY_TEXT_EVERY = 3
BAD_PROMPT_TOKEN = 13
KV_SLOTS = 8
NUM_GPU_BLOCKS = 100
TOKEN_DELAY_S = 0.002
EMBEDDING_DIM = 8
HOLD_GUARD_S = 300.0  # hold_for_busy_scrape's hang guard: a client that never reads /metrics mid-run gets its answers
BACKLOG = 4096  # pending connections: a wave of 4096 must not wait out SYN retries (Linux caps it at somaxconn)


class FakeOpenAIServer:
    """`with FakeOpenAIServer() as s: ... s.base_url ...`"""

    def __init__(
        self,
        model: str = "fake-model",
        token_delay_s: float = TOKEN_DELAY_S,
        with_metrics: bool = True,
        with_usage: bool = True,
        chunk_tokens: int = 1,
        with_token_ids: bool = False,
        fail_every: int = 0,
        usage_lie: Callable[[int], Any] | None = None,
        hold_for_busy_scrape: bool = False,
        kv_high_water: bool = False,
    ) -> None:
        self.model, self.token_delay_s, self.with_metrics = model, token_delay_s, with_metrics
        self.chunk_tokens, self.with_token_ids = chunk_tokens, with_token_ids
        self.with_usage = with_usage  # False: as a server that ignores stream_options
        self.fail_every = fail_every  # k > 0: every k-th completion request answers HTTP 500 (a broken server)
        self.usage_lie = usage_lie  # n streamed -> the completion_tokens its usage reports (a server that lies)
        self.hold_for_busy_scrape, self.kv_high_water = hold_for_busy_scrape, kv_high_water
        self._peak_since_read = 0
        self.scrapes = 0
        self._busy_seen = False  # a /metrics read saw requests in flight since the last one that saw none
        self.requests = 0
        self.in_flight = self.peak_in_flight = self.completed = 0
        self.bodies: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        if self.with_metrics:
            app.router.add_get("/metrics", self._metrics)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        self._busy_seen = self.in_flight > 0
        kv_requests = max(self.in_flight, self._peak_since_read) if self.kv_high_water else self.in_flight
        self._peak_since_read = self.in_flight
        text = (
            f"# TYPE vllm:num_preemptions_total counter\n"
            f'vllm:num_preemptions_total{{model_name="{self.model}"}} {float(self.completed)}\n'
            f'vllm:kv_cache_usage_perc{{model_name="{self.model}"}} {kv_requests / KV_SLOTS}\n'
            f'vllm:num_requests_running{{model_name="{self.model}"}} {float(self.in_flight)}\n'
            f'vllm:num_requests_waiting{{model_name="{self.model}"}} 0.0\n'
            f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{NUM_GPU_BLOCKS}"}} 1.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        prompt = body["input"]
        if isinstance(prompt, list) and prompt and prompt[0] == BAD_PROMPT_TOKEN:
            return web.json_response(
                {"error": {"message": "input: token 13 is not allowed here", "code": 400}}, status=400
            )
        n = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        await asyncio.sleep(self.token_delay_s)
        self.completed += 1
        seed = sum(prompt) if isinstance(prompt, list) else len(prompt)
        vec = [((seed * (k + 1)) % 97) / 97.0 for k in range(EMBEDDING_DIM)]
        return web.json_response(
            {
                "object": "list",
                "model": self.model,
                "data": [{"object": "embedding", "index": 0, "embedding": vec}],
                "usage": {"prompt_tokens": n, "total_tokens": n},
            }
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        chat = "messages" in body
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        if isinstance(prompt, list) and prompt and prompt[0] == BAD_PROMPT_TOKEN:
            err = {
                "error": {
                    "message": "prompt: token 13 is not allowed here",
                    "type": "BadRequestError",
                    "param": "prompt",
                    "code": 400,
                }
            }
            return web.json_response(err, status=400)
        self.requests += 1
        if self.fail_every and self.requests % self.fail_every == 0:
            return web.json_response({"error": {"message": "fake failure", "code": 500}}, status=500)
        n = int(body.get("max_completion_tokens") or body["max_tokens"])
        prompt_len = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self._peak_since_read = max(self._peak_since_read, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)

            async def send(obj: Any) -> None:
                await resp.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

            def choice(text: str, finish: str | None, ids: list[int] | None = None) -> dict[str, Any]:
                out: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
                if chat:
                    out = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
                if ids is not None and self.with_token_ids:
                    out["token_ids"] = ids
                return out

            if chat:
                await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            step = max(1, self.chunk_tokens)
            for k in range(0, n, step):
                await asyncio.sleep(self.token_delay_s)
                ks = range(k, min(n, k + step))
                if step == 1:
                    text = "" if (k % EMPTY_TEXT_EVERY == EMPTY_TEXT_EVERY - 1 and not chat) else f"t{k} "
                else:
                    text = "".join(f"t{j} " for j in ks)
                await send({"choices": [choice(text, None, [100 + j for j in ks])]})
            if self.hold_for_busy_scrape and self.scrapes:
                await self._until_busy_scraped()
            await send({"choices": [choice("", "length")]})
            if self.with_usage and (body.get("stream_options") or {}).get("include_usage"):
                await send(
                    {
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt_len,
                            "completion_tokens": n if self.usage_lie is None else self.usage_lie(n),
                            "total_tokens": prompt_len + n,
                        },
                    }
                )
            await send(b"[DONE]")
            await resp.write_eof()
            self.completed += 1
            return resp
        finally:
            self.in_flight -= 1

    async def _until_busy_scraped(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HOLD_GUARD_S
        while not self._busy_seen and loop.time() < deadline:
            await asyncio.sleep(0.005)

    def _serve(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        runner = web.AppRunner(self._app())
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=BACKLOG)
        loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def __enter__(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake server did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
