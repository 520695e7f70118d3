"""The model runner's traffic with the device, driven by hand-built SchedulerOutputs: at most one device -> host
transfer per step (swaps included), decode-only and mixed steps padded to CUDA-graph buckets as graphs replay them
(eagerly, and through CudaGraphRunner's static buffers with eager replays), and the staging buffer the step's inputs
cross in."""

from __future__ import annotations

import os

import pytest
import torch

from refengine.tests._hand_runner import (
    PROMPTS,
    HandScheduler,
    blank_output,
    count_host_reads,
    engine_reference,
    install_eager_graphs,
    make_runner,
    mixed_steps,
)
from refengine.worker.cuda_graphs import GraphBuckets
from refengine.worker.model_runner import ModelRunner

# the tests' buckets: decode sizes 1, 2, 4 and mixed sizes 16, 32, 48, 64 (every step below fits one)
BUCKETS = GraphBuckets.of(max_num_seqs=4, max_num_batched_tokens=64)

# float32 K/V of 8 padded rows vs 3 unpadded may round differently in the projections' matmul (a few ulps); a
# padded token written to the cache would replace a real K/V vector, an O(1) change
PAD_KV_ATOL = 1e-4


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return engine_reference()


def test_one_device_to_host_transfer_per_step(monkeypatch):
    """Every host read of a tensor is counted while execute_model runs. Only the sampled ids may cross."""
    runner, hs = make_runner(), HandScheduler()
    calls = count_host_reads(monkeypatch)
    out = blank_output()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.new(out, "b", PROMPTS[2], 6)  # a partial prefill beside a full one: a mixed step
    hs.step(runner, out)
    assert calls == ["tolist"], calls
    calls.clear()
    out = blank_output()
    hs.cached(out, "a", 1)
    hs.cached(out, "b", len(PROMPTS[2]) - 6)
    hs.step(runner, out)
    assert calls == ["tolist"], calls
    calls.clear()
    out = blank_output()
    hs.cached(out, "a", 1)
    hs.cached(out, "b", 1)
    hs.step(runner, out)  # decode-only
    assert calls == ["tolist"], calls
    assert runner.num_host_syncs == 3


def test_swap_copies_wait_for_nothing_of_their_own(monkeypatch):
    """A swap-out beside a decode and a swap-in beside a decode: still only the sampled ids are read on the host,
    and the swap-out's copy lands in the host cache (a step that samples nothing may wait for it: its one wait)."""
    runner, hs = make_runner(), HandScheduler()
    out = blank_output()
    hs.new(out, "a", PROMPTS[0], len(PROMPTS[0]))
    hs.new(out, "b", PROMPTS[2], len(PROMPTS[2]))
    hs.step(runner, out)
    calls = count_host_reads(monkeypatch)
    syncs = runner.num_host_syncs
    device = hs.drop("b")
    host = list(range(len(device)))
    out = blank_output(preempted_req_ids=["b"], blocks_to_swap_out=list(zip(device, host)))
    hs.cached(out, "a", 1)
    hs.step(runner, out)
    assert calls == ["tolist"] and runner.num_host_syncs == syncs + 1, calls
    for (k, v), (hk, hv) in zip(runner.kv_caches, runner.host_caches):  # landed, block for block
        assert torch.equal(hk[host], k[device]) and torch.equal(hv[host], v[device])
    calls.clear()
    out = blank_output()
    hs.cached(out, "a", 1)
    hs.computed["b"] = len(PROMPTS[2]) + 1
    hs.cached(out, "b", 1, resumed=True)
    out.blocks_to_swap_in = list(zip(host, hs.blocks["b"]))
    hs.step(runner, out)
    assert calls == ["tolist"] and runner.num_host_syncs == syncs + 2, calls
    calls.clear()
    hs.drop("a")
    hs.step(runner, blank_output(preempted_req_ids=["a"], blocks_to_swap_out=[(0, 5)]))  # nothing scheduled
    assert calls == [] and runner.num_host_syncs == syncs + 3


def test_padded_mixed_steps_read_one_value_per_step(monkeypatch):
    """Padding to the graphs' buckets adds no host read: mixed and decode-only steps read only the sampled ids."""
    runner, hs = make_runner(), HandScheduler()
    runner.pad_buckets = BUCKETS
    calls = count_host_reads(monkeypatch)
    mixed_steps(hs, runner)
    assert calls == ["tolist"] * runner.num_host_syncs and 0 < runner.num_host_syncs, calls


def _padded_and_plain(buckets: GraphBuckets) -> tuple[list[ModelRunner], list[HandScheduler], list[int]]:
    runners, schedulers, sizes = [make_runner(), make_runner()], [HandScheduler(), HandScheduler()], []
    runners[0].pad_buckets = buckets
    for runner, hs in zip(runners, schedulers):
        sizes = mixed_steps(hs, runner)
    return runners, schedulers, sizes


def test_steps_padded_as_for_cuda_graphs_give_the_same_tokens(reference):
    """The padding a CUDA graph replay needs (refengine.worker.cuda_graphs.pad_step_inputs), run eagerly on the CPU
    over prefills, mixed steps (prefill chunks beside decodes, partial prefills among them) and decodes: the real
    rows' tokens must not change, nor may anything be written to the KV cache that an unpadded runner does not
    write (a padded token that wrote would hit block 0, which "a" holds)."""
    (padded, plain), (hs_padded, hs_plain), sizes = _padded_and_plain(BUCKETS)
    assert max(sizes) > 4 and all(BUCKETS.shape_of(n, 1) is not None for n in sizes)  # (mixed buckets were used)
    for rid, p, ref in zip("abc", PROMPTS, reference):
        assert hs_padded.tokens[rid][len(p) :] == ref
        assert hs_plain.tokens[rid] == hs_padded.tokens[rid]
    for (k1, v1), (k2, v2) in zip(padded.kv_caches, plain.kv_caches):
        torch.testing.assert_close(k1, k2, rtol=0, atol=PAD_KV_ATOL)
        torch.testing.assert_close(v1, v2, rtol=0, atol=PAD_KV_ATOL)


def test_graph_runner_static_buffers_on_the_cpu(reference):
    """The replay path of CudaGraphRunner (padding, the copies into its static buffers, the returned static
    output) with each captured graph replaced by an eager replay on those buffers: every step, prefill, mixed and
    decode-only, replays, and the tokens are the same."""
    runner, hs = make_runner(), HandScheduler()
    graphs = install_eager_graphs(runner, BUCKETS)
    mixed_steps(hs, runner)
    assert graphs.num_replays == hs.num_steps > 5  # every step: the prefill, the mixed ones, the decodes
    for rid, p, ref in zip("abc", PROMPTS, reference):
        assert hs.tokens[rid][len(p) :] == ref


def test_staging_buffer_packs_aligned_views_and_grows():
    import numpy as np

    from refengine.worker.input_batch import StagingBuffer

    buf = StagingBuffer(torch.device("cpu"), size=8)
    arrays = [np.arange(3), np.array([7]), np.arange(10, 15), np.array([], dtype=np.int64), np.array([-1, -2])]
    views = buf.pack(*arrays)  # 3 + 1 + 5 + 0 + 2 elements, more than 8: the buffer grows
    assert [v.tolist() for v in views] == [a.tolist() for a in arrays]
    assert all(v.data_ptr() % 16 == 0 for v in views)  # Triton specializes pointers on 16-byte alignment
    again = buf.pack(np.array([4, 5]))
    assert again[0].tolist() == [4, 5]
    # int32 arrays (the attention metadata) cross as int32, odd lengths included, and stay aligned
    mixed = [
        np.array([1, 2, 3], dtype=np.int32),
        np.arange(4),
        np.array([2**31 - 1], dtype=np.int32),
        np.arange(6, dtype=np.int32).reshape(2, 3).ravel(),
    ]
    views = buf.pack(*mixed)
    assert [v.dtype for v in views] == [torch.int32, torch.int64, torch.int32, torch.int32]
    assert [v.tolist() for v in views] == [a.tolist() for a in mixed]
    assert all(v.data_ptr() % 16 == 0 for v in views)


# The process's other allocations while the caches are made; torch.zeros' caches would add the whole 1 GiB
UNTOUCHED_RSS_SLACK_BYTES = 64 * 2**20


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc/self/statm")
def test_a_cpu_kv_cache_reads_as_zeros_and_costs_no_memory_until_written():
    """CPU caches come from calloc (model_runner._zeros): zeros in every cache dtype, and a 1 GiB cache is not
    resident until blocks are written (a new engine no longer spends 0.4 s writing zeros)."""
    from refengine.worker.model_runner import _zero_caches

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ((k, v),) = _zero_caches(1, (4, 16, 2, 8), dtype, torch.device("cpu"))
        assert k.dtype == v.dtype == dtype and k.shape == (4, 16, 2, 8) and k.is_contiguous()
        assert not k.any() and not v.any() and k.data_ptr() != v.data_ptr()
    before = _resident_bytes()
    caches = _zero_caches(4, (16384, 16, 2, 64), torch.float32, torch.device("cpu"))  # 1 GiB, tiny-qwen2's default
    assert _resident_bytes() - before < UNTOUCHED_RSS_SLACK_BYTES
    caches[1][0][3].fill_(1.0)  # a written block is ordinary memory, its neighbours stay zero
    assert caches[1][0][3].sum() == 16 * 2 * 64 and not caches[1][0][2].any() and not caches[1][1][3].any()
