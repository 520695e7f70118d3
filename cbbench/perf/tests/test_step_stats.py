"""StepStats carries what the perf tool needs (prefill ids, static batch ids), so perf/ reads no scheduler internals.

The oracles here are the perf tool's old ways of getting the same facts: wrapping `Scheduler.schedule` to read
`is_prefill`, and rebuilding static batches from the set of requests present in each step. The slot timeline and
the slot-waste metric computed from StepStats must equal what those old ways gave on the same fixed run.
"""

from __future__ import annotations

import numpy as np
import pytest

from cbbench.perf.backends.in_process import step_records
from cbbench.perf.metrics import compute_metrics
from cbbench.perf.report.timeline import TIMELINE_OUTPUT_LENS, TIMELINE_PROMPT_LENS, Cell, assign_slots, utilisation
from refengine.models.presets import TEST_MODEL

MAX_NUM_SEQS = 3
NUM_REQUESTS = 8
MODES = ("continuous", "sequence", "static", "none")


def _run(mode: str, **engine_kw):
    """The timeline's fixed run (budget 64, so long prompts are chunked), with `schedule` wrapped as the old
    timeline did; returns the StepStats and, per step, the prefilling requests seen inside schedule()."""
    from refengine import LLMEngine, SamplingParams

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1000, 8000, size=n).tolist() for n in TIMELINE_PROMPT_LENS[:NUM_REQUESTS]]
    engine = LLMEngine(
        TEST_MODEL,
        device="cpu",
        seed=0,
        batching=mode,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=64,
        num_gpu_blocks=256,
        **engine_kw,
    )
    for i, (p, n) in enumerate(zip(prompts, TIMELINE_OUTPUT_LENS)):
        engine.add_request(str(i), p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    seen: list[set[str]] = []
    orig = engine.scheduler.schedule

    def schedule_and_note():
        out = orig()
        seen.append({rid for rid, p in out.is_prefill.items() if p})
        return out

    engine.scheduler.schedule = schedule_and_note
    while engine.has_unfinished_requests():
        engine.step()
    return list(engine.step_stats), seen


@pytest.fixture(scope="module")
def runs():
    import torch

    torch.set_num_threads(1)
    return {m: _run(m) for m in MODES}


def _old_assign_slots(steps, prefills, batching: str) -> list[Cell]:
    """perf/timeline.py's assign_slots before StepStats had batch ids: static batches rebuilt from present sets."""
    slot_of: dict[str, int] = {}
    cells: list[Cell] = []
    batch: set[str] = set()
    free = list(range(MAX_NUM_SEQS))
    for i, s in enumerate(steps):
        present = set(s.scheduled_req_ids) | set(s.running_req_ids)
        if batching == "static" and present - batch:
            for rid in batch:
                free.append(slot_of.pop(rid))
            batch = set(present)
        for rid in sorted(present - set(slot_of), key=lambda r: int(r)):
            free.sort()
            slot_of[rid] = free.pop(0)
        for rid, slot in slot_of.items():
            if rid in s.scheduled_req_ids:
                kind = "prefill" if rid in prefills[i] else "decode"
            else:
                kind = "idle" if rid in present else "held"
            cells.append(Cell(i, slot, rid, kind))
        if batching != "static":
            for rid in [r for r in slot_of if r not in s.running_req_ids]:
                free.append(slot_of.pop(rid))
    return cells


def _old_slots_held(steps, batching: str) -> list[tuple[int | None, int]]:
    """perf/runner.py's step_dicts (now step_records) before: (slots_held, num_running) per step."""
    out, batch = [], set()
    for s in steps:
        if batching != "static":
            out.append((None, s.num_running))
            continue
        present = set(s.scheduled_req_ids) | set(s.running_req_ids)
        if present - batch:
            batch = present
        out.append((len(batch), len(s.scheduled_req_ids)))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_prefill_ids_are_what_schedule_said(runs, mode):
    steps, seen = runs[mode]
    assert len(steps) == len(seen)
    for s, pf in zip(steps, seen):
        assert set(s.prefill_req_ids) == pf
        assert set(s.prefill_req_ids) <= set(s.scheduled_req_ids)
        assert (s.num_prefill_tokens > 0) == bool(s.prefill_req_ids)
        assert (s.num_decode_tokens > 0) == bool(set(s.scheduled_req_ids) - set(s.prefill_req_ids))


@pytest.mark.parametrize("mode", MODES)
def test_timeline_slots_equal_the_old_way(runs, mode):
    steps, seen = runs[mode]
    new = assign_slots(steps, MAX_NUM_SEQS)
    assert new == _old_assign_slots(steps, seen, mode)
    if mode == "static":  # the picture shows the waste: some finished request holds its slot empty
        assert any(c.kind == "held" for c in new)
        assert utilisation(new, len(steps), MAX_NUM_SEQS) < 1


@pytest.mark.parametrize("mode", MODES)
def test_step_dicts_carry_the_timeline(runs, mode):
    """The JSON's step dicts (what `cbbench report` reads) give the same slot timeline as the StepStats."""
    import json

    steps, _ = runs[mode]
    dicts = json.loads(json.dumps([s.to_dict() for s in step_records(steps)]))
    assert assign_slots(dicts, MAX_NUM_SEQS) == assign_slots(steps, MAX_NUM_SEQS)
    assert all((d["batch_id"] is None) == (mode != "static") for d in dicts)


@pytest.mark.parametrize("mode", MODES)
def test_slot_waste_equals_the_old_way(runs, mode):
    steps, _ = runs[mode]
    records = step_records(steps)
    assert [(d.slots_held, d.num_running) for d in records] == _old_slots_held(steps, mode)
    m = compute_metrics([], 1.0, steps=records, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=64)
    if mode == "static":
        old = _old_slots_held(steps, mode)
        assert m["slot_waste"] == pytest.approx(sum(h for h, _ in old) / sum(n for _, n in old))
        assert m["slot_waste"] > 1
    else:
        assert np.isnan(m["slot_waste"])


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_static_batch_ids(runs, async_scheduling):
    """Batch ids follow FCFS admission; with async scheduling too, where step N is recorded after step N+1 was
    scheduled (and may have formed the next batch)."""
    steps = _run("static", async_scheduling=True)[0] if async_scheduling else runs["static"][0]
    first_step: dict[int, int] = {}
    members: dict[int, set[str]] = {}
    for i, s in enumerate(steps):
        assert set(s.batch_ids) == set(s.scheduled_req_ids) | set(s.running_req_ids)
        assert len(set(s.batch_ids.values())) <= 1  # one batch at a time (none in an empty drain step)
        for rid, b in s.batch_ids.items():
            first_step.setdefault(b, i)
            members.setdefault(b, set()).add(rid)
    # FCFS admission of MAX_NUM_SEQS at a time, in request order; batch ids count up from 1
    ids = [str(i) for i in range(NUM_REQUESTS)]
    want = [set(ids[k : k + MAX_NUM_SEQS]) for k in range(0, NUM_REQUESTS, MAX_NUM_SEQS)]
    assert [members[b] for b in sorted(members)] == want
    assert sorted(members) == list(range(1, len(want) + 1))
    # a batch starts only once every member of the previous one has left
    for b in sorted(members)[1:]:
        start = first_step[b]
        assert not set(steps[start - 1].running_req_ids) & members[b - 1]
        assert all(b - 1 not in s.batch_ids.values() for s in steps[start:])


@pytest.mark.parametrize("mode", ("continuous", "sequence", "none"))
def test_no_batch_ids_outside_static(runs, mode):
    steps, _ = runs[mode]
    assert all(b is None for s in steps for b in s.batch_ids.values())


def test_more_requests_than_slots_get_extra_rows():
    """An inconsistent or foreign log (3 requests present, 2 slots) is drawn with an extra row, not a crash."""
    step = {
        "scheduled_req_ids": ["a", "b", "c"],
        "running_req_ids": ["a", "b", "c"],
        "prefill_req_ids": ["a"],
        "batch_id": None,
    }
    cells = assign_slots([step], 2)
    assert [(c.slot, c.request_id, c.kind) for c in cells] == [
        (0, "a", "prefill"),
        (1, "b", "decode"),
        (2, "c", "decode"),
    ]


def test_static_batch_ids_under_async_scheduling_with_stop_tokens():
    """Requests that end on a stop token (which the scheduler cannot foresee, unlike max_tokens): with async
    scheduling, step N+1 is scheduled for them before step N finishes them, and step N+1 is recorded only after
    step N+2 has formed the next batch. Each request must keep the batch it was admitted in."""
    from refengine import LLMEngine, SamplingParams

    rng = np.random.default_rng(1)
    prompts = [rng.integers(1000, 8000, size=8).tolist() for _ in range(NUM_REQUESTS)]

    def run(params, **kw):
        engine = LLMEngine(TEST_MODEL, device="cpu", seed=0, batching="static", max_num_seqs=MAX_NUM_SEQS, **kw)
        tokens: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params[i])
        while engine.has_unfinished_requests():
            for o in engine.step():
                tokens.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
        return list(engine.step_stats), tokens

    _, free_run = run([SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * NUM_REQUESTS)
    stops = [
        SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, stop_token_ids=[free_run[str(i)][1 + i % 3]])
        for i in range(NUM_REQUESTS)
    ]
    steps, tokens = run(stops, async_scheduling=True)
    assert all(len(tokens[str(i)]) <= 2 + i % 3 for i in range(NUM_REQUESTS))  # they did stop early
    members: dict[int, set[str]] = {}
    for s in steps:
        for rid, b in s.batch_ids.items():
            members.setdefault(b, set()).add(rid)
    ids = [str(i) for i in range(NUM_REQUESTS)]
    assert [members[b] for b in sorted(members)] == [
        set(ids[k : k + MAX_NUM_SEQS]) for k in range(0, NUM_REQUESTS, MAX_NUM_SEQS)
    ]


def test_graphed_shares_of_steps_and_tokens():
    """perf.metrics' graphed shares from StepRecord.cuda_graph: over the steps that say; absent when none does (a
    simulated GPU's steps, a peer's), so those rows do not change."""
    from cbbench.perf.metrics import graphed_shares, step_metrics
    from cbbench.perf.records import StepRecord

    def step(tokens: int, graphed: bool | None) -> StepRecord:
        return StepRecord(0.0, tokens, 1, 0, 0, tokens, 0, cuda_graph=graphed)

    steps = [step(4, True), step(100, False), step(4, True), step(12, True), step(80, None)]
    assert graphed_shares(steps) == {"graphed_step_share": 3 / 4, "graphed_token_share": 20 / 120}
    assert step_metrics(steps)["graphed_token_share"] == 20 / 120
    assert "graphed_step_share" not in step_metrics([step(4, None), step(9, None)])


def test_engine_steps_say_which_replayed_a_graph():
    """End to end on the CPU: a runner whose CUDA graphs are eager stand-ins over decode-only buckets only; the
    decode steps replay, the prefill and mixed ones run eagerly, and StepStats -> StepRecord -> metrics say so."""
    from refengine import LLMEngine, SamplingParams
    from refengine.tests._hand_runner import install_eager_graphs
    from refengine.worker.cuda_graphs import GraphBuckets

    engine = LLMEngine(TEST_MODEL, max_num_seqs=4, max_num_batched_tokens=16, num_gpu_blocks=64, stats_log_size=None)
    install_eager_graphs(engine.model_runner, GraphBuckets((1, 2, 4), (), 4))
    rng = np.random.default_rng(1)
    for i, n in enumerate((30, 5, 9)):
        engine.add_request(str(i), rng.integers(1000, 8000, size=n).tolist(), SamplingParams(max_tokens=6))
    while engine.has_unfinished_requests():
        engine.step()
    stats = list(engine.step_stats)
    decode = [s for s in stats if not s.num_prefill_tokens]
    assert decode and all(s.cuda_graph for s in decode)
    assert not any(s.cuda_graph for s in stats if s.num_prefill_tokens)
    recs = step_records(stats)
    assert [r.cuda_graph for r in recs] == [s.cuda_graph for s in stats]
    row = compute_metrics([], 1.0, steps=recs)
    tokens = sum(s.num_scheduled_tokens for s in stats)
    assert row["graphed_step_share"] == len(decode) / len(stats)
    assert row["graphed_token_share"] == sum(s.num_scheduled_tokens for s in decode) / tokens


def test_the_summary_says_the_graphed_shares_on_cuda_only():
    import json

    from cbbench.perf.report.table import graphed_lines

    extra = json.dumps({"async_scheduling": True, "graphed_step_share": 0.75, "graphed_token_share": 0.5})
    cuda = {"device": "cuda", "extra": extra}
    entries = [
        (("refengine", "continuous", "-"), cuda, None),
        (("refengine", "static", "-"), {**cuda, "device": "cpu"}, None),
        (("refengine", "sequence", "-"), {"device": "cuda", "extra": ""}, None),  # (a row that does not say)
        (("refengine", "none", "-"), None, "failed"),
    ]
    assert graphed_lines(entries) == ["CUDA graphs, refengine continuous: 75% of steps, 50% of scheduled tokens"]
