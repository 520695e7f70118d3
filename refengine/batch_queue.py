"""BatchQueue: the steps launched but not yet collected under async scheduling (vLLM's EngineCore batch queue).

LLMEngine.step() with `async_scheduling=True` works as vLLM's `step_with_batch_queue`: it schedules step N+1 and
launches its forward while the forward of step N is still running, then waits for step N and processes its output.
The forwards run one after another in a single worker thread, so the runner sees its steps in order (and the
token step N samples is in its persistent batch before step N+1's forward reads it as input), while the main
thread schedules, updates and detokenises. Torch releases the GIL inside its kernels, so on the CPU too the host
work of one step overlaps the forward of the other.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from refengine.scheduler_output import ModelRunnerOutput, SchedulerOutput

MAX_STEPS_IN_FLIGHT = 2  # step N running, step N+1 launched behind it: as vLLM's batch queue of size 2


class BatchQueue:
    def __init__(self, execute_model: Callable[[SchedulerOutput], ModelRunnerOutput]) -> None:
        self._execute_model = execute_model
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refengine-forward")
        self._steps: deque[tuple[SchedulerOutput, Future]] = deque()

    def submit(self, out: SchedulerOutput) -> None:
        assert len(self._steps) < MAX_STEPS_IN_FLIGHT, "collect a step before launching another"
        self._steps.append((out, self._executor.submit(self._execute_model, out)))

    def full(self) -> bool:
        return len(self._steps) >= MAX_STEPS_IN_FLIGHT

    def pop(self) -> tuple[SchedulerOutput, Callable[[], ModelRunnerOutput]]:
        """The oldest step and a function that waits for its output (re-raising whatever its forward raised)."""
        out, future = self._steps.popleft()
        return out, future.result

    def holds(self, request_id: str) -> bool:
        """Whether a step in flight scheduled this request (its id may not be reused until that output is back)."""
        return any(request_id in out.num_scheduled_tokens for out, _ in self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
