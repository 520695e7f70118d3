"""No request's values can hurt another: numbers the sampler cannot represent are refused when SamplingParams is
built (ValueError naming the field), every accepted value, however extreme, leaves the request batched beside it
with the tokens it has alone, and a failure no check foresaw (injected here) costs only the request that caused it
(refengine/worker/step_isolation.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine, SamplingParams
from refengine.checks import INT64_MAX, INT64_MIN
from refengine.models.presets import PRESETS
from refengine.worker.input_batch import InputBatch

MAX_MODEL_LEN = 16  # a max_tokens of 2**63 - 1 ends at the context: keeps each example to ~10 steps
INNOCENT_MAX_TOKENS = 6
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the sampler's dtype: the largest value it can hold
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32: still > 0 in the sampler
# stop ids at the vocabulary's edges and its EOS ids
EDGE_IDS = [0, 1, *PRESETS[TEST_MODEL].eos_token_ids, PRESETS[TEST_MODEL].vocab_size - 1]
MARK = 0.8125  # a temperature (exact in float32) that marks the victim of an injected failure

HOSTILE_REFUSED = [
    ("temperature", 1e39),
    ("temperature", 3.5e38),
    ("temperature", 1e300),
    ("repetition_penalty", 1e39),
    ("repetition_penalty", 3.5e38),
    ("repetition_penalty", 1e300),
    ("repetition_penalty", 1e-300),
    ("top_p", 1e-300),
    ("temperature", np.longdouble("1e4000")),
    ("max_tokens", 2**63),
    ("min_tokens", 2**63),
    ("seed", 2**63),
    ("seed", -(2**63) - 1),
    ("stop_token_ids", [2**63]),
]


@pytest.mark.parametrize("name, value", HOSTILE_REFUSED, ids=[f"{n}={v!r}" for n, v in HOSTILE_REFUSED])
def test_unrepresentable_values_are_refused_naming_the_field(name, value):
    kwargs = {name: value}
    if name == "min_tokens":
        kwargs["max_tokens"] = INT64_MAX
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_the_extremes_that_fit_are_accepted():
    sp = SamplingParams(
        temperature=FLOAT32_MAX,
        repetition_penalty=FLOAT32_MAX,
        top_p=FLOAT32_TINY,
        max_tokens=INT64_MAX,
        min_tokens=INT64_MAX,
        top_k=2**70,
        seed=INT64_MIN,
    )
    assert sp.max_tokens == sp.min_tokens == INT64_MAX and sp.temperature == FLOAT32_MAX


def _engine(async_scheduling: bool = False, **seams) -> LLMEngine:
    return LLMEngine(
        TEST_MODEL,
        num_gpu_blocks=32,
        block_size=4,
        max_model_len=MAX_MODEL_LEN,
        async_scheduling=async_scheduling,
        **seams,
    )


def _run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, tuple]:
    """request id -> (token ids, finish_reason, error), stepping to the end and checking the engine every step."""
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, sp)
    got: dict[str, list[int]] = {rid: [] for rid in requests}
    done: dict[str, tuple] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id] += out.outputs[0].token_ids
            if out.finished:
                assert out.request_id not in done, "a request finished twice"
                done[out.request_id] = (got[out.request_id], out.outputs[0].finish_reason, out.outputs[0].error)
        engine.scheduler.check_invariants()
    assert set(done) == set(requests)
    assert engine.scheduler.num_free_blocks == 32
    return done


@pytest.fixture(scope="module")
def prompts():
    return make_prompts((5, 3), seed=7)


@pytest.fixture(scope="module")
def alone(prompts):
    """The innocent request's tokens when it runs alone."""
    done = _run(_engine(), {"innocent": (prompts[1], greedy(INNOCENT_MAX_TOKENS, ignore_eos=True))})
    return done["innocent"]


@pytest.fixture(scope="module")
def shared_engine():
    return _engine()


def _extreme(low: float, high: float) -> st.SearchStrategy[float]:
    """Values at and beyond a float field's edges (beyond float32 too): the ones SamplingParams accepts are used."""
    edges = [low, high, FLOAT32_TINY, 1e-30, 1e-300, 1e30, FLOAT32_MAX, 3.5e38, 1e39, 1e300, -FLOAT32_MAX]
    return st.one_of(
        st.sampled_from(edges), st.floats(low, high, allow_nan=False, allow_infinity=False), st.floats(-1e308, 1e308)
    )


_HUGE_INTS = [2**31, INT64_MAX, INT64_MAX + 1, 2**64, INT64_MIN, INT64_MIN - 1]


@st.composite
def hostile_params(draw) -> SamplingParams:
    """Extreme values for every numeric field; a value SamplingParams refuses on its own is left at its default,
    so that what runs is exactly what it accepts."""
    drawn = dict(
        max_tokens=draw(st.sampled_from([1, 2, MAX_MODEL_LEN, *_HUGE_INTS])),
        min_tokens=draw(st.sampled_from([0, 1, MAX_MODEL_LEN, *_HUGE_INTS])),
        temperature=draw(_extreme(0.0, FLOAT32_MAX)),
        top_p=draw(_extreme(FLOAT32_TINY, 1.0)),
        top_k=draw(st.sampled_from([-1, 0, 1, 2, *_HUGE_INTS])),
        min_p=draw(_extreme(0.0, 1.0)),
        seed=draw(st.sampled_from([None, 0, -1, *_HUGE_INTS])),
        presence_penalty=draw(_extreme(-2.0, 2.0)),
        frequency_penalty=draw(_extreme(-2.0, 2.0)),
        repetition_penalty=draw(_extreme(FLOAT32_TINY, FLOAT32_MAX)),
        stop_token_ids=draw(st.lists(st.sampled_from(EDGE_IDS), max_size=3)),
        ignore_eos=draw(st.booleans()),
    )
    kept = {}
    for name, value in drawn.items():
        try:
            SamplingParams(**{name: value, **({"max_tokens": INT64_MAX} if name == "min_tokens" else {})})
        except ValueError:
            continue
        kept[name] = value
    kept["min_tokens"] = min(kept.get("min_tokens", 0), kept.get("max_tokens", 16))
    return SamplingParams(**kept)


@settings(max_examples=30)  # each example is ~10 engine steps
@given(params=hostile_params())
def test_extreme_accepted_values_do_not_hurt_the_request_beside_them(prompts, alone, shared_engine, params):
    done = _run(
        shared_engine,
        {"hostile": (prompts[0], params), "innocent": (prompts[1], greedy(INNOCENT_MAX_TOKENS, ignore_eos=True))},
    )
    assert done["innocent"] == alone
    tokens, reason, error = done["hostile"]
    assert error is None and reason in ("stop", "length"), (reason, error)


# ---- a failure nothing checked for: injected ---------------------------------------------------------------------
def _victim_and_innocents(prompts):
    marked = SamplingParams(max_tokens=INNOCENT_MAX_TOKENS, temperature=MARK, seed=1, ignore_eos=True)
    return {"victim": (prompts[0], marked), "innocent": (prompts[1], greedy(INNOCENT_MAX_TOKENS, ignore_eos=True))}


def _check_only_the_victim_failed(done, alone, injected: str):
    assert done["innocent"] == alone
    _, reason, error = done["victim"]
    assert reason == "abort" and injected in error, (reason, error)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_sampler_failure_costs_only_the_failing_request(prompts, alone, async_scheduling):
    from refengine.sample.sampler import sample as real

    def sample(logits, md, generator):
        if md.temperature is not None and bool((md.temperature == MARK).any()):
            raise RuntimeError("injected sampler failure")
        return real(logits, md, generator)

    done = _run(_engine(async_scheduling, sampler=sample), _victim_and_innocents(prompts))
    _check_only_the_victim_failed(done, alone, "injected sampler failure")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_row_that_cannot_be_written_costs_only_its_request(prompts, alone, monkeypatch, async_scheduling):
    real = InputBatch._set_sampling

    def set_sampling(self, row, sp, eos_token_ids):
        if sp.temperature == MARK:
            raise OverflowError("injected row failure")
        return real(self, row, sp, eos_token_ids)

    monkeypatch.setattr(InputBatch, "_set_sampling", set_sampling)
    done = _run(_engine(async_scheduling), _victim_and_innocents(prompts))
    _check_only_the_victim_failed(done, alone, "injected row failure")
