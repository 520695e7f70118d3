"""OutputProcessor: one step's updated requests -> RequestOutputs (the engine's half of vLLM's OutputProcessor).

Per request it keeps a RequestState (the live Request, its incremental detokenizer, the prompt text, how many
output tokens have been returned). Each step it feeds the new tokens to the detokenizer (which looks for stop
strings in the new text) and builds the incremental output: the token ids and text new since the last one. A
request whose stop string appeared is handed back instead: the engine finishes it through the scheduler (only the
scheduler sets `Request.status`), then asks for its output (`outputs_of`). This runs for every running request every step, so the common path
(a decode step, nothing finished, no stop strings) is kept to a few attribute reads and the two output objects.

What a step returns follows the request's `SamplingParams.output_kind` (vLLM's RequestOutputKind): DELTA (the
default here: incremental outputs), CUMULATIVE (everything so far, each step), FINAL_ONLY (no output until
the request finishes, then the whole completion; LLM.generate uses it, and so skips building a RequestOutput per
request per step, as vLLM's LLM does).

A failure tied to one request (its stop check, detokenisation, output) finishes that request alone, as aborted,
with the message in `CompletionOutput.error`; the others are not touched.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.outputs import CompletionOutput, RequestOutput
from refengine.request import Request, RequestStatus
from refengine.sampling_params import RequestOutputKind

if TYPE_CHECKING:
    from refengine.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

_FINISHED_AFTER = RequestStatus.PREEMPTED  # every status above it is a finished one (RequestStatus.is_finished)
_FINISH_REASON = {s: RequestStatus.finish_reason(s) for s in RequestStatus}


class RequestState:
    """What the output side keeps of one request until its final output."""

    __slots__ = ("request", "detokenizer", "prompt", "num_sent_tokens", "final_only", "cumulative_text")

    def __init__(self, request: Request, detokenizer: IncrementalDetokenizer, prompt: str | None) -> None:
        self.request = request
        self.detokenizer = detokenizer
        self.prompt = prompt
        self.num_sent_tokens = 0  # output tokens already returned
        kind = request.sampling_params.output_kind
        self.final_only = kind is RequestOutputKind.FINAL_ONLY
        # CUMULATIVE: the text returned so far, which each output repeats (None: DELTA or FINAL_ONLY)
        self.cumulative_text = "" if kind is RequestOutputKind.CUMULATIVE else None


DetokenizerFactory = Callable[..., IncrementalDetokenizer]  # (tokenizer, request) -> its detokenizer


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Any,
        scheduler: Scheduler,
        finished_requests: collections.deque[Request],
        detokenizer_factory: DetokenizerFactory = IncrementalDetokenizer,
    ) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler  # (its finish_requests / set_finished_status only: a failed request is aborted)
        self.finished_requests = finished_requests  # the engine's bounded deque of finished Requests
        self.detokenizer_factory = detokenizer_factory
        self.states: dict[str, RequestState] = {}

    def add_request(self, req: Request, prompt: str | None) -> None:
        self.states[req.request_id] = RequestState(req, self.detokenizer_factory(self.tokenizer, req), prompt)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.states

    def request_of(self, request_id: str) -> Request | None:
        state = self.states.get(request_id)
        return None if state is None else state.request

    def process_outputs(self, req_ids: Iterable[str]) -> tuple[list[RequestOutput], list[Request]]:
        """Outputs of the requests that got tokens this step, and the requests a stop string finished, whose outputs
        wait until the engine has finished them (`outputs_of`)."""
        outputs: list[RequestOutput] = []
        stopped: list[Request] = []
        states, make_output, append = self.states, self.make_output, outputs.append
        for rid in req_ids:
            state = states.get(rid)
            if state is None:
                continue  # (async) finished or aborted while this step was in flight: its token was dropped
            try:
                req = state.request
                if req.error is not None:  # its stop check failed and the scheduler aborted it
                    logger.error("request %r aborted: %s", rid, req.error)
                else:
                    stop = state.detokenizer.update()
                    if stop is not None:
                        req.stop_reason = stop
                        stopped.append(req)
                        continue
                if not state.final_only or req.status > _FINISHED_AFTER:
                    append(make_output(state))
            except Exception as exc:  # noqa: BLE001 (whatever failed, the other requests must not be lost)
                outputs.append(self.fail_request(state.request, exc))
        return outputs, stopped

    def outputs_of(self, requests: list[Request]) -> list[RequestOutput]:
        """The outputs of requests `process_outputs` handed back, once the engine has finished them."""
        outputs = []
        for req in requests:
            try:
                outputs.append(self.make_output(self.states[req.request_id]))
            except Exception as exc:  # noqa: BLE001 (whatever failed, the other requests must not be lost)
                outputs.append(self.fail_request(req, exc))
        return outputs

    def make_output(self, state: RequestState, text: str | None = None) -> RequestOutput:
        """The tokens and text new since the last output; the final one carries the request's metrics and drops
        its state."""
        req = state.request
        ids = req.output_token_ids
        new_ids = ids[state.num_sent_tokens :]
        status = req.status
        finished = status > _FINISHED_AFTER
        if text is None:
            text = state.detokenizer.take_delta(finished)
        if state.cumulative_text is not None:  # CUMULATIVE: everything so far (FINAL_ONLY's one output is whole)
            state.cumulative_text = text = state.cumulative_text + text
            new_ids = list(ids)
        else:
            state.num_sent_tokens = len(ids)
        completion = CompletionOutput(0, text, new_ids, _FINISH_REASON[status], req.stop_reason, req.error)
        output = RequestOutput(req.request_id, state.prompt, req.prompt_token_ids, [completion], finished)
        if finished:
            output.metrics = request_metrics(req)
            self.finished_requests.append(req)
            self.states.pop(req.request_id, None)
        return output

    def output_of(self, req: Request) -> RequestOutput:
        return self.make_output(self.states[req.request_id])

    def fail_request(self, req: Request, exc: BaseException, what: str = "request") -> RequestOutput:
        """Finish `req` alone as aborted, with the error on its output; its KV blocks go back to the pool."""
        logger.error("%s %r failed; aborting it", what, req.request_id, exc_info=exc)
        req.error = req.error or f"{what} failed: {type(exc).__name__}: {exc}"
        if req.is_finished():  # (already finished by this step's stop check: its blocks are freed)
            self.scheduler.set_finished_status([req], RequestStatus.FINISHED_ABORTED)
        else:
            self.scheduler.finish_requests([req.request_id], RequestStatus.FINISHED_ABORTED)
        state = self.states[req.request_id]
        try:
            return self.make_output(state)
        except Exception:  # noqa: BLE001 (the detokenizer itself may be what failed: report the tokens without text)
            return self.make_output(state, text="")


def request_metrics(req: Request) -> dict[str, Any]:
    """Per-request record for the perf suite (times are time.monotonic() seconds)."""
    return {
        "request_id": req.request_id,
        "prompt_len": req.num_prompt_tokens,
        "output_len": req.num_output_tokens,
        "arrival_time": req.arrival_time,
        "first_scheduled_time": req.first_scheduled_time,
        "first_token_time": req.first_token_time,
        "token_times": list(req.token_times),
        "finish_time": req.finish_time,
        "num_preemptions": req.num_preemptions,
        "num_recomputed_tokens": req.num_recomputed_tokens,
        "num_cached_tokens": max(req.num_cached_tokens, 0),
        "finish_reason": req.get_finished_reason(),
        "error": req.error,
    }
