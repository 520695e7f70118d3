"""Scheduler traces driven through an engine: how one engine is run through a trace (`drive`), what it decided at each
step (`StepRecord`), and the replay of a recorded trace against any adapter (`replay`).

`drive(adapter, trace)` runs one engine through a trace and yields one `StepRecord` per step: the decisions the
vLLM differential compares (conformance/test_vllm_differential.py drives refengine and vLLM side by side), and the
decisions a recorded corpus stores (conformance/record_traces.py records vLLM's; test_recorded_traces.py replays
them against any adapter with no vLLM installed). `first_difference` names the first field two records disagree on.
What a trace is, and the strategy that draws one, live in conformance/trace_spec.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from conformance.trace_spec import EOS, MAX_STEPS, Req, Trace, sample

__all__ = ["StepRecord", "TraceDivergence", "drive", "final_outputs", "first_difference", "replay"]


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
