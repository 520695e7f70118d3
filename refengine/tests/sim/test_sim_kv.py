"""The KV pool of a simulated GPU: sized from the GPU's memory as vLLM sizes it, so preemption happens where it
would on the real device."""

from __future__ import annotations

import pytest

from benchmarks.engine_replay import replay
from refengine import LLMEngine
from refengine.sim.gpus import GPUS
from refengine.sim.sim_memory import ACTIVATION_RESERVE_BYTES
from refengine.tests.sim.helpers import workload

# Llama-3.1-8B: K and V x 32 layers x 8 KV heads x head_dim 128 x 2 bytes (bf16 KV cache)
LLAMA8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def _expected_blocks(engine: LLMEngine, util: float, block_size: int) -> int:
    sim = engine.platform
    budget = int(sim.gpu.memory_bytes * util) - sim.shape.weight_bytes(sim.dtype) - ACTIVATION_RESERVE_BYTES
    return budget // (LLAMA8B_KV_BYTES_PER_TOKEN * block_size)


@pytest.mark.parametrize(
    ("gpu", "dtype", "util", "block_size"),
    [("h100", "bfloat16", 0.9, 16), ("h200", "fp8", 0.8, 32), ("a100", "bfloat16", 0.5, 16)],
)
def test_pool_follows_the_formula(gpu, dtype, util, block_size):
    engine = LLMEngine(
        "llama-3.1-8b", device=f"sim:{gpu}", dtype=dtype, gpu_memory_utilization=util, block_size=block_size
    )
    assert engine.platform.shape.kv_bytes_per_token("bfloat16") == LLAMA8B_KV_BYTES_PER_TOKEN
    assert engine.scheduler.config.num_gpu_blocks == _expected_blocks(engine, util, block_size) > 0


def test_default_utilization_is_vllms_and_fp8_weights_leave_more_kv():
    bf16 = LLMEngine("llama-3.1-8b", device="sim:h100")
    fp8 = LLMEngine("llama-3.1-8b", device="sim:h100", dtype="fp8")
    assert bf16.scheduler.config.num_gpu_blocks == _expected_blocks(bf16, 0.9, 16)
    assert fp8.scheduler.config.num_gpu_blocks > bf16.scheduler.config.num_gpu_blocks
    assert LLMEngine("llama-3.1-8b", device="sim:h100", num_gpu_blocks=77).scheduler.config.num_gpu_blocks == 77


def test_a_utilization_leaving_no_block_is_refused_by_name():
    weights_share = 16e9 / GPUS["a100"].memory_bytes  # ~16 GB of bf16 weights: 0.15 leaves nothing for the KV
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLMEngine("llama-3.1-8b", device="sim:a100", gpu_memory_utilization=round(weights_share * 0.8, 3))


def _util_for_blocks(gpu: str, blocks: int) -> float:
    """The gpu_memory_utilization that leaves `blocks` (and a half) KV blocks of 16 tokens for Llama-3.1-8B."""
    probe = LLMEngine("llama-3.1-8b", device=f"sim:{gpu}", num_gpu_blocks=1)
    need = probe.platform.shape.weight_bytes("bfloat16") + ACTIVATION_RESERVE_BYTES
    return (need + (blocks + 0.5) * LLAMA8B_KV_BYTES_PER_TOKEN * 16) / probe.platform.gpu.memory_bytes


def test_a_small_pool_preempts_and_a_full_one_does_not():
    reqs = workload(24, seed=2, prompt_len=(100, 300), out_len=(100, 200))
    util = _util_for_blocks("h100", 60)  # 960 tokens of KV: far less than 24 requests of up to 500 tokens
    small = LLMEngine("llama-3.1-8b", device="sim:h100", gpu_memory_utilization=util)
    assert small.scheduler.config.num_gpu_blocks == 60
    small_metrics = replay(small, reqs)
    assert sum(m["num_preemptions"] for m in small_metrics) > 0
    assert all(m["output_len"] == n for m, (_, n, _) in zip(small_metrics, reqs))
    full_metrics = replay(LLMEngine("llama-3.1-8b", device="sim:h100"), reqs)
    assert sum(m["num_preemptions"] for m in full_metrics) == 0
    # the small pool also costs time: recomputed prefills and fewer requests per step
    assert max(m["finish_time"] for m in small_metrics) > max(m["finish_time"] for m in full_metrics)


def test_swap_preemption_and_async_scheduling_complete_every_request():
    reqs = workload(24, seed=2, prompt_len=(100, 300), out_len=(100, 200))
    for kw in ({"preemption_mode": "swap", "num_cpu_blocks": 200}, {"async_scheduling": True}):
        engine = LLMEngine("llama-3.1-8b", device="sim:h100", num_gpu_blocks=60, **kw)
        metrics = replay(engine, reqs)
        assert sum(m["num_preemptions"] for m in metrics) > 0
        assert [m["output_len"] for m in metrics] == [n for _, n, _ in reqs]
    assert engine.scheduler.num_preemptions > 0 and engine.batch_queue is not None
