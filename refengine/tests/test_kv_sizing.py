"""KV cache sizing (refengine/kv_cache/kv_sizing.py): vLLM's determine_available_memory arithmetic, checked on the CPU
against a fake CUDA caching allocator (mem_get_info / memory stats mocked). On a GPU for real: engines in a row at
0.9 and a utilization honoured, refengine/tests/test_gpu_paths.py (`gpu`)."""

from __future__ import annotations

import pytest
import torch

from refengine.kv_cache import kv_sizing
from refengine.kv_cache.kv_sizing import GiB, MemorySnapshot, kv_cache_budget, num_blocks_for_budget

CUDA = torch.device("cuda")


class FakeCudaAllocator:
    """Device memory as torch's caching allocator sees it: freed tensors stay reserved (cached) until
    empty_cache(); the driver's free memory is total - context - reserved - other processes."""

    def __init__(self, total: int, context: int, others: int = 0) -> None:
        self.total, self.context, self.others = total, context, others
        self.allocated = self.reserved = self.peak = 0
        # cached blocks empty_cache cannot hand back (a segment a live tensor still splits, a graph pool)
        self.unreleasable = 0
        self.profile_calls = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n  # stays reserved: the allocator keeps it cached

    def empty_cache(self) -> None:
        self.reserved = self.allocated + min(self.unreleasable, self.reserved - self.allocated)

    def install(self, monkeypatch: pytest.MonkeyPatch, activations: int) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(
            cuda, "mem_get_info", lambda d=None: (self.total - self.context - self.others - self.reserved, self.total)
        )
        monkeypatch.setattr(cuda, "memory_allocated", lambda d=None: self.allocated)
        monkeypatch.setattr(cuda, "memory_reserved", lambda d=None: self.reserved)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda d=None: self.peak)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda d=None: setattr(self, "peak", self.allocated))
        monkeypatch.setattr(cuda, "empty_cache", self.empty_cache)

        def fake_profile_run(*args, **kwargs) -> None:  # a forward whose activations peak at `activations` bytes
            self.profile_calls += 1
            self.alloc(activations)
            self.free(activations)

        monkeypatch.setattr(kv_sizing, "profile_run", fake_profile_run)
        # take_snapshot's gc.collect frees nothing this allocator counts, and walks the whole test worker's heap
        # (about 0.5 s a call, two per sizing)
        monkeypatch.setattr(kv_sizing.gc, "collect", lambda generation=2: 0)


TOTAL, CONTEXT = 80 * GiB, GiB // 2
ACTIVATIONS = 3 * GiB


def _weights() -> tuple[torch.nn.Module, int]:
    model = torch.nn.Linear(256, 512)  # stands for the engine's model: only its byte count is used
    return model, kv_sizing.model_bytes(model)


def _blocks(fake: FakeCudaAllocator, model, util: float = 0.9, max_model_len: int = 4096) -> int:
    return kv_sizing.default_num_gpu_blocks(
        model,
        None,
        device=CUDA,
        dtype=torch.bfloat16,
        bytes_per_block=2 * 2**20,
        block_size=16,
        max_model_len=max_model_len,
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        kv_cache_memory_gb=None,
        gpu_memory_utilization=util,
    )


def test_budget_arithmetic() -> None:
    before = MemorySnapshot(total=100, free=80, torch_allocated=10, torch_reserved=12)  # non-torch 8
    after = MemorySnapshot(total=100, free=77, torch_allocated=10, torch_reserved=12)  # non-torch 11
    b = kv_cache_budget(before, after, torch_peak=25, weights=10, gpu_memory_utilization=0.9)
    assert (b.requested, b.torch_peak_increase, b.non_torch_increase) == (90, 15, 3)
    assert b.available == 90 - 10 - 15 - 3


def test_kv_budget_matches_vllm_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCudaAllocator(TOTAL, CONTEXT)
    fake.install(monkeypatch, ACTIVATIONS)
    model, weights = _weights()
    fake.alloc(weights)
    blocks = _blocks(fake, model)
    assert fake.profile_calls == 1
    assert blocks == (int(TOTAL * 0.9) - weights - ACTIVATIONS) // (2 * 2**20)


def test_two_engines_in_a_row_get_the_same_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first engine's KV cache is freed but still cached by the allocator when the second one sizes its own:
    the old `free - 0.1 * total` saw that memory as used and gave the second engine next to nothing."""
    fake = FakeCudaAllocator(TOTAL, CONTEXT)
    fake.install(monkeypatch, ACTIVATIONS)
    model, weights = _weights()
    fake.alloc(weights)  # shared by both engines (presets are cached per process)
    first = _blocks(fake, model)
    kv = first * 2 * 2**20
    fake.alloc(kv)  # the first engine runs ...
    fake.free(kv)  # ... and is dropped: its cache stays reserved
    free_now, _ = torch.cuda.mem_get_info()
    old_formula = free_now - 0.1 * TOTAL
    assert old_formula < 0.05 * kv  # what the second engine used to get
    second = _blocks(fake, model)
    assert second == first > 1000


def test_memory_the_allocator_caches_unused_counts_as_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a real H200 showed: after the first engine was gone, its blocks stayed reserved by this process's
    allocator (empty_cache could not return them), and counting them as others' refused the second engine at 0.9
    ("15.73 GiB are already used by others"). The allocator serves the new KV cache from those blocks: free."""
    fake = FakeCudaAllocator(TOTAL, CONTEXT)
    fake.install(monkeypatch, ACTIVATIONS)
    model, weights = _weights()
    fake.alloc(weights)
    first = _blocks(fake, model)
    kv = first * 2 * 2**20
    fake.alloc(kv)
    fake.free(kv)
    fake.unreleasable = kv  # the first engine is gone; its blocks stay with the allocator
    kv_sizing.torch.cuda.empty_cache()
    snap = kv_sizing.probe_memory(CUDA)
    assert snap.torch_reserved - snap.torch_allocated == kv and snap.usable == snap.free + kv
    assert _blocks(fake, model) == first


def test_the_memory_check_counts_the_allocators_cached_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_memory (the buffers' fit before they are allocated) reads the same usable memory as the sizing."""
    from refengine.worker.worker import check_memory

    need = 10 * GiB
    cached = MemorySnapshot(total=TOTAL, free=GiB, torch_allocated=GiB, torch_reserved=GiB + need)
    monkeypatch.setattr(kv_sizing, "probe_memory", lambda device: cached)
    check_memory(CUDA, [("num_gpu_blocks", need, CUDA)])  # 1 GiB free + 10 GiB cached: it fits
    with pytest.raises(ValueError, match=r"num_gpu_blocks: .* 11.00 GiB is free on the device"):
        check_memory(CUDA, [("num_gpu_blocks", need + GiB + 1, CUDA)])


def test_an_engine_still_alive_is_left_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-instance budgets, as vLLM: a live engine's memory is others', and must leave the request free."""
    fake = FakeCudaAllocator(TOTAL, CONTEXT)
    fake.install(monkeypatch, ACTIVATIONS)
    model, weights = _weights()
    fake.alloc(weights)
    first = _blocks(fake, model, util=0.4)
    fake.alloc(first * 2 * 2**20)  # still alive
    assert _blocks(fake, model, util=0.4) == first  # 0.4 + 0.4 fit on one device
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.9 asks for .* already used by others"):
        _blocks(fake, model, util=0.9)


def test_budget_too_small_for_one_request_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCudaAllocator(TOTAL, CONTEXT)
    fake.install(monkeypatch, ACTIVATIONS)
    model, weights = _weights()
    fake.alloc(weights)
    # 5 % of 80 GiB = 4 GiB, minus 3 GiB of activations: ~1 GiB = 500 blocks of 2 MiB, under 2048 blocks needed
    with pytest.raises(ValueError, match=r"cannot hold one request of max_model_len=32768 .*gpu_memory_utilization"):
        _blocks(fake, model, util=0.05, max_model_len=32768)
    with pytest.raises(ValueError, match="estimated maximum model length is 0"):
        num_blocks_for_budget(-5, 2**20, 16, 64)


def test_overrides_skip_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cuda(*a, **k):
        raise AssertionError("profiled although the size was given")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_cuda)
    monkeypatch.setattr(kv_sizing, "profile_run", no_cuda)
    blocks = kv_sizing.default_num_gpu_blocks(
        None,
        None,
        device=CUDA,
        dtype=torch.bfloat16,
        bytes_per_block=2**20,
        block_size=16,
        max_model_len=64,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        kv_cache_memory_gb=0.5,
        gpu_memory_utilization=0.9,
    )
    assert blocks == 512


def test_engine_knobs() -> None:
    from refengine import LLMEngine

    for bad in (0, -0.1, 1.5, True, "0.9", float("nan")):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            LLMEngine("tiny-qwen2", gpu_memory_utilization=bad, num_gpu_blocks=8)
    e = LLMEngine("tiny-qwen2", gpu_memory_utilization=1.0, kv_cache_memory_gb=0.25, block_size=16)
    per_block = (
        2 * e.model_config.num_hidden_layers * 16 * e.model_config.num_key_value_heads * e.model_config.head_dim * 4
    )
    assert e.scheduler.config.num_gpu_blocks == int(0.25 * GiB // per_block)
    assert LLMEngine("tiny-qwen2", num_gpu_blocks=7).scheduler.config.num_gpu_blocks == 7


@pytest.mark.parametrize("num_tokens,num_seqs", [(64, 4), (37, 256), (5000, 1)])
def test_profile_run_drives_the_real_model(num_tokens: int, num_seqs: int) -> None:
    """The dummy batch is one the model accepts (CPU, torch backend): catches a metadata change breaking it."""
    from refengine.models.loader import build_random_model
    from refengine.models.presets import PRESETS

    config = PRESETS["tiny-qwen2"]
    model = build_random_model(config, device="cpu", attention_backend="torch")
    calls = []
    forward = model.forward
    model.forward = lambda ids, pos, kv, meta: (
        calls.append((ids.shape[0], meta.seq_lens.tolist())) or forward(ids, pos, kv, meta)
    )
    kv_sizing.profile_run(
        model,
        config,
        device=torch.device("cpu"),
        dtype=torch.float32,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        block_size=16,
        max_model_len=4096,
    )
    ((tokens, lens),) = calls
    assert tokens == sum(lens) == min(num_tokens, num_seqs * 4096) and len(lens) == min(num_seqs, num_tokens)
    assert max(lens) - min(lens) <= 1 and max(lens) <= 4096
