"""`--backend openai-embeddings`: POST /v1/embeddings, one prompt per request, as vLLM's, GuideLLM's and AIPerf's
embeddings benchmarks send it.

The body is `{"model", "input"}` with the prompt as token ids (`--prompt-format ids`) or text, and
`encoding_format: "float"`. Nothing streams and nothing is generated: a record has output_len 0, no first token
and no chunk times; its finish_time is when the whole response has been read. So the metrics that mean something
are those vLLM's bench reports for a pooling model: the end-to-end latency (e2el mean / median / percentiles),
request_throughput and total_token_throughput (= input tokens per second); TTFT, TPOT and ITL are NaN. A response
whose `data` holds no embedding vector is a failed request. Warm-up, /metrics scraping, `--max-concurrency`,
request rates and `--client-workers` are the completions backend's (openai.py, client_workers.py).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from cbbench.perf.backends.backend import Backend
from cbbench.perf.backends.http_client import HttpTarget, auth_headers, error_record
from cbbench.perf.backends.openai import HttpArgs, HttpBackend
from cbbench.perf.records import HTTP_ERROR_KEYS, RequestRecord

EMBEDDING_KEYS = tuple(k for k in HTTP_ERROR_KEYS if k not in ("chunk_times",))


def build_embedding_payload(target: HttpTarget, prompt: str | list[int]) -> dict[str, Any]:
    return {"model": target.model, "input": prompt, "encoding_format": "float"}


async def embed_request(
    session: aiohttp.ClientSession,
    target: HttpTarget,
    request_id: str,
    prompt: str | list[int],
    prompt_len: int,
    output_len: int,
    tokenizer: Any = None,
) -> RequestRecord:
    """Send one embeddings request and return its record (never raises for a failed request); `output_len` and
    `tokenizer` are http_client.replay's arguments, unused here."""
    st = time.perf_counter()
    try:
        async with session.post(
            target.url, json=build_embedding_payload(target, prompt), headers=auth_headers()
        ) as resp:
            if resp.status != 200:
                body = (await resp.text()).strip().replace("\n", " ")
                return error_record(request_id, prompt_len, 0, st, f"HTTP {resp.status}: {body}")
            doc = await resp.json()
        end = time.perf_counter()
    except Exception as e:  # a failed request is a record, never the end of the run
        why = str(e) or f"no complete response after {time.perf_counter() - st:.0f} s"
        return error_record(request_id, prompt_len, 0, st, f"{type(e).__name__}: {why}")
    data = doc.get("data") or []
    if not data or not isinstance(data[0].get("embedding"), list) or not data[0]["embedding"]:
        return error_record(request_id, prompt_len, 0, st, "the response held no embedding vector")
    usage = doc.get("usage") or {}
    return RequestRecord(
        request_id,
        int(usage.get("prompt_tokens") or prompt_len),
        0,
        st,
        None,
        None,
        None,
        end,
        None,
        None,
        "stop",
        requested_output_len=0,
        layout=EMBEDDING_KEYS,
    )


@Backend.register("openai-embeddings", kind="server", args=HttpArgs)
class OpenAIEmbeddingsBackend(HttpBackend):
    """/v1/embeddings: latency and input-token throughput of an embedding server."""

    send = staticmethod(embed_request)
    takes_salt = False  # an embedding request carries no cache_salt: a reset, where offered, starts each run cold
