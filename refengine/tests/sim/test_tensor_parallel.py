"""Tensor parallelism on a simulated GPU: one GPU's share of the weights, KV and GEMMs, the all-reduces from the
measured tables, the KV pool of N GPUs, and the knob's refusals."""

from __future__ import annotations

import numpy as np
import pytest

from refengine import LLMEngine
from refengine.sim.comm import collective
from refengine.sim.cost_model import CUDA_GRAPH_MAX_TOKENS, CostModel, StepShape
from refengine.sim.kernel_tables import load_tables
from refengine.sim.sim_models import sim_model

# Llama-3.1-70B's published parameter count
LLAMA_31_70B_PARAMS = 70_553_706_496


def decode(batch: int, ctx: int = 1024) -> StepShape:
    return StepShape((1,) * batch, (ctx,) * batch, batch)


def test_one_gpu_holds_its_share_of_the_weights_and_kv() -> None:
    shape = sim_model("llama-3.1-70b")[1]
    assert shape.weight_bytes("bfloat16") == 2 * LLAMA_31_70B_PARAMS
    norms = (2 * shape.num_layers + 1) * shape.hidden_size  # replicated on every GPU
    for tp in (2, 4, 8):
        assert shape.weight_bytes("bfloat16", tp) == 2 * ((LLAMA_31_70B_PARAMS - norms) // tp + norms)
        assert shape.kv_bytes_per_token("bfloat16", tp) == shape.kv_bytes_per_token("bfloat16") // tp
    # Llama-3.1-8B has 8 KV heads: at tp 8 each GPU keeps one
    small = sim_model("llama-3.1-8b")[1]
    assert small.kv_heads_per_gpu(8) == 1 and small.linear_shapes(8)["qkv"] == ((32 // 8 + 2) * 128, 4096)


@pytest.mark.parametrize(
    "model, tp, match",
    [
        ("llama-3.1-70b", 3, "tensor_parallel_size=3: not simulated"),
        ("llama-3.1-70b", 16, "tensor_parallel_size=16: not simulated"),
        ("qwen2.5-7b", 8, "does not divide the model's 28 attention heads"),
    ],
)
def test_a_split_vllm_could_not_make_is_refused(model: str, tp: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LLMEngine(model, device="sim:h200", tensor_parallel_size=tp)


def test_the_all_reduce_is_the_measured_one_graph_or_eager() -> None:
    shape = sim_model("llama-3.1-70b")[1]
    arrays = load_tables("h200").arrays
    graph, eager = collective(arrays, "allreduce_graph", 4), collective(arrays, "allreduce_eager", 4)
    assert graph is not None and eager is not None
    sizes = list(arrays["allreduce_elements"])
    row = list(arrays["allreduce_gpus"]).index(4)
    at = sizes.index(524288)  # a measured size: 64 tokens x 8192 hidden
    assert graph.seconds(524288) == pytest.approx(float(arrays["allreduce_graph_ms"][row, at]) * 1e-3)
    cm = CostModel("h200", shape, "bfloat16", tensor_parallel_size=4)
    layers = 2 * shape.num_layers + 1
    assert cm.breakdown(decode(64))["communication"] == pytest.approx(layers * graph.seconds(64 * 8192))
    big = CUDA_GRAPH_MAX_TOKENS + 1  # too large for vLLM's CUDA graphs: the eager all-reduce
    step = StepShape((big,), (0,), 1)
    assert cm.breakdown(step)["communication"] == pytest.approx(layers * eager.seconds(big * 8192))
    assert CostModel("h200", shape, "bfloat16").breakdown(decode(64))["communication"] == 0.0


def test_splitting_speeds_up_the_gemms_and_adds_communication() -> None:
    shape = sim_model("llama-3.1-70b")[1]
    one, four = (CostModel("h200", shape, "fp8", tensor_parallel_size=tp) for tp in (1, 4))
    b1, b4 = one.breakdown(decode(32)), four.breakdown(decode(32))
    # a decode step streams the weights: a quarter of them per GPU takes well under half the time ...
    assert b4["gemm"] < 0.5 * b1["gemm"]
    # ... and the KV read splits with the KV heads
    assert b4["decode_attention"] < 0.5 * b1["decode_attention"]
    assert b4["communication"] > 0 and b4["gpu"] < b1["gpu"]


def test_the_kv_pool_is_what_n_gpus_hold_beside_their_share_of_the_weights() -> None:
    blocks = {}
    for tp in (1, 2, 4):
        engine = LLMEngine("llama-3.1-70b", device="sim:h200", dtype="fp8", tensor_parallel_size=tp)
        blocks[tp] = engine.scheduler.config.num_gpu_blocks
        assert engine.device_label.startswith("simulated " + (f"{tp}x h200" if tp > 1 else "h200"))
    # each GPU frees 1 - 1/tp of the weights for KV, and holds 1/tp of every block
    assert blocks[2] > 2 * blocks[1] and blocks[4] > 2 * blocks[2]
    shape = sim_model("llama-3.1-70b")[1]
    per_gpu_kv = np.array([blocks[tp] * 16 * shape.kv_bytes_per_token("bfloat16", tp) for tp in (1, 2, 4)])
    weights = np.array([shape.weight_bytes("fp8", tp) for tp in (1, 2, 4)])
    # every GPU's KV share plus its weights is the same budget (the GPU's memory x utilisation - the reserve)
    assert np.ptp(per_gpu_kv + weights) < 16 * shape.kv_bytes_per_token("bfloat16", 4) * 4


def test_a_tensor_parallel_engine_serves_and_is_faster_per_token() -> None:
    tpot = {}
    for tp in (1, 2):
        engine = LLMEngine("llama-3.1-8b", device="sim:h100", tensor_parallel_size=tp, stats_log_size=0)
        from refengine.sampling_params import SamplingParams

        for i in range(8):
            engine.add_request(str(i), list(range(1000, 1256)), SamplingParams(max_tokens=32, ignore_eos=True))
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.metrics
        assert len(done) == 8
        m = done["0"]
        tpot[tp] = (m["finish_time"] - m["first_token_time"]) / 31
    assert tpot[2] < tpot[1]
