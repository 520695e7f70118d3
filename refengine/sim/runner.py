"""SimModelRunner: the model runner of a simulated GPU. It reads each SchedulerOutput, builds the step's shape
(tokens computed per request, their KV context, the rows that sample), advances the virtual clock by the cost
model's seconds for it, and samples a fixed non-EOS token for every sampling row. No tensor is touched.

It keeps, per request, only its token count (prompt + sampled), to know which rows sample: as the real runner, a
request samples when this step computes its last known token (a partial prefill samples nothing).

SimBatchQueue stands in for refengine/worker/batch_queue.py under async scheduling: the same interface, no thread. A
step's "forward" runs when its output is collected, on the caller's thread, so the clock moves in a fixed order
(deterministic) and step N runs before step N+1, as in the real worker. The overlap of host work with the GPU
that async scheduling buys is the cost model's (max of the two, not the sum).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from refengine.clock import VirtualClock
from refengine.scheduler.scheduler_output import ModelRunnerOutput, SchedulerOutput
from refengine.sim.cost_model import CostModel, StepShape

# " the" in the Qwen BPE: an ordinary word, below every preset's vocabulary size and none of their EOS ids
SIM_TOKEN_ID = 279


def sim_token_id(eos_token_ids: tuple[int, ...], vocab_size: int) -> int:
    """The token every sampling row gets: SIM_TOKEN_ID, or the next id that is not an EOS id of the model."""
    tok = SIM_TOKEN_ID % vocab_size
    while tok in eos_token_ids:
        tok = (tok + 1) % vocab_size
    return tok


class SimModelRunner:
    def __init__(self, cost_model: CostModel, clock: VirtualClock, token_id: int) -> None:
        self.cost_model = cost_model
        self.clock = clock
        self.token_id = token_id
        self.num_tokens: dict[str, int] = {}  # per request the runner holds: prompt + sampled tokens
        self.num_steps = 0
        self.busy_seconds = 0.0  # simulated seconds spent in steps (the clock also jumps over idle time)
        self.last_step: StepShape | None = None
        self.step_time_scale = 1.0  # (sim_device.planted_slowdown: a gate test's planted regression)

    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        num_tokens = self.num_tokens
        for rid in out.finished_req_ids:
            num_tokens.pop(rid, None)
        context: dict[str, int] = {}
        for new in out.scheduled_new_reqs:
            num_tokens[new.req_id] = len(new.all_token_ids)
            context[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for rid, tokens in cached.all_token_ids.items():  # a row resynced after a step away (or a preemption)
            num_tokens[rid] = len(tokens)
        context.update(zip(cached.req_ids, cached.num_computed_tokens))
        req_ids = list(out.num_scheduled_tokens)
        if not req_ids:
            return ModelRunnerOutput()
        new_tokens = tuple(out.num_scheduled_tokens.values())
        ctx = tuple(context[rid] for rid in req_ids)
        sampled: list[list[int]] = []
        tok = [self.token_id]
        for rid, n, c in zip(req_ids, new_tokens, ctx):
            if c + n >= num_tokens[rid]:
                num_tokens[rid] += 1
                sampled.append(tok)
            else:
                sampled.append([])
        step = StepShape(new_tokens, ctx, sum(1 for s in sampled if s))
        seconds = self.cost_model.step_seconds(step) * self.step_time_scale
        self.clock.advance(seconds)
        self.num_steps += 1
        self.busy_seconds += seconds
        self.last_step = step
        return ModelRunnerOutput(req_ids, dict(zip(req_ids, range(len(req_ids)))), sampled)


class SimBatchQueue:
    """BatchQueue's interface without the worker thread (see the module docstring)."""

    def __init__(self, execute_model: Callable[[SchedulerOutput], ModelRunnerOutput]) -> None:
        from refengine.worker.batch_queue import MAX_STEPS_IN_FLIGHT

        self._execute_model = execute_model
        self._max = MAX_STEPS_IN_FLIGHT
        self._steps: deque[SchedulerOutput] = deque()
        self._closed = False

    def submit(self, out: SchedulerOutput) -> None:
        assert len(self._steps) < self._max, "collect a step before launching another"
        if self._closed:
            raise RuntimeError("the batch queue is shut down")
        self._steps.append(out)

    def full(self) -> bool:
        return len(self._steps) >= self._max

    def oldest(self) -> SchedulerOutput:
        return self._steps[0]

    def collect(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Take the oldest step, `out`, off the queue and run its (simulated) forward now."""
        oldest = self._steps.popleft()
        assert oldest is out, "collect the oldest step first"
        return self._execute_model(out)

    def holds(self, request_id: str) -> bool:
        return any(request_id in out.num_scheduled_tokens for out in self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def shutdown(self) -> None:
        self._closed = True
