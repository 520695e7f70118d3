"""Differential property: refengine's scheduler (the plain `RefEngineAdapter`) and vLLM's own V1 scheduler
(vllm==0.33.0, `VLLMAdapter`), driven by the same random trace, make the same decisions at every step.

A trace is a scheduler configuration (budget, max_num_seqs, block size and count, chunked prefill, long-prefill
threshold, prefix caching, fcfs/priority, sync or async scheduling) plus requests (prompt from a few shared
prefixes and a random tail, max_tokens, min_tokens, priority, arrival step) and a few aborts; a seeded fake sampler
gives both engines the same token for the same (request, output position), EOS at random once min_tokens are out. Every step both must agree on
  - num_scheduled_tokens, in scheduling order;   - the preempted ids, in order;   - the ids admitted from waiting;
  - the number of free device blocks;            - each running request's computed tokens, output placeholders
  - which requests finished;                       and block ids; the waiting requests' output counts;
and at the end on every request's output length and finish_reason. With async scheduling, vLLM's own
`AsyncScheduler` runs, and both are driven as vLLM's engine core drives it: step N's output is fed after step
N+1's schedule(), so every step schedules with an output in flight (placeholders, requests preempted or aborted
while their token is in flight, requests finished by a token that arrives after their next step was scheduled).

refengine follows vLLM 0.33 on the four behaviours this test first found (a lone request ignores the long-prefill
threshold; under priority a self-preempted request does not end the running pass; hashless freed blocks are reused
first; every copy of a cached prefix block is kept): `test_agrees_*` pins each on its original minimal trace.
Equal (priority, arrival_time) ties are ordered by request id in both (the property draws exact ties;
`test_agrees_priority_ties`). One known difference remains, kept out of the property and pinned by
`test_known_difference_*`:
  - an EOS fed before min_tokens: vLLM finishes the request, refengine ignores it, as docs/scheduling.md says.
    A masking sampler never produces it; refengine is the more defensive side.

Skipped unless vLLM is importable; it lives in its own environment (`bash ci/setup_vllm_env.sh`):
    .venv-vllm/bin/pytest conformance/test_vllm_differential.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vllm's first import
pytest.importorskip("vllm", reason="vLLM is not installed (see ci/setup_vllm_env.sh)")

from hypothesis import given, note, settings  # noqa: E402

from conformance.adapters.refengine_adapter import RefEngineAdapter  # noqa: E402
from conformance.adapters.vllm_adapter import VLLMAdapter  # noqa: E402
from conformance.progress import guarded  # noqa: E402
from conformance.sched_traces import drive, final_outputs, first_difference  # noqa: E402
from conformance.trace_spec import EOS, MAX_MODEL_LEN, MAX_STEPS, Req, Trace, traces  # noqa: E402

pytestmark = pytest.mark.vllm


class Mismatch(AssertionError):
    pass


def run(trace: Trace, max_steps: int = MAX_STEPS) -> list[str]:
    """Drive refengine and vLLM in lockstep; raise Mismatch at the first step they disagree. Returns the step log."""
    ref = guarded(RefEngineAdapter)(eos_token_id=EOS, **trace.knobs)  # a stuck engine fails with its state
    vl = guarded(VLLMAdapter)(eos_token_id=EOS, **trace.knobs)
    log: list[str] = []
    steps_a, steps_b = drive(ref, trace, max_steps), drive(vl, trace, max_steps)
    for step in range(max_steps + 1):
        try:
            a = next(steps_a, None)
            b = next(steps_b, None)
        except RuntimeError as e:  # not done after max_steps
            raise Mismatch(
                f"{e} (both engines agreed throughout)\ntrace:\n{trace!r}\nlog:\n" + "\n".join(log[-30:])
            ) from None
        if a is None and b is None:
            break
        if a is not None:
            log.append(f"step {step}: {a.line()} | vllm {b.line() if b else 'done'}")
        diff = (
            ("steps", "done" if a is None else a.line(), "done" if b is None else b.line())
            if a is None or b is None
            else first_difference(a, b)
        )
        if diff is not None:
            what, va, vb = diff
            raise Mismatch(
                f"step {step}: {what} differ\n  refengine: {va}\n  vllm:      {vb}\n"
                f"trace:\n{trace!r}\nlog (refengine's view):\n" + "\n".join(log[-30:])
            )
    for rid, (va, vb) in zip(
        [r.rid for r in trace.reqs], zip(final_outputs(ref, trace).values(), final_outputs(vl, trace).values())
    ):
        if va != vb:
            raise Mismatch(
                f"{rid} ended differently: refengine {ref.request(rid)} vs vllm {vl.request(rid)}\ntrace:\n{trace!r}"
            )
        assert va[2] == "finished", (va, vb)
    return log


# ---- the property ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "unchunked"])
@pytest.mark.parametrize("prefix_caching", [True, False], ids=["apc", "noapc"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_same_schedule_every_step(policy, prefix_caching, chunked, async_scheduling):
    @settings(max_examples=100, deadline=None)
    @given(trace=traces(policy, prefix_caching, chunked, async_scheduling))
    def check(trace):
        note(repr(trace))
        run(trace)

    check()


# ---- the former differences, on the traces that first showed them: the engines now agree ----------------------


def _knobs(**kw) -> dict:
    k = dict(
        max_num_batched_tokens=4,
        max_num_seqs=2,
        block_size=2,
        num_gpu_blocks=3,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        enable_prefix_caching=True,
        policy="fcfs",
        max_model_len=MAX_MODEL_LEN,
    )
    k.update(kw)
    return k


X = 1864  # a repeated token, so that prompts share full blocks


def _step(log: list[str], i: int) -> str:
    return log[i].split(" | ")[0]


def test_agrees_lone_request_ignores_threshold():
    """Alone, r0 prefills both tokens in one step despite threshold 1 (nobody to starve)."""
    log = run(Trace(_knobs(long_prefill_token_threshold=1), [Req("r0", 0, [2864, 2394], 1)]))
    assert _step(log, 0).startswith("step 0: sched={'r0': 2}"), log


def test_agrees_priority_self_preemption_continues():
    """Priority: in step 4 r2 (least urgent) preempts itself for a block; r0 after it is still scheduled."""
    log = run(
        Trace(
            _knobs(num_gpu_blocks=4, policy="priority", enable_prefix_caching=False),
            [
                Req("r1", 0, [2394], 1, 0, 0, 0.0),
                Req("r2", 0, [2776, 2911, 2430], 5, 0, 1, 1.0),
                Req("r0", 3, [2864], 2, 0, 0, 2.0),
            ],
        )
    )
    assert _step(log, 4).startswith("step 4: sched={'r0': 1} preempted=['r2']"), log


def test_agrees_unhashed_blocks_reused_first():
    """r1's hashless block, freed after r0's cached prefix, is reused first, so r3 still hits r0's two blocks."""
    log = run(
        Trace(
            _knobs(max_num_seqs=1),
            [
                Req("r0", 0, [X] * 4, 1, 0, 0, 0.0),
                Req("r1", 0, [2864], 1, 0, 0, 1.0),
                Req("r2", 0, [2394], 1, 0, 0, 2.0),
                Req("r3", 0, [X] * 4 + [2776], 1, 0, 0, 3.0),
            ],
        )
    )
    assert _step(log, 3).startswith("step 3: sched={'r3': 1}"), log


def test_agrees_duplicate_blocks_cached():
    """r0 and r1 compute the same prefix block side by side; both copies are cached, so after one is reused,
    r1 (preempted, re-admitted) still hits two blocks."""
    log = run(
        Trace(
            _knobs(long_prefill_token_threshold=1),
            [Req("r0", 0, [X] * 4, 2, 0, 0, 0.0), Req("r1", 0, [X] * 4 + [2864], 1, 0, 0, 1.0)],
        )
    )
    assert _step(log, 5).startswith("step 5: sched={'r1': 1}"), log


# ---- the remaining known differences ------------------------------------------------------------------------------


def test_agrees_priority_ties():
    """Equal (priority, arrival_time): both order by request id, a string comparison ("r10" < "r2"), as vLLM's
    Request.__lt__ does (refengine once kept insertion order among equals). r1, added after r2, goes first."""
    log = run(
        Trace(
            _knobs(max_num_seqs=1, policy="priority"),
            [Req("r0", 0, [2864], 1), Req("r2", 0, [2776], 1), Req("r1", 1, [2394], 1), Req("r10", 1, [2911], 1)],
        )
    )
    assert [_step(log, i).split(" preempted")[0] for i in range(1, 4)] == [
        "step 1: sched={'r1': 1}",
        "step 2: sched={'r10': 1}",
        "step 3: sched={'r2': 1}",
    ], log


def test_known_difference_eos_before_min_tokens():
    """An EOS fed before min_tokens: vLLM's check_stop finishes the request ("stop"), trusting the sampler to have
    masked it; refengine ignores it, as docs/scheduling.md says ("no stop condition ends the request" until min_tokens).
    Unreachable with a masking sampler (both engines' own, and this file's); refengine is the more defensive."""
    ends = {}
    for eng in (RefEngineAdapter(eos_token_id=EOS, **_knobs()), VLLMAdapter(eos_token_id=EOS, **_knobs())):
        eng.add_request("r0", [2864], max_tokens=4, min_tokens=2)
        eng.schedule()
        ends[eng.name] = (eng.update({"r0": [EOS]}), eng.request("r0").finish_reason)
    assert ends == {"refengine": ([], None), "vllm": (["r0"], "stop")}
