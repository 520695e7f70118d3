"""Hugging Face static `generate` on a simulated GPU: the hf-static peer of a perf run, on the same cost model the
simulated engine uses (refengine/sim/cost_model.py).

As the CPU peer (perf/backends/hf.py) runs it: requests form batches of `batch_size` in arrival order; a batch starts
once its last member has arrived and the previous batch has returned; every member generates the batch's longest
output (no EOS). On the cost model that is, per batch of b requests with longest prompt L and longest output N:
- one prefill step of b prompts padded to L (M = b x L tokens, causal attention over L keys per row);
- N - 1 decode steps at M = b, every row attending over its padded KV (L + j keys at decode j), finished and padded
  rows included: nobody leaves the batch.
A request's first token comes after the batch's prefill, its k-th token after k steps (only its own output_len
tokens are its output), and it finishes, as its caller sees it, when the batch returns.

Records are shaped like the engine's (refengine/engine/output_processor.py `request_metrics`) and steps like the CPU
peer's synthetic step records, so perf computes the same metrics from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from refengine.sim.cost_model import CostModel, StepShape
from refengine.sim.sim_device import parse_sim_device
from refengine.sim.sim_memory import sim_dtype
from refengine.sim.sim_models import sim_model

# (prompt length, output length, arrival in seconds from the start)
HfStaticRequest = tuple[int, int, float]


@dataclass
class HfStaticResult:
    records: list[dict[str, Any]]  # per request, in request order
    steps: list[dict[str, Any]]  # per step: time, tokens, running members, slots held
    batch_seconds: list[float] = field(default_factory=list)  # modelled seconds of each batch, in order
    duration_s: float = 0.0  # from the start (t = 0) to the last batch's return


def batch_steps(prompt_lens: Sequence[int], output_lens: Sequence[int]) -> list[StepShape]:
    """The steps `generate` runs for one batch: the padded prefill, then a decode per further output position."""
    if not prompt_lens or len(prompt_lens) != len(output_lens):
        raise ValueError(
            f"prompt_lens: need one per request and at least one, got {len(prompt_lens)} prompts "
            f"for {len(output_lens)} outputs"
        )
    for name, lens in (("prompt_lens", prompt_lens), ("output_lens", output_lens)):
        if min(lens) < 1:
            raise ValueError(f"{name}: every length must be >= 1, got {min(lens)}")
    b, width, longest = len(prompt_lens), max(prompt_lens), max(output_lens)
    steps = [StepShape((width,) * b, (0,) * b, b)]
    steps += [StepShape((1,) * b, (width + j - 1,) * b, b) for j in range(1, longest)]
    return steps


def _record(
    rid: int, prompt_len: int, output_len: int, arrival: float, start: float, token_times: list[float], finish: float
) -> dict[str, Any]:
    return {
        "request_id": str(rid),
        "prompt_len": prompt_len,
        "output_len": output_len,
        "arrival_time": arrival,
        "first_scheduled_time": start,
        "first_token_time": token_times[0],
        "token_times": token_times,
        "finish_time": finish,
        "num_preemptions": 0,
        "num_recomputed_tokens": 0,
        "num_cached_tokens": None,
        "finish_reason": "length",
        "error": None,
    }


def simulate_hf_static(cost: CostModel, requests: Sequence[HfStaticRequest], batch_size: int) -> HfStaticResult:
    """Run every request through static batches of `batch_size` on the cost model's clock (starts at 0)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be an int >= 1, got {batch_size!r}")
    order = sorted(range(len(requests)), key=lambda i: requests[i][2])
    res = HfStaticResult([{}] * len(requests), [])
    end = 0.0
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        prompts, outputs, arrivals = zip(*(requests[i] for i in idx))
        start = max(end, max(arrivals))
        times, now = [], start
        for step in batch_steps(prompts, outputs):
            now += cost.step_seconds(step)
            times.append(now)
        end = now
        res.batch_seconds.append(end - start)
        for i, p, o, a in zip(idx, prompts, outputs, arrivals):
            res.records[i] = _record(i, p, o, a, start, times[:o], end)
        res.steps.extend(
            {
                "time": t,
                "num_scheduled_tokens": len(idx) * (max(prompts) if k == 0 else 1),
                "num_waiting": 0,
                "num_running": sum(o > k for o in outputs),
                "slots_held": len(idx),
            }
            for k, t in enumerate(times)
        )
    res.duration_s = end
    return res


class _WorkloadRequest(Protocol):
    """What this module reads of a cbbench workload's request."""

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def output_len(self) -> int: ...
    @property
    def arrival_time(self) -> float: ...


class _Workload(Protocol):
    @property
    def requests(self) -> Sequence[_WorkloadRequest]: ...


def workload_requests(workload: _Workload) -> list[HfStaticRequest]:
    """(prompt length, output length, arrival) of each request of a cbbench workload, in its order."""
    return [(len(r.prompt_token_ids), r.output_len, r.arrival_time) for r in workload.requests]


def simulate_hf_static_on(
    device: str, model: str, requests: Sequence[HfStaticRequest], batch_size: int, dtype: str = "bfloat16"
) -> HfStaticResult:
    """simulate_hf_static on `device` ("sim:<gpu>") for a model preset or folder, with the engine's cost model."""

    cost = CostModel(parse_sim_device(device), sim_model(model)[1], sim_dtype(dtype))
    return simulate_hf_static(cost, requests, batch_size)
