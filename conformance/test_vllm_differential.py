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
  - an EOS fed before min_tokens: vLLM finishes the request, refengine ignores it, as SPEC section 2b says.
    A masking sampler never produces it; refengine/SPEC is the more defensive side.

Skipped unless vLLM is importable; it lives in its own environment (`bash ci/setup_vllm_env.sh`):
    .venv-vllm/bin/pytest conformance/test_vllm_differential.py -q -p no:cacheprovider
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vllm's first import
pytest.importorskip("vllm", reason="vLLM is not installed (see ci/setup_vllm_env.sh)")

from hypothesis import given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conformance.adapters.refengine_adapter import RefEngineAdapter  # noqa: E402
from conformance.adapters.vllm_adapter import VLLMAdapter  # noqa: E402

pytestmark = pytest.mark.vllm

EOS = 0
VOCAB = range(1, 50)
MAX_MODEL_LEN = 4096  # far above any trace's length: neither engine may stop a request on it
PREFIXES = [[random.Random(p).randrange(1000, 2000) for _ in range(48)] for p in range(3)]
MAX_STEPS = 400


@dataclass
class Req:
    rid: str
    arrive: int  # step before whose schedule() it is added
    prompt: list[int]
    max_tokens: int
    min_tokens: int = 0
    priority: int = 0
    arrival_time: float = 0.0


@dataclass
class Trace:
    knobs: dict
    reqs: list[Req]
    aborts: list[tuple[int, str]] = field(default_factory=list)  # (step, request id)
    seed: int = 0
    eos_prob: float = 0.0

    def __repr__(self) -> str:  # short enough to read in a failure report
        lines = [f"knobs={self.knobs}", f"seed={self.seed} eos_prob={self.eos_prob} aborts={self.aborts}"]
        for r in self.reqs:
            lines.append(f"  {r.rid}: arrive@{r.arrive} t={r.arrival_time} prompt_len={len(r.prompt)} "
                         f"max_tokens={r.max_tokens} min_tokens={r.min_tokens} prio={r.priority} "
                         f"prompt={r.prompt}")
        return "\n".join(lines)


def sample(trace: Trace, rid: str, n: int, min_tokens: int) -> int:
    """The token a request samples as its output #n+1: a pure function of (seed, request, position), so both engines
    get the same one whatever order they schedule in. EOS is masked until min_tokens, as the sampler does."""
    rng = random.Random(f"{trace.seed}:{rid}:{n}")
    if n + 1 > min_tokens and rng.random() < trace.eos_prob:
        return EOS
    return rng.choice(VOCAB)


class Mismatch(AssertionError):
    pass


def run(trace: Trace, max_steps: int = MAX_STEPS) -> list[str]:
    """Drive refengine and vLLM in lockstep; raise Mismatch at the first step they disagree. Returns the step log."""
    ref = RefEngineAdapter(eos_token_id=EOS, **trace.knobs)
    vl = VLLMAdapter(eos_token_id=EOS, **trace.knobs)
    by_step: dict[int, list[Req]] = {}
    for r in trace.reqs:
        by_step.setdefault(r.arrive, []).append(r)
    aborts: dict[int, list[str]] = {}
    for step, rid in trace.aborts:
        aborts.setdefault(step, []).append(rid)
    last_arrival = max([r.arrive for r in trace.reqs] + [s for s, _ in trace.aborts] + [0])
    spec = {r.rid: r for r in trace.reqs}
    log: list[str] = []
    # Async scheduling, as vLLM's engine core drives it: step N's output is fed after step N+1's schedule().
    in_flight = trace.knobs.get("async_scheduling", False)
    pending: dict[str, list[int]] | None = None

    def fail(what: str, a, b) -> None:
        raise Mismatch(f"step {step}: {what} differ\n  refengine: {a}\n  vllm:      {b}\n"
                       f"trace:\n{trace!r}\nlog (refengine's view):\n" + "\n".join(log[-30:]))

    for step in range(max_steps):
        for r in by_step.get(step, []):
            for eng in (ref, vl):
                eng.add_request(r.rid, r.prompt, max_tokens=r.max_tokens, min_tokens=r.min_tokens,
                                priority=r.priority, arrival_time=r.arrival_time)
        for rid in aborts.get(step, []):
            ref.abort([rid])
            vl.abort([rid])
        a, b = ref.schedule(), vl.schedule()
        log.append(f"step {step}: sched={a.num_scheduled_tokens} preempted={a.preempted_req_ids} "
                   f"new={a.new_req_ids} free={ref.num_free_blocks()} | vllm sched={b.num_scheduled_tokens} "
                   f"preempted={b.preempted_req_ids} free={vl.num_free_blocks()}")
        if list(a.num_scheduled_tokens.items()) != list(b.num_scheduled_tokens.items()):
            fail("num_scheduled_tokens", a.num_scheduled_tokens, b.num_scheduled_tokens)
        if a.preempted_req_ids != b.preempted_req_ids:
            fail("preempted ids", a.preempted_req_ids, b.preempted_req_ids)
        # as sets: their order is already in num_scheduled_tokens, and RefEngineAdapter lists new before resumed
        if sorted(a.new_req_ids) != sorted(b.new_req_ids):
            fail("admitted ids", a.new_req_ids, b.new_req_ids)
        if ref.num_free_blocks() != vl.num_free_blocks():
            fail("free device blocks", ref.num_free_blocks(), vl.num_free_blocks())
        held_a = [(v.request_id, v.num_computed_tokens, v.num_output_placeholders, v.block_ids) for v in ref.running()]
        held_b = [(v.request_id, v.num_computed_tokens, v.num_output_placeholders, v.block_ids) for v in vl.running()]
        if held_a != held_b:
            fail("running (id, computed tokens, output placeholders, block ids)", held_a, held_b)
        waiting_a = [(v.request_id, v.num_output_tokens) for v in ref.waiting()]
        waiting_b = [(v.request_id, v.num_output_tokens) for v in vl.waiting()]
        if sorted(waiting_a) != sorted(waiting_b):  # (as sets: vLLM keeps two waiting queues)
            fail("waiting (id, output tokens)", waiting_a, waiting_b)
        sampled = {}
        for rid in a.num_scheduled_tokens:
            v = ref.request(rid)
            if v.samples_now():  # prompt + outputs (+ tokens in flight) wholly computed: it samples
                sampled[rid] = [sample(trace, rid, v.sample_index, spec[rid].min_tokens)]
        to_feed, pending = (pending, sampled) if in_flight else (sampled, None)
        if to_feed is not None:
            fa, fb = ref.update(to_feed), vl.update(to_feed)
            if sorted(fa) != sorted(fb):
                fail("finished ids", sorted(fa), sorted(fb))
        ref.check_invariants()
        vl.check_invariants()
        if step >= last_arrival and not ref.running() and not ref.waiting():
            if pending is not None:  # the last step's output, for requests that have all finished meanwhile
                fa, fb = ref.update(pending), vl.update(pending)
                if fa or fb:
                    fail("finished ids (last output)", fa, fb)
            if vl.running() or vl.waiting():
                fail("unfinished requests", [], [v.request_id for v in vl.running() + vl.waiting()])
            break
    else:
        raise Mismatch(f"not done after {max_steps} steps (both engines agreed throughout)\ntrace:\n{trace!r}\nlog:\n"
                       + "\n".join(log[-30:]))
    for rid in spec:
        va, vb = ref.request(rid), vl.request(rid)
        if (va.num_output_tokens, va.finish_reason) != (vb.num_output_tokens, vb.finish_reason):
            raise Mismatch(f"{rid} ended differently: refengine {va} vs vllm {vb}\ntrace:\n{trace!r}")
        assert va.status == vb.status == "finished", (va, vb)
    return log


# ---- drawing traces ---------------------------------------------------------------------------------------------

@st.composite
def traces(draw, policy: str, prefix_caching: bool, chunked: bool, async_scheduling: bool = False) -> Trace:
    block_size = draw(st.sampled_from([2, 4, 8]), label="block_size")
    num_gpu_blocks = draw(st.integers(3, 24), label="num_gpu_blocks")
    max_num_seqs = draw(st.integers(1, 6), label="max_num_seqs")
    budget = draw(st.integers(max(max_num_seqs, 4), 48), label="max_num_batched_tokens")  # vLLM: budget >= seqs
    thr = draw(st.one_of(st.just(0), st.integers(1, 12)), label="long_prefill_token_threshold")
    knobs = dict(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, block_size=block_size,
                 num_gpu_blocks=num_gpu_blocks, enable_chunked_prefill=chunked, long_prefill_token_threshold=thr,
                 enable_prefix_caching=prefix_caching, policy=policy, max_model_len=MAX_MODEL_LEN,
                 async_scheduling=async_scheduling)
    seed = draw(st.integers(0, 2**16), label="seed")
    rng = random.Random(seed)
    kv_cap = num_gpu_blocks * block_size
    n = draw(st.integers(1, 8), label="num_requests")
    # Ids drawn from r0..r12, so that string order ("r10" < "r2") differs from arrival order: ties fall to the id.
    ids = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n, unique=True), label="ids")
    reqs = []
    for i in ids:
        pfx = draw(st.integers(0, len(PREFIXES) - 1))
        pfx_len = draw(st.integers(0, 24))
        tail = draw(st.integers(0, 10))
        prompt = PREFIXES[pfx][:pfx_len] + [rng.randrange(2000, 3000) for _ in range(tail)]
        prompt = prompt or [rng.randrange(2000, 3000)]
        max_tokens = draw(st.integers(1, 12))
        # Only requests that fit alone, as an engine's API would insist: prompt + max_tokens - 1 tokens of KV fit the
        # device; without chunked prefill the whole sequence (a recompute re-prefills prompt + outputs) fits a step.
        prompt = prompt[: kv_cap if chunked else min(kv_cap, budget - 1)]
        max_tokens = min(max_tokens, kv_cap - len(prompt) + 1)
        if not chunked:
            max_tokens = min(max_tokens, budget - len(prompt))
        max_tokens = max(1, max_tokens)
        min_tokens = min(draw(st.integers(0, 2)), max_tokens)
        priority = draw(st.integers(0, 2)) if policy == "priority" else 0
        arrive = draw(st.integers(0, 8))
        reqs.append(Req(f"r{i}", arrive, prompt, max_tokens, min_tokens, priority))
    # Arrival times non-decreasing in arrival-step order, often exactly equal to the previous one's: equal
    # (priority, arrival_time) keys are then ordered by request id in both engines.
    t = 0.0
    for r in sorted(reqs, key=lambda r: r.arrive):
        if not draw(st.booleans(), label="tie"):
            t += 1.0
        r.arrival_time = t
    aborts = []
    for _ in range(draw(st.integers(0, 2), label="num_aborts")):
        aborts.append((draw(st.integers(0, 20)), reqs[draw(st.integers(0, n - 1))].rid))
    eos_prob = draw(st.sampled_from([0.0, 0.1, 0.3]), label="eos_prob")
    return Trace(knobs, reqs, aborts, seed, eos_prob)


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
    k = dict(max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_gpu_blocks=3, enable_chunked_prefill=True,
             long_prefill_token_threshold=0, enable_prefix_caching=True, policy="fcfs", max_model_len=MAX_MODEL_LEN)
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
    log = run(Trace(_knobs(num_gpu_blocks=4, policy="priority", enable_prefix_caching=False),
                    [Req("r1", 0, [2394], 1, 0, 0, 0.0), Req("r2", 0, [2776, 2911, 2430], 5, 0, 1, 1.0),
                     Req("r0", 3, [2864], 2, 0, 0, 2.0)]))
    assert _step(log, 4).startswith("step 4: sched={'r0': 1} preempted=['r2']"), log


def test_agrees_unhashed_blocks_reused_first():
    """r1's hashless block, freed after r0's cached prefix, is reused first, so r3 still hits r0's two blocks."""
    log = run(Trace(_knobs(max_num_seqs=1),
                    [Req("r0", 0, [X] * 4, 1, 0, 0, 0.0), Req("r1", 0, [2864], 1, 0, 0, 1.0),
                     Req("r2", 0, [2394], 1, 0, 0, 2.0), Req("r3", 0, [X] * 4 + [2776], 1, 0, 0, 3.0)]))
    assert _step(log, 3).startswith("step 3: sched={'r3': 1}"), log


def test_agrees_duplicate_blocks_cached():
    """r0 and r1 compute the same prefix block side by side; both copies are cached, so after one is reused,
    r1 (preempted, re-admitted) still hits two blocks."""
    log = run(Trace(_knobs(long_prefill_token_threshold=1),
                    [Req("r0", 0, [X] * 4, 2, 0, 0, 0.0), Req("r1", 0, [X] * 4 + [2864], 1, 0, 0, 1.0)]))
    assert _step(log, 5).startswith("step 5: sched={'r1': 1}"), log


# ---- the remaining known differences ------------------------------------------------------------------------------

def test_agrees_priority_ties():
    """Equal (priority, arrival_time): both order by request id, a string comparison ("r10" < "r2"), as vLLM's
    Request.__lt__ does (refengine once kept insertion order among equals). r1, added after r2, goes first."""
    log = run(Trace(_knobs(max_num_seqs=1, policy="priority"),
                    [Req("r0", 0, [2864], 1), Req("r2", 0, [2776], 1), Req("r1", 1, [2394], 1),
                     Req("r10", 1, [2911], 1)]))
    assert [_step(log, i).split(" preempted")[0] for i in range(1, 4)] == [
        "step 1: sched={'r1': 1}", "step 2: sched={'r10': 1}", "step 3: sched={'r2': 1}"], log


def test_known_difference_eos_before_min_tokens():
    """An EOS fed before min_tokens: vLLM's check_stop finishes the request ("stop"), trusting the sampler to have
    masked it; refengine ignores it, as SPEC section 2b says ("no stop condition ends the request" until min_tokens).
    Unreachable with a masking sampler (both engines' own, and this file's); refengine is the more defensive."""
    ends = {}
    for eng in (RefEngineAdapter(eos_token_id=EOS, **_knobs()), VLLMAdapter(eos_token_id=EOS, **_knobs())):
        eng.add_request("r0", [2864], max_tokens=4, min_tokens=2)
        eng.schedule()
        ends[eng.name] = (eng.update({"r0": [EOS]}), eng.request("r0").finish_reason)
    assert ends == {"refengine": ([], None), "vllm": (["r0"], "stop")}
