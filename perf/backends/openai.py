"""One measured HTTP run: warm the server up, scrape /metrics, replay the workload, scrape again.

`OpenAIBackend` ("openai", /v1/completions) and `OpenAIChatBackend` ("openai-chat") are the "server" backends.
Returns the same `RunResult` the in-process runner does, so the metrics, the CSV row and the table are the same
code for both. What only the engine sees is NaN unless the server's /metrics tells it (`server_metrics.py`):
queueing time, recomputed tokens, slot and token-budget utilisation, static slot waste, the step count.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from cbbench.perf.backends.base import WARMUP_OUTPUT_LEN, Backend, ProgressFn, RunResult, warmup_prompts
from cbbench.perf.backends.client_workers import check_client_workers, replay_sharded
from cbbench.perf.backends.http_client import HttpTarget, make_session, replay, run_duration
from cbbench.perf.backends.http_turns import replay_turns
from cbbench.perf.backends.server_metrics import ServerMetrics, scrape
from cbbench.perf.records import RequestRecord

if TYPE_CHECKING:
    from cbbench.perf.plan.spec import RunSettings, RunSpec

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


def http_target(
    backend: str,
    base_url: str | None,
    model: str,
    prompt_format: str,
    knobs: Mapping[str, Any],
    ignore_eos: bool = True,
    timeout_s: float = 6 * 3600,
) -> HttpTarget:
    """The server an HTTP backend run talks to; engine knobs are the server's business and refused here."""
    if not base_url:
        raise ValueError(f"base_url: --backend {backend} needs --base-url http://HOST:PORT")
    given = [k for k, v in knobs.items() if v is not None]
    if given:
        flag = given[0].replace("_", "-")
        raise ValueError(
            f"--{flag}: an engine knob; with --backend {backend} set it on the server (e.g. cbbench serve --{flag} ...)"
        )
    return HttpTarget(backend, base_url, model, prompt_format=prompt_format, ignore_eos=ignore_eos, timeout_s=timeout_s)


def failure_notes(key: tuple[str, str, str], records: list[RequestRecord]) -> list[str]:
    """One line per run with failed requests (as vLLM's "Failed requests"), with the first error."""
    bad = [r for r in records if r.finish_reason == "error"]
    short = [r for r in records if r.finish_reason != "error" and r.output_len != r.requested_output_len]
    out = []
    if bad:
        out.append(f"{key[0]} {key[2]}: failed requests: {len(bad)} of {len(records)}; first: {bad[0].error}")
    if short:
        out.append(
            f"{key[0]} {key[2]}: {len(short)} requests generated other than max_tokens tokens (the server "
            f"stopped at EOS: it ignores ignore_eos, or --no-ignore-eos); e.g. request {short[0].request_id}: {short[0].output_len} of "
            f"{short[0].requested_output_len}"
        )
    return out


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
) -> HttpRunResult:
    res = HttpRunResult(target.backend, "", {})
    prompts = request_prompts(workload, target, tokenizer)
    reqs = workload.requests
    async with make_session(max_concurrency, target.timeout_s) as session:
        if warmup:  # as vLLM's test prompt: a server that cannot answer fails the run here, not 500 times
            wp = warmup_prompts(warmup, seed)
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
                res.error = f"every warm-up request failed: {bad[0].error}"
                return res
        sm = ServerMetrics(target.root + "/metrics")
        sm.before = await scrape(session, sm.url)
        if sm.before is not None:
            sm.keep(sm.before)
        done = asyncio.Event()
        sampler = asyncio.create_task(sm.sample_until(session, done)) if sm.before is not None else None
        args = (
            target,
            prompts,
            [r.prompt_len for r in reqs],
            [r.output_len for r in reqs],
            [r.arrival_time for r in reqs],
        )
        try:
            texts = {id(r): p for r, p in zip(reqs, prompts)}
            if workload.is_multi_turn:  # each conversation a chain: turn k after turn k - 1's answer
                if client_workers > 1:
                    raise ValueError("client_workers: multi-turn workloads run on one client process")
                records, t0, end = await replay_turns(
                    target,
                    reqs,
                    text_of=lambda r: texts[id(r)],
                    tokenizer=tokenizer,
                    session=session,
                    max_concurrency=max_concurrency,
                    progress=progress,
                )
            elif client_workers > 1:  # the parent keeps sampling /metrics while the workers replay
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
            else:
                records, t0, end = await replay(
                    *args,
                    max_concurrency=max_concurrency,
                    tokenizer=tokenizer,
                    progress=progress,
                    session=session,
                    send=send,
                )
        finally:
            done.set()
            if sampler is not None:
                await sampler
        if sm.before is not None:
            sm.after = await scrape(session, sm.url)
            if sm.after is not None:
                sm.keep(sm.after)
    res.records, res.duration, res.server = records, run_duration(records, t0, end), sm.results()
    res.server_series = sm.series
    return res


def run_http(
    workload: Any,
    target: HttpTarget,
    *,
    tokenizer: Any = None,
    max_concurrency: int | None = None,
    warmup: int = 8,
    seed: int = 0,
    progress: ProgressFn | None = None,
    client_workers: int = 1,
    send: Any = None,
) -> HttpRunResult:
    """Replay `workload` against `target` (over `client_workers` processes, client_workers.py); a server that
    cannot be reached, or a client worker that fails, is a failed run, not an exception. `send`: the request
    function (`http_client.replay`'s), for endpoints that do not stream completions."""
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
            )
        )
    except (TimeoutError, OSError, RuntimeError) as e:
        return HttpRunResult(target.backend, "", {}, error=f"{type(e).__name__}: {e}")


class HttpBackend(Backend):
    """An OpenAI-compatible server at `--base-url`; the endpoint is the registered name's (`http_client.ENDPOINTS`).
    Its engine knobs are the server's own: given here, they are refused while the plan is built."""

    send: ClassVar[Any] = None  # the request function; None: http_client.stream_request

    def __init__(self, settings: RunSettings) -> None:
        super().__init__(settings)
        self.target = http_target(
            self.name,
            settings.base_url,
            settings.model,
            settings.prompt_format,
            settings.engine_knobs,
            settings.ignore_eos,
            settings.request_timeout,
        )
        check_client_workers(settings.client_workers)

    def run(self, spec: RunSpec, progress: ProgressFn | None = None) -> RunResult:
        return run_http(
            spec.workload,
            self.target,
            tokenizer=self.settings.tokenizer,
            max_concurrency=spec.load.max_concurrency,
            warmup=self.settings.warmup,
            seed=self.settings.seed,
            progress=progress,
            client_workers=self.settings.client_workers,
            send=self.send,
        )

    def row_config(self, result: RunResult) -> tuple[dict[str, Any], str]:
        # device, dtype and knobs are the server's: left empty; where it was reached goes into `extra`
        t = self.target
        return {"base_url": t.base_url, "prompt_format": t.prompt_format, "ignore_eos": t.ignore_eos}, ""

    def notes(self, key: tuple[str, str, str], result: RunResult) -> list[str]:
        return failure_notes(key, result.records) + super().notes(key, result)


@Backend.register("openai", kind="server")
class OpenAIBackend(HttpBackend):
    """/v1/completions."""


@Backend.register("openai-chat", kind="server")
class OpenAIChatBackend(HttpBackend):
    """/v1/chat/completions."""
