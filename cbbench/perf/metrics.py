"""Benchmark metrics, with vLLM `bench serve`'s definitions and key names, plus what only the engine can see.

Input: one `RequestRecord` per request and, for the engine-side metrics, one `StepRecord` per engine step
(perf/records.py; a mapping with the same keys is converted). Times are seconds on one clock, `None` where a source
cannot observe a time; `token_times` holds each output token's time (len == output_len) or is None, and then
`chunk_times` (an HTTP client: each streamed content chunk) gives ITL, since a chunk may carry several tokens;
a step's `slots_held` is set in static mode only (see slot_waste).

Client-side metrics (as vLLM `benchmarks/serve.py::calculate_metrics`):
- completed: requests whose finish_reason is not "abort" or "error" (a failed HTTP request); only these enter
  every statistic below; `failed` counts the others.
- TTFT = first_token_time - arrival_time.
- E2EL = finish_time - arrival_time.
- TPOT = (E2EL - TTFT) / (output_len - 1), only for requests with output_len > 1 (the first token is prefill's).
  GuideLLM's "time per output token" instead divides E2EL - queueing by all N tokens (the first included), and
  some tools call vLLM's TPOT "ITL": compare numbers across tools only after checking the definition.
- ITL: every gap between consecutive output tokens of a request, all requests pooled (vLLM measures the gaps
  between streamed chunks: an HTTP run's records give `chunk_times`; in-process each token is its own chunk).
- For each of ttft, tpot, itl, e2el (and queue, below): `mean_*_ms`, `median_*_ms`, `std_*_ms` (population std,
  numpy's default as in vLLM) and `p{p}_*_ms` for p in `metric_percentiles` (numpy linear interpolation).
  An empty population (e.g. TPOT when every output is one token) gives NaN where vLLM prints 0.
- request_throughput = completed / duration; output_throughput = total_output_tokens / duration;
  total_token_throughput = (total_input_tokens + total_output_tokens) / duration (`duration` is the wall time of
  the whole run, first arrival to last finish, as measured by the caller).
- request_goodput = requests meeting every SLO in `goodput` ({"ttft"|"tpot"|"e2el": limit_ms}) / duration;
  as in vLLM a one-token request has TPOT 0 for this test. NaN when no SLO is given.

Engine-side metrics (no client can see these):
- queue (`mean_queue_ms`, ...): first_scheduled_time - arrival_time, time waiting before the first schedule.
- num_preemptions: sum over requests; recomputed_tokens: tokens computed again after recompute preemptions
  (the caller's count, else the sum of records' num_recomputed_tokens, else NaN).
- peak_kv_blocks: max kv_blocks_used over steps; peak_kv_usage = peak_kv_blocks / num_gpu_blocks.
- prefix_cache_hit_rate = sum(num_cached_tokens) / sum(prompt_len) over completed requests (a token-weighted hit
  rate; vLLM's /metrics reports a block-query hit rate, which also counts re-prefills after preemption).
- mean_slot_utilisation = mean over steps of num_running / max_num_seqs.
- mean_token_budget_utilisation = mean over steps of num_scheduled_tokens / max_num_batched_tokens.
- slot_waste (static mode): sum over steps of slots_held / sum over steps of num_running. A slot held for one step
  is one token slot (a decode step gives each held slot one token); a batch holds its slots until its longest
  member ends, while only num_running of them still produce tokens. For one batch of B requests with output
  lengths L_i, one prefill step and no chunking, this is B * max(L_i) / sum(L_i) >= 1: the factor of token slots
  that continuous batching can win back at equal concurrency. 1.0 means no waste; NaN when no step has slots_held.
- graphed_step_share = steps whose forward replayed a CUDA graph / steps; graphed_token_share = their scheduled
  tokens / all scheduled tokens (refengine's mixed and decode-only steps alike: refengine/worker/cuda_graphs.py).
  Over the steps that say (StepRecord.cuda_graph not None); left out when none does (a simulated GPU, a peer), so
  those rows are unchanged. Not CSV columns: they go into the row's `extra` JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict

from cbbench.perf.json_values import JSONObject
from cbbench.perf.records import REQUEST_KEYS, RequestRecord, StepRecord, as_request_record, as_step_record

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el", "queue")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")

NOT_COMPLETED = ("abort", "error")
RECORD_KEYS = REQUEST_KEYS  # what every record holds


def percentile_key(p: float) -> str:
    """vLLM's spelling of a percentile in a key: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def stat_keys(metric: str, percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> list[str]:
    """The keys `compute_metrics` writes for one latency metric, in order."""
    return [
        f"mean_{metric}_ms",
        f"median_{metric}_ms",
        f"std_{metric}_ms",
        *(f"p{percentile_key(p)}_{metric}_ms" for p in percentiles),
    ]


def parse_metric_percentiles(text: str) -> list[float]:
    """`--metric-percentiles "50,90,99"` -> [50.0, 90.0, 99.0]."""
    out = [float(x) for x in text.split(",") if x.strip()]
    if not out or any(not 0 < p < 100 for p in out):
        raise ValueError(f"metric_percentiles: each must be in (0, 100), got {text!r}")
    return out


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """`--goodput ttft:500 tpot:50` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds, as vLLM)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(f"goodput: expected NAME:MS with NAME in {GOODPUT_METRICS}, got {item!r}")
        ms = float(value)
        if not ms >= 0:
            raise ValueError(f"goodput: the {name} limit must be >= 0 ms, got {value}")
        out[name] = ms
    return out


def _stats(values_s: Sequence[float], metric: str, percentiles: Sequence[float]) -> dict[str, float]:
    if len(values_s) == 0:
        return dict.fromkeys(stat_keys(metric, percentiles), math.nan)
    import numpy as np  # here: `compare` and `show` import this module for the metric names and must start fast

    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    out = {
        f"mean_{metric}_ms": float(np.mean(ms)),
        f"median_{metric}_ms": float(np.median(ms)),
        f"std_{metric}_ms": float(np.std(ms)),
    }
    for p in percentiles:
        out[f"p{percentile_key(p)}_{metric}_ms"] = float(np.percentile(ms, p))
    return out


def _check_record(r: RequestRecord) -> None:
    tt = r.token_times
    if tt is not None and len(tt) != r.output_len:
        raise ValueError(f"record {r.request_id!r}: token_times holds {len(tt)} times, output_len is {r.output_len}")


class Latencies(TypedDict):
    """One request's latencies in seconds (None where a time is missing), its inter-token gaps a list."""

    ttft: float | None
    tpot: float | None
    e2el: float | None
    queue: float | None
    itl: list[float]


def request_latencies(r: RequestRecord) -> Latencies:
    """One request's latencies in seconds (None where a time is missing); `itl` is a list."""
    arrival, n = r.arrival_time, r.output_len
    ttft = None if r.first_token_time is None else r.first_token_time - arrival
    e2el = None if r.finish_time is None else r.finish_time - arrival
    tpot = (e2el - ttft) / (n - 1) if (ttft is not None and e2el is not None and n > 1) else None
    queue = None if r.first_scheduled_time is None else r.first_scheduled_time - arrival
    tt = r.token_times if r.token_times is not None else r.chunk_times
    itl = [b - a for a, b in zip(tt, tt[1:])] if tt else []
    return {"ttft": ttft, "tpot": tpot, "e2el": e2el, "queue": queue, "itl": itl}


def compute_metrics(
    records: Sequence[RequestRecord | Mapping[str, object]],
    duration: float,
    *,
    steps: Sequence[StepRecord | Mapping[str, object]] | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    num_gpu_blocks: int | None = None,
    metric_percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput: Mapping[str, float] | None = None,
    recomputed_tokens: int | None = None,
) -> dict[str, float]:
    """Aggregate metrics of one run (see the module docstring for every definition)."""
    if not duration > 0:
        raise ValueError(f"duration must be > 0 s, got {duration}")
    recs = [as_request_record(r) for r in records]
    for r in recs:
        _check_record(r)
    done = [r for r in recs if r.finish_reason not in NOT_COMPLETED]
    lat = [request_latencies(r) for r in done]
    pooled: dict[str, list[float]] = {m: [] for m in LATENCY_METRICS}
    for d in lat:
        pooled["itl"].extend(d["itl"])
        for m, v in (("ttft", d["ttft"]), ("tpot", d["tpot"]), ("e2el", d["e2el"]), ("queue", d["queue"])):
            if v is not None:
                pooled[m].append(v)
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_len for r in done)
    out: dict[str, float] = {
        "completed": len(done),
        "failed": len(recs) - len(done),
        "duration": float(duration),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "request_goodput": _goodput(done, lat, goodput, duration),
    }
    for m in LATENCY_METRICS:
        out.update(_stats(pooled[m], m, metric_percentiles))
    out["num_preemptions"] = sum(int(r.num_preemptions or 0) for r in done)
    if recomputed_tokens is None and done and all(r.num_recomputed_tokens is not None for r in done):
        recomputed_tokens = sum(int(r.num_recomputed_tokens or 0) for r in done)
    out["recomputed_tokens"] = math.nan if recomputed_tokens is None else recomputed_tokens
    cached = [r.num_cached_tokens for r in done if r.num_cached_tokens is not None]
    # nan unless every completed request reports its cached tokens
    out["prefix_cache_hit_rate"] = sum(cached) / total_in if total_in and len(cached) == len(done) else math.nan
    out.update(
        step_metrics(
            [as_step_record(s) for s in steps or []],
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            num_gpu_blocks=num_gpu_blocks,
        )
    )
    return out


def _goodput(
    done: Sequence[RequestRecord], lat: Sequence[Latencies], slo_ms: Mapping[str, float] | None, duration: float
) -> float:
    if not slo_ms:
        return math.nan
    bad = [k for k in slo_ms if k not in GOODPUT_METRICS]
    if bad:
        raise ValueError(f"goodput: unknown metric {bad[0]!r}; expected one of {GOODPUT_METRICS}")
    good = 0
    for r, d in zip(done, lat):
        values = {"ttft": d["ttft"], "e2el": d["e2el"], "tpot": d["tpot"] if r.output_len > 1 else 0.0}
        if all((v := values[k]) is not None and v * 1000.0 <= limit for k, limit in slo_ms.items()):
            good += 1
    return good / duration


def step_metrics(
    steps: Sequence[StepRecord | Mapping[str, object]],
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    num_gpu_blocks: int | None = None,
) -> dict[str, float]:
    """The per-step aggregates: peak KV, slot and token-budget utilisation, static slot waste."""
    import numpy as np

    nan = math.nan
    recs = [as_step_record(s) for s in steps]
    kv = [s.kv_blocks_used for s in recs if s.kv_blocks_used is not None]
    peak = max(kv) if kv else nan
    out = {
        "num_steps": len(recs),
        "peak_kv_blocks": peak,
        "peak_kv_usage": peak / num_gpu_blocks if (kv and num_gpu_blocks) else nan,
    }
    out["mean_slot_utilisation"] = (
        float(np.mean([s.num_running / max_num_seqs for s in recs])) if recs and max_num_seqs else nan
    )
    out["mean_token_budget_utilisation"] = (
        float(np.mean([s.num_scheduled_tokens / max_num_batched_tokens for s in recs]))
        if recs and max_num_batched_tokens
        else nan
    )
    held = [s for s in recs if s.slots_held is not None]
    useful = sum(s.num_running for s in held)
    out["slot_waste"] = sum(s.slots_held or 0 for s in held) / useful if useful else nan
    out.update(graphed_shares(recs))
    return out


def graphed_shares(steps: Sequence[StepRecord]) -> dict[str, float]:
    """graphed_step_share and graphed_token_share (see the module docstring); {} when no step says."""
    known = [s for s in steps if s.cuda_graph is not None]
    if not known:
        return {}
    graphed = [s for s in known if s.cuda_graph]
    tokens = sum(s.num_scheduled_tokens for s in known)
    return {
        "graphed_step_share": len(graphed) / len(known),
        "graphed_token_share": sum(s.num_scheduled_tokens for s in graphed) / tokens if tokens else math.nan,
    }


def per_request_metrics(records: Sequence[RequestRecord | Mapping[str, object]]) -> list[JSONObject]:
    """Per-request latencies in ms, for the JSON result (one dict per record, in order)."""
    out: list[JSONObject] = []
    for r in map(as_request_record, records):
        d = request_latencies(r)
        seconds = {"ttft": d["ttft"], "tpot": d["tpot"], "e2el": d["e2el"], "queue": d["queue"]}
        ms: JSONObject = {f"{m}_ms": (None if v is None else v * 1000.0) for m, v in seconds.items()}
        out.append({"request_id": r.request_id, **ms, "itl_ms": [x * 1000.0 for x in d["itl"]]})
    return out
