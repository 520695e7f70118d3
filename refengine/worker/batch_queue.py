"""BatchQueue: the steps launched but not yet collected under async scheduling (vLLM's EngineCore batch queue).

LLMEngine.step() with `async_scheduling=True` works as vLLM's `step_with_batch_queue`: it schedules step N+1 and
launches its forward while the forward of step N is still running, then waits for step N and processes its output.
The queue is a real device's (`LocalDevice.make_batch_queue`; a simulated GPU has its own, sim/runner.py's
SimBatchQueue), as the thread that runs the forwards is the worker's side of the step, the part vLLM's executor
plays. The forwards run one after another in that thread, so the runner sees its steps in order (and the
token step N samples is in its persistent batch before step N+1's forward reads it as input), while the main
thread schedules, updates and detokenises. Torch releases the GIL inside its kernels, so on the CPU too the host
work of one step overlaps the forward of the other.

Lifetime: the worker is a daemon thread that holds neither the queue nor the engine (each work item brings the
forward to run), so dropping the engine frees the queue by reference counting, and a `weakref.finalize` on the
queue then stops the worker; `shutdown()` (LLMEngine.shutdown) does the same explicitly and waits for it to exit.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from refengine.scheduler.scheduler_output import ModelRunnerOutput, SchedulerOutput

MAX_STEPS_IN_FLIGHT = 2  # step N running, step N+1 launched behind it: as vLLM's batch queue of size 2
WORKER_JOIN_TIMEOUT_S = 60.0  # how long shutdown waits for a forward still running (a long GPU prefill is seconds)

StepFuture = Future[ModelRunnerOutput]
# one launched step, or None: the sentinel that stops the worker
WorkItem = tuple[StepFuture, Callable[[SchedulerOutput], ModelRunnerOutput], SchedulerOutput] | None


def _forward_worker(work: queue.SimpleQueue[WorkItem]) -> None:
    """Run the launched (Future, execute_model, SchedulerOutput) items in order until the None sentinel; a failure
    goes to the step's Future. Between steps the thread holds nothing of the engine, not even the runner."""
    while True:
        item = work.get()
        if item is None:
            return
        future, execute_model, out = item
        del item
        if future.set_running_or_notify_cancel():  # (False: cancelled by shutdown() before it started)
            try:
                future.set_result(execute_model(out))
            except BaseException as exc:  # noqa: BLE001 (collect()'s caller gets it and aborts the step's requests)
                future.set_exception(exc)
        del future, execute_model, out  # hold no step's tensors while waiting for the next


def _stop_worker(
    work: queue.SimpleQueue[WorkItem], thread: threading.Thread, steps: deque[tuple[StepFuture, SchedulerOutput]]
) -> None:
    """Cancel the steps not yet started and let the worker exit after the one it runs (called once)."""
    for future in [f for f, _ in steps]:
        future.cancel()
    work.put(None)
    if thread is not threading.current_thread():  # (a collection may run in the worker itself)
        thread.join(WORKER_JOIN_TIMEOUT_S)


def _no_forward(out: SchedulerOutput) -> ModelRunnerOutput:
    raise RuntimeError("the batch queue is shut down")


class BatchQueue:
    def __init__(self, execute_model: Callable[[SchedulerOutput], ModelRunnerOutput]) -> None:
        self._execute_model = execute_model
        self._work: queue.SimpleQueue[WorkItem] = queue.SimpleQueue()
        self._steps: deque[tuple[StepFuture, SchedulerOutput]] = deque()
        self._thread = threading.Thread(
            target=_forward_worker, args=(self._work,), name="refengine-forward", daemon=True
        )
        self._thread.start()
        # runs on shutdown(), when the queue is collected, or at interpreter exit, whichever comes first
        self._finalizer = weakref.finalize(self, _stop_worker, self._work, self._thread, self._steps)

    def submit(self, out: SchedulerOutput) -> None:
        assert len(self._steps) < MAX_STEPS_IN_FLIGHT, "collect a step before launching another"
        if not self._finalizer.alive:
            raise RuntimeError("the batch queue is shut down")
        future: StepFuture = Future()
        self._steps.append((future, out))
        self._work.put((future, self._execute_model, out))

    def full(self) -> bool:
        return len(self._steps) >= MAX_STEPS_IN_FLIGHT

    def oldest(self) -> SchedulerOutput:
        """The step launched first of those in flight: the one `collect` returns next."""
        return self._steps[0][1]

    def collect(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Take the oldest step, `out`, off the queue and wait for its output (re-raising whatever its forward
        raised; a step cancelled by shutdown() raises CancelledError). It takes the step as the runner's
        execute_model does, so the engine processes an output the same way whichever of the two gives it."""
        future, oldest = self._steps.popleft()
        assert oldest is out, "collect the oldest step first"
        return future.result()

    def holds(self, request_id: str) -> bool:
        """Whether a step in flight scheduled this request (its id may not be reused until that output is back)."""
        return any(request_id in out.num_scheduled_tokens for _, out in self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def shutdown(self) -> None:
        """Stop the worker: the forward it runs finishes, steps not yet started are cancelled (their collect() raises
        CancelledError). Idempotent. The queue lets go of the forward (the runner behind it) too."""
        self._finalizer()
        self._execute_model = _no_forward
