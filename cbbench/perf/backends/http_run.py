"""One measured HTTP run: warm the server up, make sure the run starts cold, scrape /metrics, replay the workload,
scrape again.

Cold: with an `Isolation` (cache_isolation.py) the run sends its own `cache_salt` (the warm-up another) and/or resets
the server's prefix cache after the warm-up, so that no prompt of an earlier run (or of the warm-up) hits it.

What only the engine sees is NaN unless the server's /metrics tells it (`server_metrics.py`): queueing time,
recomputed tokens, slot and token-budget utilisation, static slot waste, the step count. A served simulated GPU
whose clock ran slower than real time (its /metrics says so) has the run's times converted into its simulated
time (`sim_time.py`), and a note says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cbbench.perf.backends.backend import WARMUP_OUTPUT_LEN, ProgressFn, RunResult, warmup_prompts
from cbbench.perf.backends.cache_isolation import Isolation, new_salt, reset
from cbbench.perf.backends.client_workers import check_client_workers, replay_sharded
from cbbench.perf.backends.http_client import HttpTarget, make_session, replay, run_duration
from cbbench.perf.backends.http_turns import replay_turns
from cbbench.perf.backends.server_metrics import ServerMetrics, scrape
from cbbench.perf.backends.sim_time import SimClock, time_note
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.plan.declared import RUN
from cbbench.perf.plan.load import known_vocab_size
from cbbench.perf.records import RequestRecord

# text warm-up prompts for a tokenizer smaller than the warm-up's id range use ids from here up (past the specials)
WARMUP_VOCAB_FLOOR = 16
# the columns an HTTP client cannot observe, NaN whatever compute_metrics makes of the missing step data
_NOT_OBSERVED = (
    "recomputed_tokens",
    "mean_slot_utilisation",
    "mean_token_budget_utilisation",
    "slot_waste",
    "num_steps",
)


@dataclass
class HttpRunResult(RunResult):
    """A RunResult whose engine-side figures come from the server's /metrics (NaN where it has none)."""

    server: dict[str, float] = field(default_factory=dict)
    server_series: list[dict[str, float | None]] = field(default_factory=list)  # ServerMetrics.series
    sim_time_scale: float | None = None  # the served clock's mean scale over the run, where times were converted
    time_note: str | None = None
    isolation: Isolation | None = None  # how the run was kept from an earlier run's cached prefixes (None: not asked)

    def metrics(self, *, metric_percentiles: Sequence[float], goodput: Mapping[str, float] | None) -> dict[str, Any]:
        m = super().metrics(metric_percentiles=metric_percentiles, goodput=goodput)
        m.update(dict.fromkeys(_NOT_OBSERVED, math.nan))
        for k in ("num_preemptions", "peak_kv_usage", "peak_kv_blocks"):
            m[k] = self.server.get(k, math.nan)
        if math.isnan(m["prefix_cache_hit_rate"]):  # no cached_tokens in the usage: the server's own counters
            m["prefix_cache_hit_rate"] = self.server.get("server_prefix_hit_rate", math.nan)
        return m

    @property
    def failures(self) -> list[RequestRecord]:
        return [r for r in self.records if r.finish_reason == "error"]


def request_prompts(workload: Any, target: HttpTarget, tokenizer: Any) -> list[str | list[int]]:
    """Each request's prompt as the target takes it: token ids, or the source text (decoded when it has none)."""
    if target.prompt_format == "ids":
        return [list(r.prompt_token_ids) for r in workload.requests]
    if tokenizer is None:
        raise ValueError("tokenizer: --prompt-format text needs a tokenizer to turn token-id prompts into text")
    return [
        r.prompt_text if r.prompt_text is not None else tokenizer.decode(list(r.prompt_token_ids))
        for r in workload.requests
    ]


async def _run(
    workload: Any,
    target: HttpTarget,
    *,
    tokenizer: Any,
    max_concurrency: int | None,
    warmup: int,
    seed: int,
    progress: ProgressFn | None,
    client_workers: int = 1,
    send: Any = None,
    isolation: Isolation | None = None,
) -> HttpRunResult:
    res = HttpRunResult(target.backend, "", EngineKnobs(), isolation=isolation)
    prompts = request_prompts(workload, target, tokenizer)
    salt = new_salt() if isolation is not None and isolation.salt else None
    # /metrics on a connection of its own: on the requests' session a read waits for a free connection, so with all
    # of --max-concurrency N's held it reads nothing mid-run (at N = 1, never) and then takes one from the requests
    async with make_session(max_concurrency, target.timeout_s) as session, make_session(1, target.timeout_s) as scraper:
        if warmup:  # as vLLM's test prompt: a server that cannot answer fails the run here, not 500 times
            warm_target = target if salt is None else dataclasses.replace(target, cache_salt=salt + "-warmup")
            error = await _warm_up(warm_target, session, tokenizer, warmup, seed, max_concurrency, send)
            if error is not None:
                res.error = error
                return res
        if isolation is not None and isolation.reset_path is not None:  # after the warm-up: it warms nothing either
            error = await reset(session, target, isolation.reset_path)
            if error is not None and salt is None:  # (refused, say while another client's requests run: the salt
                res.error = error  # alone still keeps this run's prompts from every earlier run's)
                return res
        if salt is not None:  # every request of the run under the run's own salt: its shared prefixes still hit
            target = dataclasses.replace(target, cache_salt=salt)
        sm = ServerMetrics(target.root + "/metrics")
        sm.before = await scrape(scraper, sm.url)
        if sm.before is not None:
            sm.keep(sm.before)
        done = asyncio.Event()
        sampler = asyncio.create_task(sm.sample_until(scraper, done)) if sm.before is not None else None
        if progress:
            progress(0)  # the measured run starts: the server answered the warm-up
        try:
            records, t0, end = await _replay(
                workload, target, session, prompts, tokenizer, max_concurrency, progress, client_workers, send
            )
        finally:
            done.set()
            if sampler is not None:
                await sampler
        if sm.before is not None:
            sm.after = await scrape(scraper, sm.url)
            if sm.after is not None:
                sm.keep(sm.after)
    clock = SimClock.from_samples(sm.clock_samples)
    if clock is not None and not clock.real_time:  # the server's clock ran slow: its simulated time, not ours
        res.time_note, res.sim_time_scale = time_note(clock, t0, end), clock.mean_scale(t0, end)
        records, t0, end = [clock.convert(r) for r in records], clock.to_sim(t0), clock.to_sim(end)
    res.records, res.duration, res.server = records, run_duration(records, t0, end), sm.results()
    res.server_series = sm.series
    return res


async def _warm_up(
    target: HttpTarget, session: Any, tokenizer: Any, warmup: int, seed: int, max_concurrency: int | None, send: Any
) -> str | None:
    """Send the warm-up requests; the run's error when every one of them failed, else None."""
    wp = warmup_prompts(warmup, seed, known_vocab_size(target.model))  # folded when the served model is known here
    if target.prompt_format == "text":  # ids within a small vocabulary, so that no prompt decodes to ""
        vocab = getattr(tokenizer, "vocab_size", None) or WARMUP_VOCAB_FLOOR
        wp = (
            [[WARMUP_VOCAB_FLOOR + i % max(1, vocab - WARMUP_VOCAB_FLOOR) for i in p] for p in wp]
            if vocab < 60_000
            else wp
        )
    wprompts = wp if target.prompt_format == "ids" else [tokenizer.decode(p) or "hello" for p in wp]
    recs, _, _ = await replay(
        target,
        wprompts,
        [len(p) for p in wp],
        [WARMUP_OUTPUT_LEN + i for i in range(len(wp))],
        [0.0] * len(wp),
        max_concurrency=max_concurrency,
        tokenizer=tokenizer,
        session=session,
        ids=[f"warmup-{i}" for i in range(len(wp))],
        send=send,
    )
    bad = [r for r in recs if r.finish_reason == "error"]
    if len(bad) == len(recs):  # one answered warm-up request is enough (an early EOS is not the server's fault)
        return f"every warm-up request failed: {bad[0].error}"
    return None


async def _replay(
    workload: Any,
    target: HttpTarget,
    session: Any,
    prompts: list[str | list[int]],
    tokenizer: Any,
    max_concurrency: int | None,
    progress: ProgressFn | None,
    client_workers: int,
    send: Any,
) -> tuple[list[RequestRecord], float, float]:
    """The measured replay: (records, start, end), on one client, on `client_workers` processes, or turn by turn."""
    reqs = workload.requests
    args = (target, prompts, [r.prompt_len for r in reqs], [r.output_len for r in reqs], [r.arrival_time for r in reqs])
    if workload.is_multi_turn:  # each conversation a chain: turn k after turn k - 1's answer
        if client_workers > 1:
            raise ValueError("client_workers: multi-turn workloads run on one client process")
        # text_of is asked only for text prompts (openai-chat, or --prompt-format text): there every prompt is one
        texts = {id(r): p for r, p in zip(reqs, prompts) if isinstance(p, str)}
        return await replay_turns(
            target,
            reqs,
            text_of=lambda r: texts[id(r)],
            tokenizer=tokenizer,
            session=session,
            max_concurrency=max_concurrency,
            progress=progress,
        )
    if client_workers > 1:  # the parent keeps sampling /metrics while the workers replay
        records, t0, end = await asyncio.to_thread(
            replay_sharded,
            *args,
            workers=client_workers,
            max_concurrency=max_concurrency,
            tokenizer=tokenizer,
            send=send,
        )
        if progress:
            progress(len(records), records)
        return records, t0, end
    return await replay(
        *args, max_concurrency=max_concurrency, tokenizer=tokenizer, progress=progress, session=session, send=send
    )


def run_http(
    workload: Any,
    target: HttpTarget,
    *,
    tokenizer: Any = None,
    max_concurrency: int | None = None,
    warmup: int = RUN.warmup.default,
    seed: int = 0,
    progress: ProgressFn | None = None,
    client_workers: int = 1,
    send: Any = None,
    isolation: Isolation | None = None,
) -> HttpRunResult:
    """Replay `workload` against `target` (over `client_workers` processes, client_workers.py); a server that
    cannot be reached, or a client worker that fails, is a failed run, not an exception. `send`: the request
    function (`http_client.replay`'s), for endpoints that do not stream completions. `isolation`: what keeps the
    run from an earlier run's cached prefixes (cache_isolation.py; None: nothing, the server's cache as it is)."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    check_client_workers(client_workers)
    try:
        return asyncio.run(
            _run(
                workload,
                target,
                tokenizer=tokenizer,
                max_concurrency=max_concurrency,
                warmup=warmup,
                seed=seed,
                progress=progress,
                client_workers=client_workers,
                send=send,
                isolation=isolation,
            )
        )
    except (TimeoutError, OSError, RuntimeError) as e:
        return HttpRunResult(target.backend, "", EngineKnobs(), error=f"{type(e).__name__}: {e}")
