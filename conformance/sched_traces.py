"""Scheduler traces: what the vLLM differential draws, how one engine is driven through a trace, and what it decided.

A trace is a scheduler configuration (budget, max_num_seqs, block size and count, chunked prefill, long-prefill
threshold, prefix caching, fcfs/priority, sync or async scheduling) plus requests (prompt from a few shared prefixes
and a random tail, max_tokens, min_tokens, priority, arrival step and time) and a few aborts. A seeded fake sampler
gives every engine the same token for the same (request, output position), EOS at random once min_tokens are out.

`drive(adapter, trace)` runs one engine through a trace and yields one `StepRecord` per step: the decisions the
vLLM differential compares (conformance/test_vllm_differential.py drives refengine and vLLM side by side), and the
decisions a recorded corpus stores (conformance/record_traces.py records vLLM's; test_recorded_traces.py replays
them against any adapter with no vLLM installed). `first_difference` names the first field two records disagree on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from hypothesis import strategies as st

EOS = 0
VOCAB = range(1, 50)
MAX_MODEL_LEN = 4096  # far above any trace's length: no engine may stop a request on it
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
            lines.append(
                f"  {r.rid}: arrive@{r.arrive} t={r.arrival_time} prompt_len={len(r.prompt)} "
                f"max_tokens={r.max_tokens} min_tokens={r.min_tokens} prio={r.priority} "
                f"prompt={r.prompt}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "knobs": self.knobs,
            "reqs": [asdict(r) for r in self.reqs],
            "aborts": self.aborts,
            "seed": self.seed,
            "eos_prob": self.eos_prob,
        }

    @classmethod
    def from_json(cls, d: dict) -> Trace:
        return cls(
            dict(d["knobs"]),
            [Req(**r) for r in d["reqs"]],
            [(int(s), rid) for s, rid in d["aborts"]],
            d["seed"],
            d["eos_prob"],
        )


def sample(trace: Trace, rid: str, n: int, min_tokens: int) -> int:
    """The token a request samples as its output #n+1: a pure function of (seed, request, position), so every engine
    gets the same one whatever order it schedules in. EOS is masked until min_tokens, as the sampler does."""
    rng = random.Random(f"{trace.seed}:{rid}:{n}")
    if n + 1 > min_tokens and rng.random() < trace.eos_prob:
        return EOS
    return rng.choice(VOCAB)


# ---- what one step decided ------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """One schedule() (and the update fed after it), in the forms every engine must agree on. Lists compared as sets
    are kept sorted: the admitted ids (their order is already in `sched`), the waiting requests (vLLM keeps two
    waiting queues) and the finished ids."""

    sched: list[tuple[str, int]]  # num_scheduled_tokens, in scheduling order
    preempted: list[str]  # in preemption order
    admitted: list[str]  # sorted
    free: int  # free device blocks after schedule()
    running: list[tuple[str, int, int, list[int]]]  # (id, computed tokens, output placeholders, block ids)
    waiting: list[tuple[str, int]]  # sorted (id, output tokens)
    finished: list[str] | None  # sorted ids finished by the update fed this step (None: nothing fed, async step 0)

    def to_json(self) -> list:
        return [self.sched, self.preempted, self.admitted, self.free, self.running, self.waiting, self.finished]

    @classmethod
    def from_json(cls, row: list) -> StepRecord:
        sched, pre, adm, free, running, waiting, fin = row
        return cls(
            [tuple(x) for x in sched],
            pre,
            adm,
            free,
            [(a, b, c, list(d)) for a, b, c, d in running],
            [tuple(x) for x in waiting],
            fin,
        )

    def line(self) -> str:
        return (
            f"sched={dict(self.sched)} preempted={self.preempted} new={self.admitted} free={self.free} "
            f"finished={self.finished}"
        )


_FIELDS = [
    ("sched", "num_scheduled_tokens (in order)"),
    ("preempted", "preempted ids"),
    ("admitted", "admitted ids"),
    ("free", "free device blocks"),
    ("running", "running (id, computed tokens, output placeholders, block ids)"),
    ("waiting", "waiting (id, output tokens)"),
    ("finished", "finished ids"),
]


def first_difference(a: StepRecord, b: StepRecord) -> tuple[str, object, object] | None:
    """The first field (in the order a reader checks a step) on which two records differ, with both values."""
    for name, label in _FIELDS:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            return label, va, vb
    return None


def drive(eng, trace: Trace, max_steps: int = MAX_STEPS) -> Iterator[StepRecord]:
    """Run one engine (a SchedulerAdapter) through the trace, yielding each step's record. With async scheduling it
    is driven as vLLM's engine core drives it: step N's output is fed after step N+1's schedule(). Ends when every
    request arrived and none is running or waiting; then the last output in flight is fed and its finished ids come
    as one more record with nothing scheduled. Raises RuntimeError if not done after max_steps."""
    by_step: dict[int, list[Req]] = {}
    for r in trace.reqs:
        by_step.setdefault(r.arrive, []).append(r)
    aborts: dict[int, list[str]] = {}
    for step, rid in trace.aborts:
        aborts.setdefault(step, []).append(rid)
    last_arrival = max([r.arrive for r in trace.reqs] + [s for s, _ in trace.aborts] + [0])
    spec = {r.rid: r for r in trace.reqs}
    in_flight = trace.knobs.get("async_scheduling", False)
    pending: dict[str, list[int]] | None = None
    for step in range(max_steps):
        for r in by_step.get(step, []):
            eng.add_request(
                r.rid,
                r.prompt,
                max_tokens=r.max_tokens,
                min_tokens=r.min_tokens,
                priority=r.priority,
                arrival_time=r.arrival_time,
            )
        for rid in aborts.get(step, []):
            eng.abort([rid])
        out = eng.schedule()
        rec = StepRecord(
            sched=list(out.num_scheduled_tokens.items()),
            preempted=list(out.preempted_req_ids),
            admitted=sorted(out.new_req_ids),
            free=eng.num_free_blocks(),
            running=[
                (v.request_id, v.num_computed_tokens, v.num_output_placeholders, list(v.block_ids))
                for v in eng.running()
            ],
            waiting=sorted((v.request_id, v.num_output_tokens) for v in eng.waiting()),
            finished=None,
        )
        sampled = {}
        for rid in out.num_scheduled_tokens:
            v = eng.request(rid)
            if v.samples_now():  # prompt + outputs (+ tokens in flight) wholly computed: it samples
                sampled[rid] = [sample(trace, rid, v.sample_index, spec[rid].min_tokens)]
        to_feed, pending = (pending, sampled) if in_flight else (sampled, None)
        if to_feed is not None:
            rec.finished = sorted(eng.update(to_feed))
        eng.check_invariants()
        yield rec
        if step >= last_arrival and not eng.running() and not eng.waiting():
            if pending is not None:  # the last step's output, for requests that have all finished meanwhile
                yield StepRecord([], [], [], eng.num_free_blocks(), [], [], sorted(eng.update(pending)))
            return
    raise RuntimeError(f"not done after {max_steps} steps")


def final_outputs(eng, trace: Trace) -> dict[str, list]:
    """Every request's (output length, finish_reason, status) once a trace is done."""
    out = {}
    for r in trace.reqs:
        v = eng.request(r.rid)
        out[r.rid] = [v.num_output_tokens, v.finish_reason, v.status]
    return out


class TraceDivergence(AssertionError):
    """An engine's decisions left a recorded trace's."""


def replay(adapter_cls, row: dict, recorded_with: str = "vLLM") -> None:
    """Drive the adapter through the recorded trace; fail at the first step whose record differs from vLLM's."""
    trace = Trace.from_json(row)
    eng = adapter_cls(eos_token_id=EOS, **trace.knobs)
    expected = [StepRecord.from_json(s) for s in row["steps"]]
    where = f"trace {row['id']} (recorded with {recorded_with})"

    def fail(step: int, what: str, want, got) -> None:
        before = "\n".join(f"    step {i}: {expected[i].line()}" for i in range(max(0, step - 5), step))
        raise TraceDivergence(
            f"{where}: first divergence at step {step}: {what} differ\n  vLLM:       {want}\n"
            f"  {eng.name + ':':11} {got}\n  steps before it (both agreed):\n{before}\n"
            f"trace:\n{trace!r}"
        )

    steps = drive(eng, trace)
    for i, want in enumerate(expected):
        try:
            got = next(steps, None)
        except RuntimeError as e:  # never done
            return fail(i, "progress", want.line(), str(e))
        if got is None:
            return fail(i, "steps", want.line(), "done (nothing left to schedule)")
        diff = first_difference(want, got)
        if diff is not None:
            return fail(i, *diff)
    extra = next(steps, None)
    if extra is not None:
        return fail(len(expected), "steps", "done (nothing left to schedule)", extra.line())
    final = final_outputs(eng, trace)
    if final != row["final"]:
        fail(len(expected), "final (output tokens, finish_reason, status) per request", row["final"], final)


# ---- drawing traces ---------------------------------------------------------------------------------------------


@st.composite
def traces(draw, policy: str, prefix_caching: bool, chunked: bool, async_scheduling: bool = False) -> Trace:
    block_size = draw(st.sampled_from([2, 4, 8]), label="block_size")
    num_gpu_blocks = draw(st.integers(3, 24), label="num_gpu_blocks")
    max_num_seqs = draw(st.integers(1, 6), label="max_num_seqs")
    budget = draw(st.integers(max(max_num_seqs, 4), 48), label="max_num_batched_tokens")  # vLLM: budget >= seqs
    thr = draw(st.one_of(st.just(0), st.integers(1, 12)), label="long_prefill_token_threshold")
    knobs = dict(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=thr,
        enable_prefix_caching=prefix_caching,
        policy=policy,
        max_model_len=MAX_MODEL_LEN,
        async_scheduling=async_scheduling,
    )
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
