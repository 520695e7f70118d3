"""The paths only a CUDA device takes, each checked against one the CPU suites check too (`gpu`: skipped without a
CUDA device; ci/gpu_check.sh runs them with `-n 0`, one engine at a time on the card): swap preemption through
pinned host memory (its tokens are recompute's), async scheduling with graph replays (sync's tokens), seeded
non-greedy sampling (the same tokens run to run), max_num_seqs 512 (every graph size captured up to it, the
largest replayed: eager's tokens), engines in a row at gpu_memory_utilization 0.9 (their device memory given back)
and a utilization honoured, the hf-cb peer, and `cbbench serve --device cuda` under a streaming client and SIGTERM.

Every engine sizes its KV cache (num_gpu_blocks) unless the test is about the sizing, and each ends with a `with`
block or shutdown(), so that a failing assertion leaves no engine's memory to the next test. Token comparisons
that cross batch shapes run in float32, where another shape can only round differently."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLM, LLMEngine, SamplingParams
from refengine.tests.waiting import wait_for

ON_GPU = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")]

BLOCK = 16
# the test model on the card: graphs on (the default), its KV pool sized, not profiled
CUDA = dict(device="cuda", attention_backend="triton", block_size=BLOCK, max_model_len=512, max_num_seqs=16)
PROMPTS = make_prompts((3, 17, 40, 5, 64, 9, 33, 21), seed=7)
MAX_TOKENS = (24, 9, 16, 30, 5, 12, 20, 18)
# 8 requests of up to 64 + 30 tokens need 6 blocks each at most; 12 blocks hold two: the rest are preempted
TIGHT_BLOCKS = 12


def _tokens(llm: LLM, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


def _greedy() -> list[SamplingParams]:
    return [greedy(m, ignore_eos=True) for m in MAX_TOKENS]


def test_gpu_swap_preemption_through_pinned_memory_gives_recomputes_tokens():
    runs = {}
    for mode in ("recompute", "swap"):
        with LLM(
            TEST_MODEL,
            dtype="float32",
            num_gpu_blocks=TIGHT_BLOCKS,
            num_cpu_blocks=64,
            preemption_mode=mode,
            max_num_batched_tokens=64,
            **CUDA,
        ) as llm:
            runner = llm.llm_engine.model_runner
            if mode == "swap":
                assert runner.host_caches and runner.host_caches[0][0].is_pinned()  # the copies are async DMA
            runs[mode] = _tokens(llm, _greedy())
            sched = llm.llm_engine.scheduler
            swaps = sched.num_swap_outs
            assert sched.num_preemptions > 0, "nothing was preempted: the test checked nothing"
            assert (swaps > 0) == (mode == "swap")
    assert runs["swap"] == runs["recompute"]


def test_gpu_async_scheduling_with_graph_replays_gives_sync_tokens():
    runs = {}
    for async_scheduling in (False, True):
        with LLM(TEST_MODEL, dtype="float32", num_gpu_blocks=256, async_scheduling=async_scheduling, **CUDA) as llm:
            runs[async_scheduling] = _tokens(llm, _greedy())
            graphs = llm.llm_engine.model_runner.cuda_graphs
            assert graphs is not None and graphs.num_replays > 0  # the decodes replayed, from the worker thread too
    assert runs[True] == runs[False]


SAMPLED = dict(
    temperature=0.8,
    top_k=40,
    top_p=0.9,
    min_p=0.02,
    presence_penalty=0.4,
    frequency_penalty=0.3,
    repetition_penalty=1.2,
)


def test_gpu_seeded_sampling_gives_the_same_tokens_run_to_run():
    """top-k, top-p, min-p and the three penalties on the device, per-request seeds: two engines, the same tokens;
    another seed, other tokens (the seed is used); and not greedy's (it sampled)."""

    def params(seed_base: int) -> list[SamplingParams]:
        return [
            SamplingParams(max_tokens=m, ignore_eos=True, seed=seed_base + i, **SAMPLED)
            for i, m in enumerate(MAX_TOKENS)
        ]

    runs = []
    for seed_base in (100, 100, 200):
        with LLM(TEST_MODEL, num_gpu_blocks=256, **CUDA) as llm:
            runs.append(_tokens(llm, params(seed_base)))
    with LLM(TEST_MODEL, num_gpu_blocks=256, **CUDA) as llm:
        greedy_tokens = _tokens(llm, _greedy())
    assert runs[0] == runs[1]
    assert runs[2] != runs[0] and runs[0] != greedy_tokens
    assert [len(t) for t in runs[0]] == list(MAX_TOKENS)


MANY = 512


def _record_replays(graphs, sizes: list[int]) -> None:
    """Append the batch size of each replay of `graphs` to `sizes`."""
    real_run = graphs.run

    def run(input_ids, *rest):
        sizes.append(input_ids.shape[0])
        return real_run(input_ids, *rest)

    graphs.run = run


def test_gpu_max_num_seqs_512_captures_and_replays_the_largest_graph():
    """512 requests decode together: the 512 graph is captured and replayed, and its tokens are eager's on the
    same batch (no padding: the very kernels and shapes)."""
    prompts = make_prompts(tuple(4 + i % 13 for i in range(MANY)), seed=9)
    params = greedy(6, ignore_eos=True)
    knobs = dict(CUDA, max_model_len=64, max_num_seqs=MANY, num_gpu_blocks=3 * MANY, max_num_batched_tokens=16 * MANY)
    runs = {}
    for eager in (True, False):
        with LLM(TEST_MODEL, enforce_eager=eager, **knobs) as llm:
            sizes: list[int] = []
            graphs = llm.llm_engine.model_runner.cuda_graphs
            if graphs is not None:
                assert graphs.sizes[-1] == MANY and MANY in graphs.graphs
                _record_replays(graphs, sizes)
            runs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            if not eager:
                assert MANY in sizes, f"the 512 graph was never replayed (sizes {sorted(set(sizes))})"
    assert all(len(t) == 6 for t in runs[False])
    assert runs[False] == runs[True]


def test_gpu_engines_in_a_row_at_0_9_each_get_the_card_and_utilization_is_honoured():
    """The H200 refused the second engine ("15.73 GiB are already used by others"): each engine here is given back
    (shutdown, a dropped one, one with graphs) and the next sizes the same pool. Then an engine at 0.45 takes about
    half of that, and this process's memory stays under 0.45 of the card (the allocator's reserve included)."""
    knobs = dict(device="cuda", max_model_len=4096, max_num_seqs=32)
    total = torch.cuda.mem_get_info()[1]
    sizes = []
    with LLMEngine("qwen2.5-0.5b", enforce_eager=True, **knobs) as e:
        sizes.append(e.scheduler.config.num_gpu_blocks)
    e = LLMEngine("qwen2.5-0.5b", **knobs)  # with CUDA graphs, and dropped without shutdown()
    sizes.append(e.scheduler.config.num_gpu_blocks)
    assert e.model_runner.cuda_graphs is not None
    del e
    with LLMEngine("qwen2.5-0.5b", enforce_eager=True, **knobs) as e:
        sizes.append(e.scheduler.config.num_gpu_blocks)
        e.add_request("r", list(range(100, 164)), greedy(8))
        while e.has_unfinished_requests():
            e.step()
    # the weights are drawn again and the activations' peak may move by a little: a few percent
    assert min(sizes) > 1000 and max(sizes) - min(sizes) <= 0.02 * max(sizes), sizes
    assert torch.cuda.memory_allocated() < 0.01 * total  # nothing of them is left
    with LLMEngine("qwen2.5-0.5b", gpu_memory_utilization=0.45, enforce_eager=True, **knobs) as e:
        half = e.scheduler.config.num_gpu_blocks
        e.add_request("r", list(range(100, 164)), greedy(8))
        while e.has_unfinished_requests():
            e.step()
        assert torch.cuda.memory_reserved() <= 0.45 * total + RESERVE_SLACK
    assert 0.45 * sizes[0] < half < 0.52 * sizes[0], (half, sizes)


# the allocator rounds segments up (2 MiB and 20 MiB granules) and keeps the step's freed temporaries (logits, the
# sampler's sort) cached: reserved memory may pass the budget by that much, not by a KV cache's worth
RESERVE_SLACK = 2**30


def test_gpu_hf_cb_peer_runs_the_workload(tmp_path):
    """transformers' continuous batching (the hf-cb peer) on the card, beside refengine's continuous mode."""
    from typer.testing import CliRunner

    from cbbench.perf.cli import app
    from cbbench.perf.results.files import read_csv

    out = tmp_path / "hfcb.csv"
    args = ["perf", "--device", "cuda", "--model", TEST_MODEL, "--workload", "fixed", "--workload-param",
            "input_len=32,output_len=16", "--num-prompts", "8", "--max-num-seqs", "4", "--num-gpu-blocks", "256",
            "--batching", "continuous", "--peers", "hf-cb", "--warmup", "1", "--quiet", "--output", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    df = read_csv(out)
    assert set(df["engine"]) == {"refengine", "hf-cb"}
    assert list(df["completed"]) == [8, 8] and (df["output_throughput"] > 0).all()


SERVE_GRACE_S = 5
SHORT, LONG = 8, 4000


def test_gpu_serve_streams_and_drains_on_sigterm(tmp_path):
    """`cbbench serve --device cuda`: a short stream ends with "length", a long one is aborted by SIGTERM after the
    grace period, both end with [DONE], and the server exits cleanly."""
    pytest.importorskip("fastapi", reason="cbbench serve needs fastapi")
    from conformance.http.client import free_port, start_process, stop_process, wait_healthy
    from conformance.http.conftest import cbbench_command
    from refengine.tests.live_server import Events, read_stream

    port = free_port()
    args = ["serve", "--device", "cuda", "--model", TEST_MODEL, "--num-gpu-blocks", "512", "--max-num-seqs", "8",
            "--port", str(port), "--log-level", "warning", "--shutdown-timeout", str(SERVE_GRACE_S)]  # fmt: skip
    proc = start_process([*cbbench_command(), *args], tmp_path / "serve.log", env={})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        body = {"model": TEST_MODEL, "prompt": "Hello", "temperature": 0.0, "ignore_eos": True}
        short, long = Events(), Events()
        read_stream(url, {**body, "max_tokens": SHORT}, short)
        assert short.failure is None and short.done and short.finish_reasons() == ["length"], short
        reader = threading.Thread(target=read_stream, args=(url, {**body, "max_tokens": LONG}, long), daemon=True)
        reader.start()
        wait_for(lambda: bool(long.chunks), "the long stream's first chunk")
        os.kill(proc.pid, signal.SIGTERM)
        reader.join(timeout=SERVE_GRACE_S + 60)
        assert not reader.is_alive() and long.failure is None, long.failure
        assert long.done and long.finish_reasons() == ["abort"], long
        assert 0 < sum(len(c["choices"][0].get("text", "")) > 0 for c in long.chunks)
        proc.wait(timeout=SERVE_GRACE_S + 60)
        assert proc.returncode in (0, -signal.SIGTERM), proc.returncode
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        stop_process(proc)


def test_gpu_kernel_sweep_is_timed_by_graph_replay(tmp_path):
    """`cbbench kernels` on the card: every shape timed by CUDA-graph replay over rotated inputs (the quick sweep
    here; gpu_check runs the whole one), every time a positive number, the small decode's inputs rotated past L2."""
    from cbbench.perf.bench.kernels import GRAPH_LAUNCHES, run_kernel_bench

    df = run_kernel_bench(str(tmp_path / "k.csv"), quick=True)
    assert set(df["timing"]) == {"cuda-graph"} and (df["launches"] == GRAPH_LAUNCHES).all()
    assert (df["triton_ms"] > 0).all() and (df["sdpa_ms"] > 0).all()
    small = df[(df["kind"] == "decode") & (df["batch"] == 8)]
    assert (small["input_sets"] > 1).all()
