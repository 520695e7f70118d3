"""Scheduler adapters: the one small surface through which the conformance suite drives a scheduler.

To check another engine's scheduler, write a class with the methods of `SchedulerAdapter` (see refengine_adapter.py
for the reference implementation) and register it in ADAPTERS; run `pytest conformance/ --engine NAME`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# The engine knobs every adapter takes, with our defaults (refengine.config.SchedulerConfig's), spelled out here so
# that an adapter of another engine does not depend on refengine.
ADAPTER_KNOB_DEFAULTS: dict[str, object] = dict(
    max_num_batched_tokens=8192,
    max_num_seqs=256,
    block_size=16,
    num_gpu_blocks=4096,
    num_cpu_blocks=0,
    enable_chunked_prefill=True,
    long_prefill_token_threshold=0,
    enable_prefix_caching=True,
    preemption_mode="recompute",
    policy="fcfs",
    batching="continuous",
    priority_preemption=False,
    max_model_len=1 << 30,
    async_scheduling=False,
)


@dataclass
class ReqView:
    """Engine-neutral snapshot of one request."""

    request_id: str
    status: str  # "waiting" | "running" | "preempted" | "finished"
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    priority: int
    arrival_time: float
    block_ids: list[int]  # device blocks held, in order
    num_preemptions: int = 0
    finish_reason: str | None = None
    host_block_ids: list[int] = field(default_factory=list)  # host blocks holding its KV while swapped out
    # async scheduling: tokens sampled by steps still in flight (counted in num_computed_tokens, not yet known)
    num_output_placeholders: int = 0
    max_tokens: int | None = None
    # prefix-cache hit (tokens) of its first admission, which a readmission after preemption leaves as it was
    # (vLLM's Request.num_cached_tokens, reported in its usage and metrics); -1 before its first admission; None
    # where the adapter does not report it (the checks of it are skipped then)
    num_cached_tokens: int | None = None

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_with_placeholders(self) -> int:
        return self.num_tokens + self.num_output_placeholders

    def samples_now(self) -> bool:
        """Right after a schedule() that scheduled it: does this step sample a token for it (its known tokens plus
        those of earlier steps in flight are all computed)? Partial prefills sample nothing."""
        return self.num_computed_tokens == self.num_tokens + max(self.num_output_placeholders - 1, 0)

    @property
    def sample_index(self) -> int:
        """Right after such a schedule(): the output index (0-based) of the token this step samples."""
        return self.num_output_tokens + max(self.num_output_placeholders - 1, 0)


@dataclass
class StepView:
    """What one schedule() decided, in scheduling order."""

    num_scheduled_tokens: dict[str, int]
    preempted_req_ids: list[str]
    new_req_ids: list[str]  # admitted from waiting this step (first time or resumed)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)


class SchedulerAdapter(Protocol):
    name: str
    block_size: int
    num_gpu_blocks: int

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        *,
        max_tokens: int,
        priority: int = 0,
        arrival_time: float = 0.0,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: list[int] | None = None,
    ) -> None: ...

    def schedule(self) -> StepView: ...

    def update(self, sampled: dict[str, list[int]]) -> list[str]:
        """Feed the sampled tokens of the oldest schedule() not fed yet (with async_scheduling, schedule() may be
        called again before the previous step's update()); returns the ids finished by it."""

    def abort(self, request_ids: list[str]) -> None: ...

    def running(self) -> list[ReqView]: ...

    def waiting(self) -> list[ReqView]: ...

    def request(self, request_id: str) -> ReqView: ...

    def num_free_blocks(self) -> int: ...

    def block_ref_counts(self) -> dict[int, int]: ...

    def check_invariants(self) -> None:
        """The engine's own self-check, if it has one."""

    # Optional (the suite uses them when present):
    #   num_cpu_blocks: int                                  host blocks for swap (0: no swap)
    #   host_block_ref_counts() -> dict[int, int]            ref count of every host block
    #   supports(knobs: dict) -> str | None   (classmethod)  why this engine cannot run a configuration, or None
    #   knob_domain: dict[str, tuple]                        the only values the state machine draws for these knobs
    #                                                        (what supports() refuses anyway), so that an engine
    #                                                        with few modes is not mostly drawn and refused
    #   departures: dict[str, str]                           invariant name -> why this engine departs from it by
    #                                                        design: the state machine counts those violations and
    #                                                        reports them instead of failing; every other invariant
    #                                                        still fails. Each wants a named case that shows it:
    #   departure_cases: dict[str, str]                      invariant name -> the test (path::name) that shows the
    #                                                        departure on a case of its own. A departure from a
    #                                                        universal invariant (conformance/invariants/scope.py)
    #                                                        is reported as the engine breaking it
    #   unchecked: dict[str, str]                            invariant name -> why the adapter cannot check it on
    #                                                        this engine (its views lack what it reads)
    #   known_differences: dict[str, str]                    behaviour -> why: the named example of that behaviour
    #                                                        must fail on this engine (a strict xfail, see below)
    #   stalled() -> str | None                              a state the engine is known never to leave, or a step
    #                                                        it is known to crash in (its bug, with a reason): the
    #                                                        state machine ends the example there, counted and
    #                                                        reported, instead of failing it


# The user property under which a test reports how many drawn configurations the engine's supports() refused, by
# reason (the state machine's `assume` drops them); conftest.py's summary for a foreign engine lists them.
REFUSED_PROPERTY = "refused_configs"
# ... and how many checks of each invariant the adapter declared a departure from failed (SchedulerAdapter.departures)
DEPARTED_PROPERTY = "departed_checks"
# ... and how many examples ended in a state the engine is known never to leave (SchedulerAdapter.stalled), by reason
STALLED_PROPERTY = "stalled_examples"
# ... and which knob values the machine did not draw at all (SchedulerAdapter.knob_domain), with supports()'s reason
NOT_DRAWN_PROPERTY = "not_drawn_knobs"
# ... and how many times each invariant was checked (conformance/invariants/scope.py: those that apply to the drawn
# configuration, every step), so that the summary names what was checked, not only what was not
CHECKED_PROPERTY = "checked_invariants"

ADAPTERS = {
    "refengine": "conformance.adapters.refengine_adapter:RefEngineAdapter",
    "vllm": "conformance.adapters.vllm_adapter:VLLMAdapter",
    "transformers": "conformance.adapters.transformers_adapter:TransformersAdapter",
    "sglang": "conformance.adapters.sglang_adapter:SGLangAdapter",
}


def expect_known_difference(request, adapter_cls, *behaviours: str) -> None:
    """Mark the running test a strict xfail when the engine declares one of `behaviours` a known difference: the test
    still runs, and must fail there (if the engine changes, the xfail turns into a failure and the entry goes)."""
    import pytest

    known = getattr(adapter_cls, "known_differences", {})
    for behaviour in behaviours:
        if behaviour in known:
            request.applymarker(pytest.mark.xfail(strict=True, reason=known[behaviour]))
            return


def load_adapter(name: str):
    import importlib

    if name not in ADAPTERS:
        raise ValueError(f"--engine must be one of {sorted(ADAPTERS)}, got {name!r}")
    module, cls = ADAPTERS[name].split(":")
    return getattr(importlib.import_module(module), cls)
