"""Bad engine configuration raises ValueError naming the knob at construction, before anything is allocated
(and, for the device and the attention backend, before the first step): types, ranges, the model's context,
memory that cannot exist, a device or a backend this machine does not have."""

from __future__ import annotations

import pytest
import torch

from conformance.engine_helpers import greedy
from refengine import LLMEngine


@pytest.mark.parametrize(
    "knob, value, field",
    [
        ("max_model_len", 0, "max_model_len"),
        ("max_model_len", 1, "max_model_len"),
        ("max_model_len", 10**6, "max_model_len"),
        ("max_model_len", 1.5, "max_model_len"),
        ("max_model_len", "256", "max_model_len"),
        ("max_model_len", True, "max_model_len"),
        ("kv_cache_memory_gb", 0, "kv_cache_memory_gb"),
        ("kv_cache_memory_gb", -1.0, "kv_cache_memory_gb"),
        ("kv_cache_memory_gb", float("nan"), "kv_cache_memory_gb"),
        ("kv_cache_memory_gb", float("inf"), "kv_cache_memory_gb"),
        ("kv_cache_memory_gb", "1", "kv_cache_memory_gb"),
        ("kv_cache_memory_gb", True, "kv_cache_memory_gb"),
        ("kv_cache_memory_gb", 1e-9, "kv_cache_memory_gb"),
        ("kv_cache_memory_gb", 1e7, "kv_cache_memory_gb"),
        ("num_gpu_blocks", 10**12, "num_gpu_blocks"),
        ("num_cpu_blocks", 10**12, "num_cpu_blocks"),
        ("max_num_seqs", 10**6, "max_num_seqs"),
        ("max_num_batched_tokens", 0, "max_num_batched_tokens"),
        ("tensor_parallel_size", 0, "tensor_parallel_size"),
        ("tensor_parallel_size", 1.5, "tensor_parallel_size"),
        ("tensor_parallel_size", 2, "tensor_parallel_size"),  # the CPU engine's forward runs on one device
        ("seed", 2**64, "seed"),
        ("seed", 1.5, "seed"),
        ("seed", "0", "seed"),
        ("seed", True, "seed"),
        ("dtype", "int8", "dtype"),
        ("dtype", 5, "dtype"),
        ("dtype", torch.int32, "dtype"),
        ("dtype", ["float32"], "dtype"),
        ("device", "tpu", "device"),
        ("device", "cuda:99", "device"),
        ("device", 5, "device"),
        ("device", "", "device"),
        ("attention_backend", "flash", "attention_backend"),
        ("attention_backend", 5, "attention_backend"),
        ("stats_log_size", -1, "stats_log_size"),
        ("batching", "dynamic", "batching"),
        ("priority_preemption", True, "priority_preemption"),
    ],
)
def test_bad_engine_knobs_name_the_field(knob, value, field):
    with pytest.raises(ValueError, match=field):
        LLMEngine("tiny-qwen2", **{knob: value})


def test_bad_model_names_the_field():
    for model in (5, "", "no-such-model-or-folder"):
        with pytest.raises(ValueError, match="model"):
            LLMEngine(model)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_a_gpu_names_device():
    with pytest.raises(ValueError, match="device='cuda'.*not available"):
        LLMEngine("tiny-qwen2", device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton runs natively on CUDA")
def test_triton_on_cpu_fails_at_construction_unless_interpreted(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="attention_backend='triton' needs a CUDA device"):
        LLMEngine("tiny-qwen2", attention_backend="triton", num_gpu_blocks=8)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what the conformance suite runs the kernels under
    engine = LLMEngine("tiny-qwen2", attention_backend="triton", num_gpu_blocks=8, max_model_len=256)
    assert engine.attention_backend == "triton"


def test_input_batch_is_sized_by_what_the_kv_pool_can_run():
    """max_num_seqs beyond the KV pool cannot all run at once (each running request owns a block): the input batch
    gets num_gpu_blocks rows, not max_num_seqs."""
    engine = LLMEngine("tiny-qwen2", max_num_seqs=50_000, num_gpu_blocks=8, max_model_len=256)
    batch = engine.model_runner.input_batch
    assert batch.token_ids.shape[0] == 8
    for i in range(12):
        engine.add_request(f"r{i}", [1, 2, 3, i], greedy(3))
    finished = set()
    while engine.has_unfinished_requests():
        finished |= {o.request_id for o in engine.step() if o.finished}
        assert len(engine.scheduler.running) <= 8
    assert finished == {f"r{i}" for i in range(12)}
    assert engine.scheduler.num_free_blocks == 8
