"""A self-contained replay of a fixed-length serving benchmark on the cost model, for its serving-level validation.

`vllm bench serve --max-concurrency C` with every prompt `isl` tokens and every output `osl` tokens (ignore_eos):
C clients each send a request, and send the next one the moment theirs finishes. The steps follow vLLM V1's
scheduler for this case: the running requests first, in admission order, each taking
min(tokens left to compute, remaining budget) (a decode takes one token), then waiting requests join while budget
and max_num_seqs allow, their prompts chunked to the remaining budget. The KV cache is assumed large enough that
nothing is preempted (true for the validation rows: 128 x 6000 fp8 tokens are 49 GB, an H200 holds about 110 GB
of KV beside Llama-3.1-8B). The simulated engine (device="sim:<gpu>") runs the real scheduler instead, and can be
checked against this replay on the same rows.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from refengine.sim.cost_model import CostModel, StepShape

# vLLM's defaults for the OpenAI server on GPUs with at least 70 GiB other than the A100 (H100, H200): 8192
# tokens and 1024 sequences; on the A100 and smaller GPUs 2048 tokens and 256 sequences
VLLM_SERVER_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_SERVER_MAX_NUM_SEQS = 1024


@dataclass(frozen=True)
class ReplayResult:
    mean_ttft_s: float  # over the measured requests: first token time - send time
    mean_tpot_s: float  # (finish - first token) / (osl - 1), averaged over the measured requests
    duration_s: float  # simulated seconds for the whole replay
    num_steps: int


@dataclass
class _Req:
    arrival: float
    computed: int = 0
    outputs: int = 0
    first_token: float = -1.0
    finish: float = -1.0


def replay_fixed_lengths(
    cost: CostModel,
    isl: int,
    osl: int,
    concurrency: int,
    num_requests: int | None = None,
    max_num_batched_tokens: int = VLLM_SERVER_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = VLLM_SERVER_MAX_NUM_SEQS,
) -> ReplayResult:
    """Replay num_requests (default 6 x concurrency) closed-loop requests; measure the steady state: the first
    wave (all sent at t = 0 at once) and the last wave (sent while clients drain) are left out of the means."""
    for name, value in (("isl", isl), ("osl", osl), ("concurrency", concurrency)):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    total = num_requests or 6 * concurrency
    reqs: list[_Req] = []
    waiting: list[_Req] = []
    running: list[_Req] = []
    now, steps = 0.0, 0
    while len(reqs) < min(concurrency, total):
        reqs.append(_Req(arrival=0.0))
        waiting.append(reqs[-1])
    while running or waiting:
        scheduled: list[tuple[_Req, int]] = []
        budget = max_num_batched_tokens
        for r in running:
            if budget == 0:
                break
            n = min(isl + r.outputs - r.computed, budget)
            scheduled.append((r, n))
            budget -= n
        while waiting and budget > 0 and len(running) < max_num_seqs:
            r = waiting.pop(0)
            running.append(r)
            n = min(isl - r.computed, budget)
            scheduled.append((r, n))
            budget -= n
        sampling = [r for r, n in scheduled if r.computed + n == isl + r.outputs]
        shape = StepShape(tuple(n for _, n in scheduled), tuple(r.computed for r, _ in scheduled), len(sampling))
        now += cost.step_seconds(shape)
        steps += 1
        for r, n in scheduled:
            r.computed += n
        for r in sampling:
            r.outputs += 1
            if r.outputs == 1:
                r.first_token = now
            if r.outputs == osl:
                r.finish = now
                running.remove(r)
                if len(reqs) < total:  # this client sends its next request at once
                    reqs.append(_Req(arrival=now))
                    waiting.append(reqs[-1])
    measured = reqs[concurrency : total - concurrency] or reqs
    ttft = statistics.fmean(r.first_token - r.arrival for r in measured)
    tpot = statistics.fmean((r.finish - r.first_token) / max(osl - 1, 1) for r in measured)
    return ReplayResult(ttft, tpot, now, steps)
