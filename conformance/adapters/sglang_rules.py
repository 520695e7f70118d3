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
    if k["max_num_batched_tokens"] < k["block_size"]:
        return (
            "SGLang's difference: a prefill chunk is cut to whole pages (PrefillAdder), so a budget "
            "(max_num_batched_tokens) below one page (block_size) never admits a longer prompt"
        )
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
    known_differences = {
        "admission_reserves_future_output": (
            "SGLang's difference: admission reserves KV for each request's future output (prompt + a decaying ratio, "
            "0.7 at start, of max_new_tokens; all of it with ignore_eos) and FCFS stops at the first request that "
            "does not fit, so the requests these examples admit together to run the pool out are admitted one after "
            "another and nothing is preempted (test_admission_reserves_kv_for_future_output)"
        ),
        "prefill_or_decode_steps": (
            "SGLang's difference: with chunked prefill off there is no mixed step (--enable-mixed-chunk needs "
            "chunking), so a step that can prefill a waiting request does, and the running decode waits "
            "(test_a_prefill_step_leaves_the_running_requests_out)"
        ),
        "priority_ties_by_queue_entry": (
            "SGLang's difference: requests of equal priority are ordered by when each entered its waiting queue "
            "(SchedulePolicy._sort_by_priority_and_fcfs on Req.time_stats.wait_queue_entry_time, stamped as the "
            "scheduler receives the request), not by a caller-given arrival time, which its requests do not carry: "
            "requests added latest-arrival-first are admitted in the order they were added"
        ),
        "eos_before_min_tokens": (
            "SGLang's difference: Req.update_finish_state ends a request on an EOS fed before min_new_tokens, trusting "
            "its sampler's min-new-tokens penalizer to have masked EOS (as vLLM); unreachable with a masking sampler"
        ),
    }
    departures = {
        "priority_arrival_order": (
            "SGLang's difference: requests of one priority wait in the order they entered the waiting queue "
            "(SchedulePolicy._sort_by_priority_and_fcfs on Req.time_stats.wait_queue_entry_time), and a preempted "
            "request re-enters it (Scheduler._add_request_to_queue stamps it anew), so it waits behind the requests "
            "of its priority that were waiting, where vLLM gives it back its arrival-time place"
        ),
        "prefill_budget": (
            "SGLang's bug: with chunked prefill off and the radix cache disabled, a request with ignore_eos takes "
            "PrefillAdder.add_one_req_ignore_eos, which skips the cap add_one_req applies (a request after the first "
            "is admitted only while its prompt is below the max_prefill_tokens left), so one prefill step can compute "
            "more prompt tokens than max_prefill_tokens"
        ),
        "finish": (
            "SGLang's difference: ignore_eos turns off stop_token_ids too (Req._check_token_based_finish returns at "
            "once), where vLLM ignores only EOS; and a request's max_new_tokens is clipped to what the empty pool holds "
            "beside its paged prompt, less one page and one token (init_req_max_new_tokens), so on a pool that tight "
            "a request finishes ('length') before max_tokens"
        ),
        "token_budget": (
            "SGLang's difference: its token budget (chunked_prefill_size / max_prefill_tokens) covers prefill only; a "
            "decode step runs every running request, up to max_running_requests, whatever their number (with "
            "--enable-mixed-chunk a decode costs one token of the chunk budget)"
        ),
        "no_preemption_outside_continuous": (
            "SGLang's difference: its prefill-or-decode steps (our 'sequence') preempt as its mixed steps do: a "
            "running request is retracted at a decode step short of KV, or preempted at admission by a waiting "
            "request more urgent by more than the priority gap"
        ),
        "decode_first": (
            "SGLang's difference: a step with a prefill batch takes the running decodes along only with "
            "--enable-mixed-chunk, which acts only with chunked prefill on, and only when the KV left after the "
            "prefill fits their decode; otherwise a prefill step admits waiting requests while the running ones wait "
            "(a step is prefill or decode)"
        ),
    }
    departure_cases = {
        "priority_arrival_order": _CASES + "test_a_preempted_request_waits_behind_its_priority_peers",
        "prefill_budget": _CASES + "test_ignore_eos_requests_overrun_the_prefill_budget_without_chunking",
        "finish": _CASES + "test_ignore_eos_ignores_stop_token_ids_too",
        "token_budget": _CASES + "test_a_decode_step_runs_more_requests_than_the_budget",
        "decode_first": _CASES + "test_a_prefill_step_leaves_the_running_requests_out",
        "no_preemption_outside_continuous": _CASES + "test_priority_preemption_in_a_prefill_or_decode_step",
    }

    # invariants the adapter cannot check on SGLang, with why (the state machine does not count them as checked)
    unchecked = {
        "cached_tokens": (
            "the adapter's gap: SGLang's Req.cached_tokens adds up the prefix hits of every admission, readmissions "
            "after a retraction included, not vLLM's first-admission hit; the adapter reports none"
        )
    }

    @classmethod
    def supports(cls, knobs: dict) -> str | None:
        return unsupported_reason(knobs)
