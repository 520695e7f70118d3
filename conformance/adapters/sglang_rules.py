"""What SGLang 0.5.23's scheduler can run of the suite's knobs, and where it departs from the suite's rules, with the
case that shows each: plain data, importable without SGLang (the default suite checks it, test_invariant_scope.py;
sglang_adapter.py, which needs SGLang, takes it from here).

The departures are SGLang's design, read from python/sglang/srt/managers/scheduler.py, schedule_policy.py and
schedule_batch.py of the pinned release, each shown on a case of its own in conformance/test_sglang_adapter.py.
"""

from __future__ import annotations

from conformance.adapters import ADAPTER_KNOB_DEFAULTS

SGLANG_VERSION = "0.5.23"
KNOB_DEFAULTS = dict(ADAPTER_KNOB_DEFAULTS)
_CASES = "conformance/test_sglang_adapter.py::"


def unsupported_reason(knobs: dict) -> str | None:
    """Why SGLang's scheduler cannot run this configuration of our knobs, or None if it can."""
    k = {**KNOB_DEFAULTS, **knobs}
    if k["batching"] not in ("continuous", "sequence"):
        return (
            f"SGLang's difference: it batches continuously, prefill steps apart from decode steps by default "
            f"(our 'sequence') or mixed with --enable-mixed-chunk (our 'continuous'); batching={k['batching']!r} "
            "has nothing to check there"
        )
    if k["preemption_mode"] == "swap":
        return (
            "SGLang's difference: a retracted request's KV is freed and recomputed (its host-pool backup is for "
            "disaggregated decode only), so preemption_mode='swap' is unchecked there"
        )
    if k["long_prefill_token_threshold"]:
        return "SGLang's difference: it has no long_prefill_token_threshold (a chunk takes the chunk budget left)"
    if k["async_scheduling"]:
        return (
            "the adapter's gap: SGLang's overlap scheduler processes a step's result while the next runs, on a CUDA "
            "stream; the adapter runs SGLang's steps in lockstep (its --disable-overlap-schedule loop)"
        )
    if not k["enable_chunked_prefill"] and k["max_num_batched_tokens"] < k["block_size"]:
        return "SGLang's difference: its prefill budget is rounded to whole pages, none fits below one page"
    return None


class SGLangRules:
    """The declarations of sglang_adapter.SGLangAdapter, without SGLang."""

    name = "sglang"
    knob_domain = {
        "preemption_mode": ("recompute",),
        "long_prefill_token_threshold": (0,),
        "async_scheduling": (False,),
    }
    # behaviours whose named example must fail on SGLang (conformance.adapters.expect_known_difference)
    known_differences: dict[str, str] = {}
    departures = {
        "token_budget": (
            "SGLang's difference: its token budget (chunked_prefill_size / max_prefill_tokens) covers prefill only; a "
            "decode step runs every running request, up to max_running_requests, whatever their number (with "
            "--enable-mixed-chunk a decode costs one token of the chunk budget)"
        ),
        "decode_first": (
            "SGLang's difference: a step runs prefill when it can form a prefill batch and decodes otherwise, so a "
            "prefill step admits waiting requests while the running ones wait; with --enable-mixed-chunk the "
            "running requests ride along only when the KV left after the prefill fits their decode"
        ),
        "preemption_victim": (
            "SGLang's difference: a decode step short of KV retracts the running request with the fewest output "
            "tokens (then the longest prompt) first, not the most recently admitted"
        ),
        "preemption_needed": (
            "SGLang's difference: admission reserves KV for each running request's future output (a decaying "
            "new-token ratio of its remaining max_new_tokens), and a decode step that cannot fit retracts requests "
            "until the rest fit, not only until one step's blocks fit; with priority preemption a waiting request "
            "more urgent by more than the gap preempts at admission"
        ),
        "admission_order": (
            "SGLang's difference: its waiting queue is re-sorted every step by its policy (fcfs: arrival; priority: "
            "priority then arrival), and a retracted request goes to the back of the queue, so its readmission "
            "order is not the queue order our views showed before the step"
        ),
        "cached_tokens": (
            "SGLang's difference: it reports no first-admission prefix hit (vLLM's num_cached_tokens); the adapter "
            "reports none, so the check is skipped"
        ),
        "no_admission_after_preemption": (
            "SGLang's difference: a prefill step may preempt running requests of lower priority (by more than the "
            "gap) and admit the more urgent waiting request in the same step"
        ),
    }
    departure_cases = {
        "token_budget": _CASES + "test_a_decode_step_runs_more_requests_than_the_budget",
        "decode_first": _CASES + "test_a_prefill_step_leaves_the_running_requests_out",
        "preemption_victim": _CASES + "test_retraction_takes_the_request_with_fewest_outputs",
        "preemption_needed": _CASES + "test_retraction_frees_room_for_more_than_one_step",
        "admission_order": _CASES + "test_a_retracted_request_goes_to_the_back_of_the_queue",
        "cached_tokens": _CASES + "test_no_first_admission_prefix_hit_is_reported",
        "no_admission_after_preemption": _CASES + "test_priority_preemption_admits_in_the_same_step",
    }

    @classmethod
    def supports(cls, knobs: dict) -> str | None:
        return unsupported_reason(knobs)
