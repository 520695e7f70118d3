"""An engine gives its device memory back deterministically (refengine/engine/llm_engine.py's lifetime methods,
refengine/worker/worker.py's empty_runner / return_device_memory and preset cache): on shutdown(), at the end of a
`with` block, and when it is dropped. On the CPU the device is faked at its seam: `return_device_memory` (the
gc + torch.cuda.empty_cache of a CUDA engine) is replaced by a probe that records, at the moment it is called,
whether anything still holds the engine's runner, KV tensors and model; weak references must be dead by then, or
empty_cache would hand nothing back. The preset cache is checked for a CUDA key with a fake loader."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import pytest
import torch

import refengine.worker.device as device_mod
import refengine.worker.worker as worker_mod
from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLM, LLMEngine

KNOBS = dict(block_size=4, num_gpu_blocks=64, max_num_seqs=4, max_model_len=128)
PROMPTS = make_prompts((5, 11), seed=3)


class ReturnProbe:
    """Stands in for return_device_memory: records, per call, which of the watched objects were still alive."""

    def __init__(self) -> None:
        self.watched: dict[str, weakref.ref] = {}
        self.calls: list[dict[str, bool]] = []

    def watch(self, engine: LLMEngine) -> None:
        runner = engine.model_runner
        self.watched = {
            "runner": weakref.ref(runner),
            "kv_cache": weakref.ref(runner.kv_caches[0][0]),
            "model": weakref.ref(engine.model),
        }

    def __call__(self, device: torch.device) -> None:
        self.calls.append({name: ref() is not None for name, ref in self.watched.items()})


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> ReturnProbe:
    p = ReturnProbe()
    monkeypatch.setattr(device_mod, "return_device_memory", p)
    # the host keeps its newest presets strongly (a CPU-only convenience, as CUDA weights are never kept): off
    # here, so that the model's weak reference can tell whether the engine still holds it
    monkeypatch.setattr(worker_mod, "HOST_PRESETS_KEPT", 0)
    worker_mod._HOST_PRESETS.clear()
    return p


def _run(engine: LLMEngine) -> None:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, greedy(4))
    while engine.has_unfinished_requests():
        engine.step()


NOTHING_ALIVE = {"runner": False, "kv_cache": False, "model": False}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_shutdown_returns_the_memory_once_nothing_holds_it(probe: ReturnProbe, async_scheduling: bool) -> None:
    engine = LLMEngine(TEST_MODEL, async_scheduling=async_scheduling, **KNOBS)
    probe.watch(engine)
    _run(engine)
    assert engine.shutdown() == []
    assert probe.calls == [NOTHING_ALIVE]
    assert engine.model is None and engine.platform.parts[2] is None
    with pytest.raises(RuntimeError, match="shut down"):
        engine.model_runner.execute_model(None)  # the stand-in runs nothing
    engine.shutdown()
    assert len(probe.calls) == 1  # idempotent: released once


def test_a_runner_kept_by_someone_else_pins_no_kv_cache(probe: ReturnProbe) -> None:
    engine = LLMEngine(TEST_MODEL, **KNOBS)
    probe.watch(engine)
    kept = engine.model_runner  # a caller holding on to the runner (a test, a benchmark)
    engine.shutdown()
    assert probe.calls == [{"runner": True, "kv_cache": False, "model": True}]
    assert kept.kv_caches == [] and kept.host_caches == []


def test_with_block_of_llm_releases_at_its_end(probe: ReturnProbe) -> None:
    with LLM(TEST_MODEL, **KNOBS) as llm:
        probe.watch(llm.llm_engine)
        outs = llm.generate(PROMPTS, greedy(3))
        assert probe.calls == []  # not before the block ends
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 3]
    assert probe.calls == [NOTHING_ALIVE]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_dropped_engine_releases_without_a_collection(probe: ReturnProbe, async_scheduling: bool) -> None:
    llm = LLM(TEST_MODEL, async_scheduling=async_scheduling, **KNOBS)
    engine = llm.llm_engine
    probe.watch(engine)
    llm.generate(PROMPTS, greedy(3))
    worker = engine.batch_queue._thread if async_scheduling else None
    gc.disable()  # by reference counting alone: no cycle may keep a dropped engine (and its memory) alive
    try:
        del llm, engine
        assert probe.calls == [NOTHING_ALIVE]
    finally:
        gc.enable()
    assert worker is None or worker not in threading.enumerate()


def test_a_constructor_that_fails_leaves_the_finaliser_nothing(probe: ReturnProbe) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        LLMEngine(TEST_MODEL, **{**KNOBS, "max_model_len": 10**9})
    gc.collect()
    assert probe.calls == []


def test_preset_weights_on_a_device_live_only_as_long_as_an_engine_uses_them(monkeypatch: pytest.MonkeyPatch):
    """Engines of one process share a preset's weights; on a device the cache must not keep them once the last
    engine has let go (a strong cache pinned the first engine's weights, which the next one's sizing saw as used)."""

    class FakeWeights(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = object()

    loads: list[torch.device] = []

    def fake_load(model, *, device, dtype, seed, attention_backend):
        loads.append(device)
        return FakeWeights(), None

    monkeypatch.setattr("refengine.models.loader.load_model", fake_load)
    cuda = torch.device("cuda", 0)
    key = ("tiny-qwen2", cuda, torch.bfloat16, 0, "triton")
    first, _ = worker_mod._preset_model(*key)
    second, _ = worker_mod._preset_model(*key)
    assert second is first and loads == [cuda]  # shared while in use
    assert key in worker_mod.shared_presets()
    del first, second
    assert key not in worker_mod.shared_presets()  # nothing pins them once the engines are gone
    worker_mod._preset_model(*key)
    assert loads == [cuda, cuda]
    host_key = ("tiny-qwen2", torch.device("cpu"), torch.float32, 123, "torch")
    worker_mod._preset_model(*host_key)
    assert host_key in worker_mod.shared_presets()  # the host's newest are kept: CPU tests make engines in a row


def test_perf_releases_each_configurations_engine_before_the_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`cbbench perf` (and `perf --like` over a baseline) runs its configurations one after another in one process:
    each engine must have given its memory back before the next one is sized, or on a GPU the second is refused."""
    from typer.testing import CliRunner

    from cbbench.perf.cli import app
    from cbbench.perf.tests.tiny_run import TINY_RUN

    made: list[weakref.ref] = []
    alive_at_creation: list[int] = []
    real = device_mod.make_model_runner

    def tracking(*args, **kwargs):
        alive_at_creation.append(sum(ref() is not None for ref in made))
        runner = real(*args, **kwargs)
        made.append(weakref.ref(runner))
        return runner

    monkeypatch.setattr(device_mod, "make_model_runner", tracking)
    returned: list[int] = []
    monkeypatch.setattr(device_mod, "return_device_memory", lambda device: returned.append(len(made)))
    gc.disable()  # released by the run's end, not by a collection that happens to come
    try:
        res = CliRunner().invoke(
            app, ["perf", *TINY_RUN, "--batching", "continuous,static", "--peers", "none", "--dry-run"]
        )
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(
            app,
            ["perf", *TINY_RUN, "--batching", "continuous,static", "--peers", "none", "--result-dir", str(tmp_path)],
        )
    finally:
        gc.enable()
    assert res.exit_code == 0, res.output
    assert alive_at_creation == [0, 0] and returned == [1, 2]


def test_kept_preset_weights_last_until_the_block_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cbbench perf` keeps its model's weights between its engines (an 8B preset takes most of a minute to draw)
    and gives them back when its runs are over."""
    loads: list[str] = []

    class FakeWeights(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = object()

    def fake_load(model, *, device, dtype, seed, attention_backend):
        loads.append(model)
        return FakeWeights(), None

    returned: list[torch.device] = []
    monkeypatch.setattr("refengine.models.loader.load_model", fake_load)
    monkeypatch.setattr(worker_mod, "return_device_memory", returned.append)
    cuda = torch.device("cuda", 0)
    key = ("llama-3.1-8b", cuda, torch.bfloat16, 0, "triton")
    with worker_mod.keep_preset_weights():
        worker_mod._preset_model(*key)  # the first engine's, dropped at once
        worker_mod._preset_model(*key)  # the next engine's: the same weights
        assert loads == ["llama-3.1-8b"] and returned == []
    assert key not in worker_mod.shared_presets() and returned == [cuda]


def test_engines_alive_at_interpreter_exit_leave_quietly() -> None:
    """Engines still alive when the interpreter exits (one stepping asynchronously, one caught in a reference
    cycle) are not released then (the process gives everything back): no traceback, no "Exception ignored"."""
    import subprocess
    import sys

    script = (
        "from refengine import LLM, LLMEngine\n"
        "e = LLMEngine('tiny-qwen2', async_scheduling=True, num_gpu_blocks=64, max_model_len=128)\n"
        "e.add_request('a', [1, 2, 3], None)\n"
        "e.step()\n"
        "llm = LLM('tiny-qwen2', num_gpu_blocks=64, max_model_len=128)\n"
        "cycle = [llm]\n"
        "cycle.append(cycle)\n"
        "print('exiting')\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "exiting", res.stderr
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr
