"""The cost model's shapes, terms and step-level validation (Llama-3.1-8B decode on a simulated H100)."""

from __future__ import annotations

import dataclasses

import pytest

from refengine.sim.cost_model import CostModel, HostCost, StepShape
from refengine.sim.model_shape import ModelShape
from refengine.sim.gpus import GPUS, GpuSpec, get_gpu
from refengine.tests.sim.silicon import LLAMA_31_8B

# vLLM reports about 5 ms of GPU time per decode step for Llama-8B on an H100 (a rounded figure)
VLLM_LLAMA8B_H100_STEP_S = 5e-3
# ours is +27% at batch 1 (GEMMs at the tables' 83% of HBM bandwidth, plus norms, attention, lm_head and sampler);
# the bound stops the error from growing unnoticed
STEP_LEVEL_TOLERANCE = 0.35
# a decode step at batch 256 (short contexts) measured 1.74x batch 1: the weights are read once either way
BATCH_256_OVER_1_MAX = 2.0
# Llama-3.1-8B's published parameter count and KV bytes per token (32 layers x 8 KV heads x 128 x K,V x bf16)
LLAMA_31_8B_PARAMS = 8_030_261_248
LLAMA_31_8B_KV_BYTES = 131_072
QWEN25_05B_PARAMS = 494_032_768  # Qwen2.5-0.5B's published count (tied embeddings, qkv biases)


def decode_step(batch: int, context: int) -> StepShape:
    return StepShape((1,) * batch, (context,) * batch, batch)


def test_get_gpu_names_the_known_ones() -> None:
    assert get_gpu("sim:h200") is GPUS["h200"]
    with pytest.raises(ValueError, match="gpu: .*'v100'.*a100, h100, h200"):
        get_gpu("v100")


def test_llama_shape_from_hf_config_matches_published_sizes() -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    shape = ModelShape.from_hf_config(cfg)
    assert shape == LLAMA_31_8B
    assert shape.weight_bytes("bfloat16") == 2 * LLAMA_31_8B_PARAMS
    assert shape.kv_bytes_per_token("bfloat16") == LLAMA_31_8B_KV_BYTES
    assert shape.kv_bytes_per_token("fp8") == LLAMA_31_8B_KV_BYTES // 2
    # fp8 quantises the decoder linears only; embedding and lm_head stay bf16
    bf16_params = 2 * 128256 * 4096 + 65 * 4096  # embedding, lm_head, 65 RMSNorm weights
    assert shape.weight_bytes("fp8") == (LLAMA_31_8B_PARAMS - bf16_params) + 2 * bf16_params


def test_qwen2_shapes_count_their_qkv_biases() -> None:
    cfg = {
        "model_type": "qwen2",
        "num_hidden_layers": 24,
        "hidden_size": 896,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    assert ModelShape.from_hf_config(cfg).weight_bytes("bfloat16") == 2 * QWEN25_05B_PARAMS


def test_opt_shape_has_an_ungated_mlp_and_tied_embeddings() -> None:
    cfg = {
        "model_type": "opt",
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "ffn_dim": 20480,
        "vocab_size": 50272,
    }
    shape = ModelShape.from_hf_config(cfg)
    assert (shape.num_kv_heads, shape.head_dim, shape.gated_mlp, shape.tie_word_embeddings) == (40, 128, False, True)
    assert shape.linear_shapes()["gate_up"] == (20480, 5120)


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "vocab_size"])
def test_bad_shape_names_the_field(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(LLAMA_31_8B, **{field: 0})


def test_bad_dtype_names_the_field() -> None:
    with pytest.raises(ValueError, match="dtype"):
        CostModel("h100", LLAMA_31_8B, dtype="float16")
    with pytest.raises(ValueError, match="dtype: a100"):
        CostModel("a100", LLAMA_31_8B, dtype="fp8")


def test_step_level_decode_on_h100_is_near_vllms_figure() -> None:
    cost = CostModel("h100", LLAMA_31_8B)
    one = cost.breakdown(decode_step(1, 512))
    assert abs(one["gpu"] / VLLM_LLAMA8B_H100_STEP_S - 1) <= STEP_LEVEL_TOLERANCE
    many = cost.breakdown(decode_step(256, 128))
    assert one["gpu"] < many["gpu"] <= BATCH_256_OVER_1_MAX * one["gpu"]
    assert many["decode_attention"] > one["decode_attention"]


def test_terms_add_up_and_async_takes_the_max() -> None:
    host = HostCost(step_s=0.02, per_request_s=0.0)  # larger than the GPU's share, so max and sum differ
    step = StepShape((1, 1, 300), (100, 900, 0), 3)
    sync = CostModel("h200", LLAMA_31_8B, host_seconds=host).breakdown(step)
    terms = ("gemm", "decode_attention", "prefill_attention", "non_gemm", "lm_head")
    assert sync["gpu"] == pytest.approx(sum(sync[t] for t in terms))
    assert all(sync[t] > 0 for t in terms)
    assert sync["step"] == pytest.approx(sync["gpu"] + 0.02)
    overlapped = CostModel("h200", LLAMA_31_8B, async_scheduling=True, host_seconds=host)
    assert overlapped.step_seconds(step) == pytest.approx(max(sync["gpu"], 0.02))


def test_more_work_costs_more() -> None:
    cost = CostModel("h200", LLAMA_31_8B)
    assert cost.step_seconds(decode_step(64, 4000)) > cost.step_seconds(decode_step(64, 500))
    assert cost.step_seconds(StepShape((4096,), (4096,), 1)) > cost.step_seconds(StepShape((4096,), (0,), 1))
    assert cost.step_seconds(StepShape((2048,), (0,), 1)) > cost.step_seconds(StepShape((512,), (0,), 1))
    # the H200's faster HBM shows in a weight-bound decode step
    assert cost.step_seconds(decode_step(1, 512)) < CostModel("h100", LLAMA_31_8B).step_seconds(decode_step(1, 512))


def test_roofline_stands_in_where_no_table_exists() -> None:
    odd = dataclasses.replace(LLAMA_31_8B, head_dim=96)  # no measured attention at head_dim 96
    cost = CostModel("h100", odd)
    decode = cost.breakdown(decode_step(8, 1000))["decode_attention"]
    kv_read_s = 8 * 1001 * odd.kv_bytes_per_token("bfloat16") / (GPUS["h100"].hbm_bytes_per_s * 0.8)
    assert decode == pytest.approx(kv_read_s + 32 * 3e-6)
    custom = GpuSpec("b9000", 10**11, 8e12, 2e15, 4e15)  # a GPU with no tables at all
    only_roofline = CostModel(custom, LLAMA_31_8B)
    assert "roofline-only" in only_roofline.version
    assert 0 < only_roofline.step_seconds(decode_step(1, 10)) < cost.step_seconds(decode_step(1, 10))


def test_same_steps_give_the_same_seconds_bit_for_bit() -> None:
    # the simulated gate compares runs with tight tolerances: a cache hit must return what the miss computed
    steps = [
        StepShape((1,) * b + (q,), tuple(range(50, 50 + b)) + (c,), b + 1)
        for b, q, c in ((3, 700, 0), (40, 2000, 100), (3, 700, 0), (255, 1, 9000), (40, 2000, 100))
    ]
    first = CostModel("h200", LLAMA_31_8B, "fp8")
    cold = [first.step_seconds(s) for s in steps]
    warm = [first.step_seconds(s) for s in steps]
    fresh = [CostModel("h200", LLAMA_31_8B, "fp8").step_seconds(s) for s in reversed(steps)][::-1]
    assert cold == warm == fresh
    assert cold[0] == cold[2] and cold[1] == cold[4]
