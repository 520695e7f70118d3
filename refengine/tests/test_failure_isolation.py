"""A failure while handling one request finishes only that request ("abort" + `error`); a failed forward aborts the
requests of that step; in every case the others finish with the tokens they would have had, the KV blocks all come
back, and the engine goes on serving. Failures are injected with monkeypatch."""

from __future__ import annotations

import pytest

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine
from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.scheduler import Scheduler
from refengine.worker.model_runner import ModelRunner

NUM_BLOCKS = 64
BLOCK = 16
PROMPT_LENS = (5, 17, 9, 30)
MAX_TOKENS = (6, 9, 7, 8)
VICTIM = "r1"


def _engine(async_scheduling: bool = False) -> LLMEngine:
    return LLMEngine(
        TEST_MODEL, num_gpu_blocks=NUM_BLOCKS, block_size=BLOCK, max_model_len=256, async_scheduling=async_scheduling
    )


def _run(engine: LLMEngine, prompts) -> dict[str, tuple[list[int], str, str | None]]:
    """Add every prompt as r0.., step to the end; request id -> (token ids, finish_reason, error)."""
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, greedy(MAX_TOKENS[i], ignore_eos=True))
    got: dict[str, list[int]] = {}
    done: dict[str, tuple[list[int], str, str | None]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            c = out.outputs[0]
            got.setdefault(out.request_id, []).extend(c.token_ids)
            if out.finished:
                assert out.request_id not in done, "a request finished twice"
                done[out.request_id] = (got[out.request_id], c.finish_reason, c.error)
    return done


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(PROMPT_LENS, seed=3)


@pytest.fixture(scope="module")
def clean(prompts):
    done = _run(_engine(), prompts)
    assert all(reason == "length" and err is None for _, reason, err in done.values())
    return done


def _check_others_unharmed(engine, done, clean, victims):
    assert set(done) == set(clean)
    for rid, (tokens, reason, err) in done.items():
        if rid in victims:
            assert reason == "abort" and err, (rid, reason, err)
        else:
            assert (tokens, reason, err) == clean[rid], rid
    assert engine.scheduler.num_free_blocks == NUM_BLOCKS
    assert not engine.scheduler.requests
    engine.scheduler.check_invariants()


def _serves_again(engine, prompts, clean):
    """The same engine still gives a fresh request the tokens a clean engine gave it."""
    engine.add_request("again", prompts[0], greedy(MAX_TOKENS[0], ignore_eos=True))
    tokens = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.outputs[0].token_ids
            if out.finished:
                assert out.outputs[0].finish_reason == "length" and out.outputs[0].error is None
    assert tokens == clean["r0"][0]
    assert engine.scheduler.num_free_blocks == NUM_BLOCKS


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_detokenizer_failure_aborts_only_its_request(prompts, clean, monkeypatch, async_scheduling):
    real = IncrementalDetokenizer.update
    calls = {"n": 0}

    def update(self):
        if self.request.request_id == VICTIM:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected detokenizer failure")
        return real(self)

    monkeypatch.setattr(IncrementalDetokenizer, "update", update)
    engine = _engine(async_scheduling)
    done = _run(engine, prompts)
    _check_others_unharmed(engine, done, clean, {VICTIM})
    tokens, _, err = done[VICTIM]
    assert "injected detokenizer failure" in err
    assert tokens == clean[VICTIM][0][:3]  # the tokens it had when it failed, and none after
    monkeypatch.setattr(IncrementalDetokenizer, "update", real)
    _serves_again(engine, prompts, clean)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_stop_check_failure_aborts_only_its_request(prompts, clean, monkeypatch, async_scheduling):
    real = Scheduler.check_stop

    def check(self, req):
        if req.request_id == VICTIM and req.num_output_tokens == 2:
            raise KeyError("injected stop-check failure")
        return real(self, req)

    monkeypatch.setattr(Scheduler, "check_stop", check)
    engine = _engine(async_scheduling)
    done = _run(engine, prompts)
    _check_others_unharmed(engine, done, clean, {VICTIM})
    assert "injected stop-check failure" in done[VICTIM][2]
    assert done[VICTIM][0] == clean[VICTIM][0][:2]
    monkeypatch.setattr(Scheduler, "check_stop", real)
    _serves_again(engine, prompts, clean)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("when", ["before", "after"])
def test_failed_forward_aborts_the_step_and_the_engine_goes_on(prompts, clean, monkeypatch, when, async_scheduling):
    """`before`: the runner raises before touching anything; `after`: the whole forward and sampling ran (KV written,
    rows updated) and then something raised. Requests not in the failed step are unharmed, also under async
    scheduling, where the next step was launched behind the failed one before its failure was known."""
    real = ModelRunner.execute_model
    state = {"calls": 0, "victims": set()}

    def execute_model(self, out):
        state["calls"] += 1
        if state["calls"] == 3:
            state["victims"] = set(out.num_scheduled_tokens)
            if when == "after":
                real(self, out)
            raise RuntimeError("injected forward failure")
        return real(self, out)

    monkeypatch.setattr(ModelRunner, "execute_model", execute_model)  # (before the engine binds it)
    engine = _engine(async_scheduling)
    # r0 and r1 run first; r2 and r3 are added after the failed forward was launched, so it cannot hold them
    for i in (0, 1):
        engine.add_request(f"r{i}", prompts[i], greedy(MAX_TOKENS[i], ignore_eos=True))
    got: dict[str, list[int]] = {}
    done: dict[str, tuple[list[int], str, str | None]] = {}
    step = 0
    while engine.has_unfinished_requests() or step < 4:
        step += 1
        if step == 4:
            for i in (2, 3):
                engine.add_request(f"r{i}", prompts[i], greedy(MAX_TOKENS[i], ignore_eos=True))
        for out in engine.step():
            c = out.outputs[0]
            got.setdefault(out.request_id, []).extend(c.token_ids)
            if out.finished:
                assert out.request_id not in done, "a request finished twice"
                done[out.request_id] = (got[out.request_id], c.finish_reason, c.error)
    assert state["victims"] == {"r0", "r1"}
    for rid in state["victims"]:
        assert "injected forward failure" in done[rid][2]
    _check_others_unharmed(engine, done, clean, state["victims"])
    monkeypatch.setattr(ModelRunner, "execute_model", real)
    _serves_again(engine, prompts, clean)


def _steps(engine) -> list[tuple]:
    return [(s.num_scheduled_tokens, s.num_running, s.scheduled_req_ids) for s in engine.step_stats]


def test_stats_are_bounded_by_stats_log_size(prompts):
    def run(size):
        engine = LLMEngine(
            TEST_MODEL, num_gpu_blocks=NUM_BLOCKS, block_size=BLOCK, max_model_len=256, stats_log_size=size
        )
        assert len(_run(engine, prompts)) == len(prompts)
        return engine

    keep_all, bounded, off = run(None), run(3), run(0)
    assert len(keep_all.step_stats) == keep_all.scheduler.num_steps > 3
    assert len(keep_all.finished_requests) == len(prompts)
    assert _steps(bounded) == _steps(keep_all)[-3:]  # the newest are the ones kept
    assert [r.request_id for r in bounded.finished_requests] == [r.request_id for r in keep_all.finished_requests][-3:]
    assert len(off.step_stats) == len(off.finished_requests) == 0


@pytest.mark.parametrize("size", [-1, 1.5, "10", True])
def test_bad_stats_log_size(size):
    with pytest.raises(ValueError, match="stats_log_size"):
        LLMEngine(TEST_MODEL, num_gpu_blocks=NUM_BLOCKS, stats_log_size=size)


def test_failure_inside_update_from_output_aborts_the_step(prompts, clean, monkeypatch):
    """update_from_output raising after it finished some requests (not in a stop check): every request of the step
    still gets exactly one final output, none is lost, and the engine goes on."""
    engine = _engine()
    sched = engine.scheduler
    real = sched.update_from_output
    state = {"step": 0, "victims": set()}

    def update_from_output(out, sampled):
        state["step"] += 1
        if state["step"] == 6:
            state["victims"] = set(out.num_scheduled_tokens)
            real(out, sampled)  # r0 (max_tokens 6) finishes in here ...
            raise RuntimeError("injected update failure")  # ... and then the call fails
        return real(out, sampled)

    monkeypatch.setattr(sched, "update_from_output", update_from_output)
    done = _run(engine, prompts)
    assert "r0" in state["victims"]
    for rid in state["victims"]:
        assert "injected update failure" in done[rid][2]
    _check_others_unharmed(engine, done, clean, state["victims"])
    _serves_again(engine, prompts, clean)
