"""/metrics: Prometheus text under vLLM V1's metric names and labels (model_name, engine), so dashboards and tools
written for vLLM (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, ...) read refengine unchanged.

vLLM 0.10 renamed `vllm:gpu_cache_usage_perc` to `vllm:kv_cache_usage_perc` and later dropped the old name; only the
new one is exported. Gauges are set after every engine step, counters grow per step, histograms are observed once
per finished request (as vLLM's frontend does). `vllm:cache_config_info` carries the KV cache's shape as labels
(num_gpu_blocks, block_size), value 1, as vLLM exports it: an HTTP benchmark reads the pool size from it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated; no `*_created` series: they double the text and no vLLM dashboard reads them

# vLLM's buckets (vllm/v1/metrics/loggers.py), so that histograms from both servers can be compared bucket by bucket
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self, model_name: str, num_gpu_blocks: int, block_size: int | None = None) -> None:
        self.registry = CollectorRegistry()
        self._num_gpu_blocks = num_gpu_blocks
        labels = ("model_name", "engine")
        self._labels = {"model_name": model_name, "engine": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(**self._labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(**self._labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(**self._labels)

        info = {"engine": "0", "num_gpu_blocks": str(num_gpu_blocks)}
        if block_size is not None:
            info["block_size"] = str(block_size)
        Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", tuple(info), registry=self.registry
        ).labels(**info).set(1)
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        # vLLM V1's prefix-cache counters, in tokens: a client's hit rate over a run is the ratio of the differences
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=self.registry,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _LATENCY_BUCKETS
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _LATENCY_BUCKETS
        )
        self.prompt_hist = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOKEN_BUCKETS
        )
        self.gen_hist = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", _TOKEN_BUCKETS
        )

    def on_step(self, num_running: int, num_waiting: int, kv_blocks_used: int, num_preempted: int) -> None:
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.kv_usage.set(kv_blocks_used / self._num_gpu_blocks)
        if num_preempted:
            self.preemptions.inc(num_preempted)

    def on_tokens(self, num_prompt_tokens: int, num_new_tokens: int) -> None:
        """Per output: the prompt counts once, when the request's first token comes back."""
        if num_prompt_tokens:
            self.prompt_tokens.inc(num_prompt_tokens)
        if num_new_tokens:
            self.generation_tokens.inc(num_new_tokens)

    def on_finished(self, m: dict[str, Any]) -> None:
        """`m` is the engine's per-request record (refengine.engine.llm_engine.request_metrics); times are monotonic."""
        reason = m.get("finish_reason") or "abort"
        self._success.labels(**self._labels, finished_reason=reason).inc()
        if m.get("first_scheduled_time") is not None:  # admitted: its prompt was looked up in the prefix cache
            self.prefix_queries.inc(m.get("prompt_len", 0))
            self.prefix_hits.inc(m.get("num_cached_tokens", 0))
        arrival, first, finish = m.get("arrival_time"), m.get("first_token_time"), m.get("finish_time")
        times = m.get("token_times") or []
        if arrival is not None and first is not None:
            self.ttft.observe(first - arrival)
        for a, b in zip(times, times[1:]):
            self.itl.observe(b - a)
        if first is not None and finish is not None and m.get("output_len", 0) > 1:
            self.tpot.observe((finish - first) / (m["output_len"] - 1))
        if arrival is not None and finish is not None:
            self.e2e.observe(finish - arrival)
        if arrival is not None and m.get("first_scheduled_time") is not None:
            self.queue.observe(m["first_scheduled_time"] - arrival)
        self.prompt_hist.observe(m.get("prompt_len", 0))
        self.gen_hist.observe(m.get("output_len", 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
