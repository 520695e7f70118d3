"""The model runner alone, driven by hand-built SchedulerOutputs (no scheduler, no KV manager, no Request): new
requests, decode steps, chunked prefill, recompute preemption and resume, swap out and in, a finished request's
row reused, and the ModelRunnerOutput shape. Its greedy tokens must equal the whole engine's on the same prompts.
(test_model_runner_transfers.py: host transfers, padded decode batches, the staging buffer.)"""

from __future__ import annotations

import pytest

from refengine.tests._hand_runner import (
    PROMPTS,
    HandScheduler,
    blank_output,
    decode_until,
    engine_reference,
    make_runner,
)


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return engine_reference()


def test_new_request_and_decode_steps(reference):
    runner, hs = make_runner(), HandScheduler()
    out = blank_output()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.new(out, "b", PROMPTS[1], len(PROMPTS[1]))
    assert {k: len(v) for k, v in hs.step(runner, out).items()} == {"a": 1, "b": 1}
    decode_until(hs, runner, [("a", PROMPTS[0]), ("b", PROMPTS[1])], 8)
    assert hs.tokens["a"][len(PROMPTS[0]) :] == reference[0]
    assert hs.tokens["b"][len(PROMPTS[1]) :] == reference[1]


def test_chunked_prefill_samples_only_at_the_last_chunk(reference):
    runner, hs = make_runner(), HandScheduler()
    prompt = PROMPTS[2]  # 14 tokens: chunks of 5, 5, 4
    out = blank_output()
    hs.new(out, "c", prompt, 5)
    assert hs.step(runner, out) == {"c": []}  # a partial prefill samples nothing
    out = blank_output()
    hs.cached(out, "c", 5)
    assert hs.step(runner, out) == {"c": []}
    out = blank_output()
    hs.cached(out, "c", 4)
    assert len(hs.step(runner, out)["c"]) == 1
    decode_until(hs, runner, [("c", prompt)], 8)
    assert hs.tokens["c"][len(prompt) :] == reference[2]


def test_recompute_preemption_and_resume(reference):
    runner, hs = make_runner(), HandScheduler()
    out = blank_output()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.step(runner, out)
    decode_until(hs, runner, [("a", PROMPTS[0])], 3)
    hs.drop("a")
    hs.free.reverse()  # so that the resumed request gets other block ids than before
    hs.step(runner, blank_output(preempted_req_ids=["a"]))
    assert "a" not in runner.input_batch  # a preempted request gives up its row ...
    out = blank_output()
    hs.cached(out, "a", len(hs.tokens["a"]), resumed=True)  # ... and is re-prefilled whole, prompt + 3 outputs
    assert len(hs.step(runner, out)["a"]) == 1
    decode_until(hs, runner, [("a", PROMPTS[0])], 8)
    assert hs.tokens["a"][len(PROMPTS[0]) :] == reference[0]


def test_swap_out_and_in(reference):
    runner, hs = make_runner(), HandScheduler()
    out = blank_output()
    hs.new(out, "a", PROMPTS[2], len(PROMPTS[2]))
    hs.step(runner, out)
    decode_until(hs, runner, [("a", PROMPTS[2])], 4)
    computed = hs.computed["a"]
    device = hs.drop("a")
    host = list(range(len(device)))
    hs.step(runner, blank_output(preempted_req_ids=["a"], blocks_to_swap_out=list(zip(device, host))))
    # someone else overwrites the freed device blocks meanwhile
    for k, v in runner.kv_caches:
        k[device] = 7.0
        v[device] = -7.0
    hs.free.reverse()
    hs.computed["a"] = computed
    out = blank_output()
    hs.cached(out, "a", 1, resumed=True)  # decodes on from the swapped-in KV: no re-prefill
    out.blocks_to_swap_in = list(zip(host, hs.blocks["a"]))
    assert set(hs.blocks["a"]).isdisjoint(device)
    assert len(hs.step(runner, out)["a"]) == 1
    decode_until(hs, runner, [("a", PROMPTS[2])], 8)
    assert hs.tokens["a"][len(PROMPTS[2]) :] == reference[2]


def test_finished_request_frees_its_row_for_the_next(reference):
    runner, hs = make_runner(max_num_seqs=1), HandScheduler()
    out = blank_output()
    hs.new(out, "a", PROMPTS[1], len(PROMPTS[1]))
    hs.step(runner, out)
    decode_until(hs, runner, [("a", PROMPTS[1])], 8)
    hs.drop("a")
    out = blank_output(finished_req_ids={"a"})
    hs.new(out, "b", PROMPTS[0], len(PROMPTS[0]))  # the only row, freed by "a"
    hs.step(runner, out)
    decode_until(hs, runner, [("b", PROMPTS[0])], 8)
    assert hs.tokens["b"][len(PROMPTS[0]) :] == reference[0]
    assert "a" not in runner.requests and runner.input_batch.row_of == {"b": 0}
