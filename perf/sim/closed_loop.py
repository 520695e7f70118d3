"""A closed-loop fixed-length benchmark through a (simulated) engine: `vllm bench serve --max-concurrency C` with
every prompt `isl` tokens and every output `osl` tokens (ignore_eos). C clients each send a request at once, and
each sends its next one the moment its previous one finishes, on the engine's own clock (virtual on a simulated
GPU). The engine's real scheduler, KV cache manager and output side decide every step.

The cost-model-only twin of this driver is perf/sim/replay.py (`replay_fixed_lengths`), which re-implements
the scheduling for this one case; running both on the same rows checks one against the other.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from perf.sim.engine_replay import replay_params
from perf.sim.replay import ReplayResult

if TYPE_CHECKING:
    from refengine.engine import LLMEngine

# the first token id of the distinct prompts: above every preset's special ids, below every vocabulary
_PROMPT_ID_BASE = 1000


def distinct_prompt(index: int, isl: int, vocab_size: int) -> list[int]:
    """Request `index`'s prompt: `isl` ids that no other index shares at position 0, so no two prompts share a
    cached prefix even if prefix caching were on."""
    span = vocab_size - _PROMPT_ID_BASE
    return [_PROMPT_ID_BASE + (index + 7 * j) % span for j in range(isl)]


def run_closed_loop(
    engine: LLMEngine, isl: int, osl: int, concurrency: int, num_requests: int | None = None
) -> list[dict[str, Any]]:
    """Send num_requests (default 6 x concurrency) requests from `concurrency` closed-loop clients; returns every
    request's metrics (engine-clock times) in sending order."""
    for name, value in (("isl", isl), ("osl", osl), ("concurrency", concurrency)):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    total = num_requests or 6 * concurrency
    vocab = engine.model_config.vocab_size
    params = replay_params(osl)
    sent, done = 0, {}

    def send() -> None:
        nonlocal sent
        engine.add_request(str(sent), distinct_prompt(sent, isl, vocab), params, arrival_time=engine.clock.now())
        sent += 1

    for _ in range(min(concurrency, total)):
        send()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.metrics
                if sent < total:  # this client sends its next request at once
                    send()
    return [done[str(i)] for i in range(total)]


def steady_state(
    metrics: list[dict[str, Any]], concurrency: int, osl: int, duration_s: float, num_steps: int
) -> ReplayResult:
    """Mean TTFT and TPOT over the steady state, as replay_fixed_lengths measures it: the first wave (all sent at
    once) and the last (sent while the clients drain) are left out."""
    measured = metrics[concurrency : len(metrics) - concurrency] or metrics
    ttft = statistics.fmean(m["first_token_time"] - m["arrival_time"] for m in measured)
    tpot = statistics.fmean((m["finish_time"] - m["first_token_time"]) / max(osl - 1, 1) for m in measured)
    return ReplayResult(ttft, tpot, duration_s, num_steps)


def closed_loop_on_engine(
    isl: int,
    osl: int,
    concurrency: int,
    num_requests: int | None = None,
    model: str = "llama-3.1-8b",
    device: str = "sim:h200",
    dtype: str = "fp8",
    **engine_kwargs: object,
) -> ReplayResult:
    """A fresh engine with vLLM's server defaults on an H100 / H200 (8192 batched tokens, 1024 sequences, chunked
    prefill on) and prefix caching off (the prompts are distinct anyway), driven by run_closed_loop."""
    from perf.sim.replay import VLLM_SERVER_MAX_NUM_BATCHED_TOKENS, VLLM_SERVER_MAX_NUM_SEQS
    from refengine import LLMEngine

    kwargs = {
        "max_num_batched_tokens": VLLM_SERVER_MAX_NUM_BATCHED_TOKENS,
        "max_num_seqs": VLLM_SERVER_MAX_NUM_SEQS,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": False,
        "stats_log_size": 0,
        **engine_kwargs,
    }
    engine = LLMEngine(model, device=device, dtype=dtype, **kwargs)
    start = engine.clock.now()
    metrics = run_closed_loop(engine, isl, osl, concurrency, num_requests)
    duration = max(m["finish_time"] for m in metrics) - start
    return steady_state(metrics, concurrency, osl, duration, engine.model_runner.num_steps)
