"""`--client-workers N`: one HTTP replay sharded over N client processes, as AIPerf's and GuideLLM's workers.

One aiohttp process becomes the limit at high concurrency and streaming rates: every SSE line is parsed on its one
core, and a late read inflates TTFT and ITL. Here request i goes to worker i mod N (in arrival order, so every
worker sees the same rate), each worker replays its shard with its own session and connection pool, and the parent
merges the records back into request order.

One clock for all: every timestamp is `time.perf_counter()`, which on Linux is CLOCK_MONOTONIC, one clock for the
whole system (not per process), so a worker's times and the parent's compare directly. The parent waits until
every worker has started and opened its session, then sends them all the same epoch t0 a little in the future;
each sends request i at t0 + arrival_i. `--max-concurrency C` is split over the workers (C // N each, the first
C % N one more; never more workers than C), so the cap holds in total.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from cbbench.perf.backends.http_client import HttpTarget, make_session, replay
from cbbench.perf.records import RequestRecord

# between the start signal and t0: long enough for every worker to read it (a pipe read, well under 1 ms on an
# idle machine; far more on a loaded one), short enough not to count
START_MARGIN_S = 0.05
WORKER_START_TIMEOUT_S = 120.0  # a spawned interpreter imports aiohttp and this package first


def check_client_workers(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"client_workers: expected an integer >= 1, got {n!r}")
    return n


def shard_concurrency(max_concurrency: int | None, workers: int) -> list[int | None]:
    """Each worker's share of the cap (None: no cap); fewer workers than the cap asks for are used."""
    if max_concurrency is None:
        return [None] * workers
    used = min(workers, max_concurrency)
    return [max_concurrency // used + (w < max_concurrency % used) for w in range(used)]


async def _worker_main(
    conn: Connection, target: HttpTarget, shard: dict[str, list[Any]], cap: int | None, tokenizer: Any, send: Any
) -> None:
    async with make_session(cap, target.timeout_s) as session:
        conn.send("ready")
        t0 = conn.recv()  # blocking is right: nothing runs on this loop before the start
        records, _, end = await replay(
            target,
            shard["prompts"],
            shard["prompt_lens"],
            shard["output_lens"],
            shard["arrivals"],
            max_concurrency=cap,
            tokenizer=tokenizer,
            ids=shard["ids"],
            session=session,
            t0=t0,
            send=send,
        )
    conn.send((records, end))


def _worker(
    conn: Connection, target: HttpTarget, shard: dict[str, list[Any]], cap: int | None, tokenizer: Any, send: Any
) -> None:
    """A client process's entry point (module level, so that spawn can find it)."""
    try:
        asyncio.run(_worker_main(conn, target, shard, cap, tokenizer, send))
    except BaseException as e:  # the parent turns this into a failed run, with the reason
        conn.send(RuntimeError(f"client worker failed: {type(e).__name__}: {e}"))
        raise
    finally:
        conn.close()


def replay_sharded(
    target: HttpTarget,
    prompts: Sequence[str | list[int]],
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    arrivals: Sequence[float],
    *,
    workers: int,
    max_concurrency: int | None = None,
    tokenizer: Any = None,
    ids: Sequence[str] | None = None,
    send: Any = None,
) -> tuple[list[RequestRecord], float, float]:
    """`http_client.replay` over `workers` processes (blocking: call it from a thread inside an event loop);
    returns (records in request order, the shared t0, the time the last worker's last request ended)."""
    ids = list(ids) if ids is not None else [str(i) for i in range(len(prompts))]
    caps = shard_concurrency(max_concurrency, check_client_workers(workers))
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    parts = [p for p in (order[w :: len(caps)] for w in range(len(caps))) if p]
    ctx = mp.get_context("spawn")  # never fork: the parent holds an event loop and perhaps a server thread
    procs, conns = [], []
    try:
        for part, cap in zip(parts, caps):
            shard = {
                "prompts": [prompts[i] for i in part],
                "prompt_lens": [prompt_lens[i] for i in part],
                "output_lens": [output_lens[i] for i in part],
                "arrivals": [arrivals[i] for i in part],
                "ids": [ids[i] for i in part],
            }
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(theirs, target, shard, cap, tokenizer, send), daemon=True)
            p.start()
            theirs.close()
            procs.append(p)
            conns.append(mine)
        for c in conns:
            if not c.poll(WORKER_START_TIMEOUT_S):
                raise RuntimeError(f"a client worker did not start within {WORKER_START_TIMEOUT_S:.0f} s")
            msg = c.recv()
            if isinstance(msg, Exception):
                raise msg
        t0 = time.perf_counter() + START_MARGIN_S
        for c in conns:
            c.send(t0)
        by_id: dict[str, RequestRecord] = {}
        end = t0
        for c in conns:
            msg = c.recv()
            if isinstance(msg, Exception):
                raise msg
            recs, w_end = msg
            by_id.update((r.request_id, r) for r in recs)
            end = max(end, w_end)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    return [by_id[i] for i in ids], t0, end
