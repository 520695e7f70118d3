"""OutputProcessor: one step's updated requests -> RequestOutputs (the engine's half of vLLM's OutputProcessor).

Per request it keeps a RequestState (the live Request, its incremental detokenizer, the prompt text, how many
output tokens have been returned). Each step it feeds the new tokens to the detokenizer (which looks for stop
strings in the new text) and builds the incremental output: the token ids and text new since the last one. It
reports, and changes nothing of the scheduler's: a request whose stop string appeared, or whose output failed, is
handed back to the engine, which finishes it through the scheduler (only the scheduler sets `Request.status`) and
then asks for its final output. This runs for every running request every step, so the common path (a decode
step, nothing finished, no stop strings) is kept to a few attribute reads and the two output objects.

What a step returns follows the request's `SamplingParams.output_kind` (vLLM's RequestOutputKind): DELTA (the
default here: incremental outputs), CUMULATIVE (everything so far, each step), FINAL_ONLY (no output until
the request finishes, then the whole completion; LLM.generate uses it, and so skips building a RequestOutput per
request per step, as vLLM's LLM does). A FINAL_ONLY request without stop strings needs no text before it ends, so
it is detokenized once, at its final output (the same text: the detokenizer gives `tokenizer.decode(ids)` however
the ids are fed); stop strings, or text returned while the request runs, need it decoded every step.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.outputs import CompletionOutput, RequestOutput
from refengine.request import Request, RequestStatus
from refengine.sampling_params import RequestOutputKind

logger = logging.getLogger(__name__)

_FINISHED_AFTER = RequestStatus.PREEMPTED  # every status above it is a finished one (RequestStatus.is_finished)
_FINISH_REASON = {s: RequestStatus.finish_reason(s) for s in RequestStatus}


class RequestState:
    """What the output side keeps of one request until its final output."""

    __slots__ = ("request", "detokenizer", "prompt", "num_sent_tokens", "final_only", "per_step", "cumulative_text")

    def __init__(self, request: Request, detokenizer: IncrementalDetokenizer, prompt: str | None) -> None:
        self.request = request
        self.detokenizer = detokenizer
        self.prompt = prompt
        self.num_sent_tokens = 0  # output tokens already returned
        sp = request.sampling_params
        kind = sp.output_kind
        self.final_only = kind is RequestOutputKind.FINAL_ONLY
        # whether the text is needed before the request ends: to return it, or to look for stop strings in it
        self.per_step = not self.final_only or bool(sp.stop)
        # CUMULATIVE: the text returned so far, which each output repeats (None: DELTA or FINAL_ONLY)
        self.cumulative_text = "" if kind is RequestOutputKind.CUMULATIVE else None


DetokenizerFactory = Callable[..., IncrementalDetokenizer]  # (tokenizer, request) -> its detokenizer


class StepOutputs(NamedTuple):
    """What `process_outputs` found in one step."""

    outputs: list[RequestOutput]  # of the requests that go on, or that the scheduler finished
    stopped: list[Request]  # ended by a stop string (`stop_reason` set): the engine finishes them, then `outputs_of`
    failed: list[tuple[Request, BaseException]]  # their output failed: the engine aborts them, then `aborted_output`


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Any,
        finished_requests: collections.deque[Request],
        detokenizer_factory: DetokenizerFactory = IncrementalDetokenizer,
    ) -> None:
        self.tokenizer = tokenizer
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

    def process_outputs(self, req_ids: Iterable[str]) -> StepOutputs:
        """Outputs of the requests that got tokens this step; the requests a stop string ended and those whose
        output failed are reported instead, their outputs waiting until the engine has finished them."""
        outputs: list[RequestOutput] = []
        stopped: list[Request] = []
        failed: list[tuple[Request, BaseException]] = []
        states, make_output, append = self.states, self.make_output, outputs.append
        for rid in req_ids:
            state = states.get(rid)
            if state is None:
                continue  # (async) finished or aborted while this step was in flight: its token was dropped
            try:
                req = state.request
                if req.error is not None:  # its stop check failed and the scheduler aborted it
                    logger.error("request %r aborted: %s", rid, req.error)
                elif state.per_step:
                    stop = state.detokenizer.update()
                    if stop is not None:
                        req.stop_reason = stop
                        stopped.append(req)
                        continue
                if not state.final_only or req.status > _FINISHED_AFTER:
                    append(make_output(state))
            except Exception as exc:  # noqa: BLE001 (whatever failed, the other requests must not be lost)
                failed.append((state.request, exc))
        return StepOutputs(outputs, stopped, failed)

    def outputs_of(self, requests: list[Request]) -> tuple[list[RequestOutput], list[tuple[Request, BaseException]]]:
        """The outputs of requests the engine has finished (after `process_outputs` reported them), and those whose
        output failed (for the engine to report aborted)."""
        outputs = []
        failed: list[tuple[Request, BaseException]] = []
        for req in requests:
            try:
                outputs.append(self.make_output(self.states[req.request_id]))
            except Exception as exc:  # noqa: BLE001 (whatever failed, the other requests must not be lost)
                failed.append((req, exc))
        return outputs, failed

    def make_output(self, state: RequestState, text: str | None = None) -> RequestOutput:
        """The tokens and text new since the last output; the final one carries the request's metrics and drops
        its state."""
        req = state.request
        ids = req.output_token_ids
        new_ids = ids[state.num_sent_tokens :]
        status = req.status
        finished = status > _FINISHED_AFTER
        if text is None:
            if not state.per_step:
                state.detokenizer.update()  # (no stop strings: returns None) every token at once, at the end
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

    def aborted_output(self, req: Request) -> RequestOutput:
        """The final output of a request the engine aborted because handling it failed; when the detokenizer itself
        is what fails, the tokens without text."""
        state = self.states[req.request_id]
        try:
            return self.make_output(state)
        except Exception:  # noqa: BLE001
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
