"""AsyncLLMEngine: one LLMEngine stepped by a background thread, fed from and streaming to an asyncio event loop.

The engine is not thread-safe, so only the engine thread touches it. The event loop sends it commands (add, abort)
through a lock-guarded list; each add carries a concurrent Future that the engine thread resolves once the engine
has validated the request, so a bad request fails its HTTP call with a 400 before any byte is streamed. Between
commands the thread runs one `engine.step()` at a time (a simulated GPU's paced by its device's pacer) and hands
every step's outputs to the loop in ONE `call_soon_threadsafe` (per-request asyncio queues; delivery.py), which
keeps the per-token overhead independent of how many streams are open. While nothing is queued the thread sleeps on an Event. On server stop the thread shuts the
engine down itself (LLMEngine.shutdown), so the streams still open get their last, aborted output.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from refengine.engine.llm_engine import LLMEngine
from refengine.entrypoints.delivery import OutputHandoff
from refengine.entrypoints.prometheus_metrics import ServerMetrics
from refengine.outputs import RequestOutput
from refengine.sampling_params import SamplingParams

log = logging.getLogger("refengine.server")
SHUTDOWN_TIMEOUT_S = 30.0  # server stop waits this long for the engine thread (its step in flight, the drain)
# A paced engine on time waits (at most this long) for the loop to write a step's outputs before it computes the
# next: the two threads share the GIL, and a step computed while the loop writes makes each of the loop's socket
# writes wait for the GIL after its system call (docs/sim-engine.md). Unpaced, or late, the two overlap: then
# throughput is worth more than what the GIL costs.
WRITE_WAIT_S = 0.5


class BatchRefused(ValueError):
    """One request of an all-or-nothing batch was refused: `index` is its position, `error` the engine's."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(f"prompt {index}: {error}")
        self.index, self.error = index, error


class EngineError(RuntimeError):
    """A request the engine failed (its output carries `error`, e.g. a forward that raised), or engine.step()
    itself raised (every request in flight fails): HTTP 500 or an error event; the server keeps serving."""


# what a stream's queue receives: (the caller's tag, the request's next output, or the error that ended it)
StreamItem = tuple[object, RequestOutput | Exception]
# (request_id, prompt, tag); a dict prompt is vLLM's {"prompt_token_ids": ..., "cache_salt": ...}
NewItem = tuple[str, str | list[int] | dict[str, Any], object]


@dataclass
class _Add:
    """Add a batch of requests, all or nothing; `fut` is resolved once the engine has taken or refused them."""

    items: list[NewItem]
    params: SamplingParams
    queue: asyncio.Queue[StreamItem]
    priority: int
    arrival: float
    fut: concurrent.futures.Future[None]


@dataclass
class _Abort:
    request_ids: list[str]


@dataclass
class _Reset:
    """Forget the cached prefixes between two steps; `fut` gets the engine's answer (False: blocks are held)."""

    fut: concurrent.futures.Future[bool]


@dataclass
class _Stream:
    queue: asyncio.Queue[StreamItem]
    tag: object  # what the caller wants back with each output (e.g. the choice index)
    started: bool = False  # the first token came back (the prompt is counted then)


class AsyncLLMEngine:
    def __init__(
        self, engine: LLMEngine, model_name: str, pace_sim: bool = True, time_scale: float | None = None
    ) -> None:
        self.engine = engine
        # the device may pace the steps to real time: a simulated GPU's step takes its simulated seconds (divided
        # by the pacer's time scale: fixed, or None for as fast as this host keeps up with)
        self.pacer = engine.platform.make_pacer(engine.step, time_scale) if pace_sim else None
        self._handoff = OutputHandoff()
        if self.pacer:
            self.pacer.loop_lag = self._handoff.lag
        self._clock = self.pacer.now if self.pacer else engine.clock.now
        config = engine.config.scheduler
        self.metrics = ServerMetrics(model_name, config.num_gpu_blocks, config.block_size)
        self._lock = threading.Lock()
        self._commands: list[_Add | _Abort | _Reset] = []
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._stop = False
        self._thread: threading.Thread | None = None
        self.num_steps = 0

    # ---- event-loop side ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._handoff.loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="refengine-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stop the engine thread (server stop): it finishes its step, fails the requests not yet added, shuts the
        engine down (the requests still running end with finish_reason "abort") and exits."""
        self._stop = True
        self._wake.set()
        if self._thread is None:  # never started: nothing else touches the engine
            self.engine.shutdown()
            return
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, SHUTDOWN_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("the engine thread did not stop within %.0f s", SHUTDOWN_TIMEOUT_S)

    async def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        queue: asyncio.Queue[StreamItem],
        tag: object = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; raises the engine's ValueError for bad input. Outputs go to `queue` as
        (tag, RequestOutput) and, if the engine fails, (tag, EngineError)."""
        await self.add_requests([(request_id, prompt, tag)], params, queue, priority, arrival_time)

    async def add_requests(
        self,
        items: Sequence[NewItem],
        params: SamplingParams,
        queue: asyncio.Queue[StreamItem],
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        """Queue several requests (request_id, prompt, tag) at once, all or nothing: the engine thread adds them
        between two steps, and if one is refused it aborts those of the batch already added and raises
        `BatchRefused` (the index and the engine's ValueError)."""
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        arrival = self._clock() if arrival_time is None else arrival_time
        self._send(_Add(list(items), params, queue, priority, arrival, fut))
        await asyncio.wrap_future(fut)

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests (a client went away); their blocks are freed at the engine's next step. Once the server
        is stopping this does nothing: the engine's shutdown aborts every request it still holds."""
        if request_ids and not self._stop:
            self._send(_Abort(list(request_ids)))

    async def reset_prefix_cache(self) -> bool:
        """Ask the engine thread to forget every cached prefix between two steps (LLMEngine.reset_prefix_cache):
        True once done, False while a request holds KV blocks."""
        fut: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._send(_Reset(fut))
        return await asyncio.wrap_future(fut)

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _send(self, command: _Add | _Abort | _Reset) -> None:
        if not self.is_running():
            raise EngineError("the engine thread is not running")
        with self._lock:
            self._commands.append(command)
        self._wake.set()

    # ---- engine-thread side ---------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop_until_stopped()
        finally:
            self._close()

    def _close(self) -> None:
        """The engine thread's last act: no command is left unanswered, no stream without its final output."""
        with self._lock:
            commands, self._commands = self._commands, []
        for cmd in commands:
            if isinstance(cmd, (_Add, _Reset)) and not cmd.fut.done():
                cmd.fut.set_exception(EngineError("the server is shutting down"))
        try:
            self._after_step(self.engine.shutdown())
        except Exception as e:  # noqa: BLE001
            log.error("engine shutdown failed: %s", traceback.format_exc())
            self._fail_streams(EngineError(f"engine shutdown failed: {type(e).__name__}: {e}"))

    def _loop_until_stopped(self) -> None:
        engine = self.engine
        while not self._stop:
            self._do_commands()
            if not engine.has_unfinished_requests():
                if self.pacer:
                    self.pacer.idle()
                self._publish_idle()
                self._wake.wait()
                self._wake.clear()
                continue
            if self.pacer and not self.pacer.late:  # see WRITE_WAIT_S
                self._handoff.wait_written(WRITE_WAIT_S)
            try:
                outputs = self.pacer.step() if self.pacer else engine.step()
            except Exception as e:  # an engine bug must not take the server down: fail what was in flight
                log.error("engine step failed: %s", traceback.format_exc())
                self._fail_all(EngineError(f"engine step failed: {type(e).__name__}: {e}"))
                continue
            self.num_steps += 1
            self._after_step(outputs)

    def _do_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for cmd in commands:
            if isinstance(cmd, _Reset):
                try:
                    cmd.fut.set_result(self.engine.reset_prefix_cache())
                except Exception as e:  # noqa: BLE001 (the caller gets it; the engine thread goes on)
                    cmd.fut.set_exception(e)
                continue
            if isinstance(cmd, _Abort):
                live = [rid for rid in cmd.request_ids if rid in self._streams]
                if live:
                    self.engine.abort_request(live)
                continue
            self._add_batch(cmd)

    def _add_batch(self, cmd: _Add) -> None:
        items, params, priority, arrival, fut = cmd.items, cmd.params, cmd.priority, cmd.arrival, cmd.fut
        if self.pacer:  # it joins the step about to run, which began (simulated) when the previous one ended
            arrival = min(arrival, self.engine.clock.now())
        added: list[str] = []
        for index, (rid, prompt, tag) in enumerate(items):
            try:
                self.engine.add_request(rid, prompt, params, arrival_time=arrival, priority=priority)
            except Exception as e:  # ValueError for bad input; anything else is reported the same way
                if added:  # all or nothing: no step has run since, so none of them has produced anything
                    self.engine.abort_request(added)
                    for done in added:
                        del self._streams[done]
                fut.set_exception(e if len(items) == 1 else BatchRefused(index, e))
                return
            self._streams[rid] = _Stream(cmd.queue, tag)
            added.append(rid)
        fut.set_result(None)

    def _after_step(self, outputs: list[RequestOutput]) -> None:
        engine, m = self.engine, self.metrics
        stats = engine.step_stats[-1] if engine.step_stats else None
        # A server runs for days: the per-step and per-request records the perf suite keeps are dropped here.
        engine.step_stats.clear()
        engine.finished_requests.clear()
        if stats is not None:
            m.on_step(stats.num_running, stats.num_waiting, stats.kv_blocks_used, stats.num_preempted)
        deliveries: list[tuple[asyncio.Queue[StreamItem], StreamItem]] = []
        prompt_tokens = new_tokens = 0  # counted once a step, not once an output
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            new = len(out.outputs[0].token_ids)
            new_tokens += new
            if new and not stream.started:
                stream.started = True
                prompt_tokens += len(out.prompt_token_ids)
            if out.finished:
                m.on_finished(out.metrics)
                del self._streams[out.request_id]
            deliveries.append((stream.queue, (stream.tag, out)))
        m.on_tokens(prompt_tokens, new_tokens)
        if deliveries:
            self._handoff.deliver(deliveries)

    def _publish_idle(self) -> None:
        stats = self.engine.scheduler.make_stats()
        self.metrics.on_step(stats.num_running_reqs, stats.num_waiting_reqs, stats.num_used_blocks, 0)

    def _fail_all(self, error: Exception) -> None:
        ids = list(self._streams)
        try:
            self.engine.abort_request(ids)
            self.engine.step()  # hands back the aborted outputs; frees their blocks
        except Exception:
            log.error("abort after a failed step also failed: %s", traceback.format_exc())
        self._fail_streams(error)

    def _fail_streams(self, error: Exception) -> None:
        deliveries: list[tuple[asyncio.Queue[StreamItem], StreamItem]] = [
            (s.queue, (s.tag, error)) for s in self._streams.values()
        ]
        self._streams.clear()
        self._handoff.deliver(deliveries)
