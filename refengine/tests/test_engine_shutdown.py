"""Engine lifetime: `LLMEngine.shutdown()` / `LLM.shutdown()` and their `with` blocks, as vLLM's engines shut down.

With async scheduling the forwards run in a worker thread (refengine/worker/batch_queue.py). Shutdown waits for the steps
in flight and keeps their tokens, aborts what is unfinished (finish_reason "abort", `error` saying why, KV freed),
stops the worker, and is idempotent; step() / add_request() afterwards raise. An engine dropped without shutdown
stops its worker when it is collected (weakref.finalize), so engines made in a loop do not pile up threads; and
`cbbench serve` shuts its engine down when the server stops (the lifespan of build_app).
"""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLM, LLMEngine, SamplingParams

KNOBS = dict(block_size=4, num_gpu_blocks=128, max_num_seqs=4, max_model_len=256)  # small: engines made in a loop
PROMPTS = make_prompts((5, 17, 9), seed=11)
MAX_TOKENS = (12, 9, 14)
NUM_DROPPED_ENGINES = 20
STEPS_BEFORE_SHUTDOWN = 5  # fewer than any request's max_tokens: every request is cut short by shutdown()


def _worker(engine: LLMEngine) -> threading.Thread:
    return engine.batch_queue._thread


def _drain(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    return tokens


@pytest.fixture(scope="module")
def sync_tokens() -> list[list[int]]:
    llm = LLM(TEST_MODEL, **KNOBS)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, [greedy(m) for m in MAX_TOKENS])]


def test_shutdown_stops_the_worker_thread_and_is_idempotent():
    engine = LLMEngine(TEST_MODEL, async_scheduling=True, **KNOBS)
    engine.add_request("a", PROMPTS[0], greedy(3))
    _drain(engine)
    worker = _worker(engine)
    assert worker in threading.enumerate() and worker.daemon
    assert engine.shutdown() == []  # nothing was left to abort
    assert worker not in threading.enumerate()
    assert engine.shutdown() == [] and not engine.has_unfinished_requests()
    engine.abort_request("a")  # unknown ids are ignored, as before shutdown


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_step_and_add_request_after_shutdown_raise(async_scheduling):
    engine = LLMEngine(TEST_MODEL, async_scheduling=async_scheduling, **KNOBS)
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.step()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.add_request("b", PROMPTS[0], greedy(2))
    assert not engine.has_unfinished_requests()
    llm = LLM(TEST_MODEL, async_scheduling=async_scheduling, **KNOBS)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(PROMPTS[:1], greedy(2))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_shutdown_mid_generation_keeps_tokens_and_aborts_the_rest(sync_tokens, async_scheduling):
    engine = LLMEngine(TEST_MODEL, async_scheduling=async_scheduling, **KNOBS)
    for i, (prompt, m) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        engine.add_request(str(i), prompt, greedy(m))
    tokens: dict[str, list[int]] = {}
    finished: dict[str, str] = {}
    for _ in range(STEPS_BEFORE_SHUTDOWN):  # some tokens out, none of the requests done
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
            assert not out.finished
    if async_scheduling:  # outputs come one step late: the last step's forward is still in flight
        assert len(engine.batch_queue) == 1
    last = engine.shutdown()
    for out in last:
        tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        if out.finished:
            finished[out.request_id] = out.outputs[0].finish_reason
            assert "shut down" in out.outputs[0].error
    assert finished == {str(i): "abort" for i in range(len(PROMPTS))}  # every request told how it ended
    for i, full in enumerate(sync_tokens):  # the tokens of the steps in flight were kept, and are the right ones
        got = tokens.get(str(i), [])
        assert got == full[: len(got)] and len(got) == STEPS_BEFORE_SHUTDOWN
    assert engine.scheduler.kv_cache_manager.block_pool.num_used_blocks == 0
    assert not engine.scheduler.requests


def test_dropped_async_engines_leave_no_threads():
    gc.collect()
    before = threading.active_count()
    for i in range(NUM_DROPPED_ENGINES):
        engine = LLMEngine(TEST_MODEL, async_scheduling=True, **KNOBS)
        engine.add_request("r", PROMPTS[0], greedy(2))
        _drain(engine)
        worker = _worker(engine)
        del engine  # no shutdown(): the finalizer must stop the worker, and no reference cycle may delay it
        assert not worker.is_alive(), f"engine {i}: its worker outlived it"
        assert threading.active_count() <= before


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_engine_context_manager_finishes_its_requests(sync_tokens, async_scheduling):
    with LLMEngine(TEST_MODEL, async_scheduling=async_scheduling, **KNOBS) as engine:
        for i, (prompt, m) in enumerate(zip(PROMPTS, MAX_TOKENS)):
            engine.add_request(str(i), prompt, greedy(m))
        got = _drain(engine)
        worker = _worker(engine) if async_scheduling else None
    assert [got[str(i)] for i in range(len(PROMPTS))] == sync_tokens
    assert worker is None or not worker.is_alive()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.step()


def test_llm_context_manager(sync_tokens):
    with LLM(TEST_MODEL, async_scheduling=True, **KNOBS) as llm:
        outs = llm.generate(PROMPTS, [greedy(m) for m in MAX_TOKENS])
        worker = _worker(llm.llm_engine)
    assert [o.outputs[0].token_ids for o in outs] == sync_tokens
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * len(PROMPTS)
    assert not worker.is_alive()


def test_server_stop_shuts_the_engine_down():
    pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")
    from refengine.entrypoints.api_server import build_app

    engine = LLMEngine(TEST_MODEL, async_scheduling=True, stats_log_size=1, **KNOBS)
    app = build_app(engine)
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)  # far more than it gets to run

    async def serve_then_stop() -> list:
        queue: asyncio.Queue = asyncio.Queue()
        async with app.router.lifespan_context(app):
            async_engine = app.state.engine
            await async_engine.add_request("long", PROMPTS[1], params, queue)
            items = [await queue.get()]  # its first tokens came back: it is running
        assert not async_engine.is_running()
        while not queue.empty():
            items.append(queue.get_nowait())
        return items

    items = asyncio.run(serve_then_stop())
    outs = [out for _, out in items]
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert "shut down" in outs[-1].outputs[0].error
    assert 0 < sum(len(o.outputs[0].token_ids) for o in outs) < params.max_tokens
    assert not _worker(engine).is_alive()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.step()
