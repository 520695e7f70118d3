"""CUDA graphs for decode-only steps (refengine/worker/cuda_graphs.py). On the CPU: the size list, the padding, and the
Triton kernel (interpreted) on a padded decode batch; graphs are never used off CUDA. On a GPU (`gpu`): the
engine with graphs gives the same greedy tokens as with enforce_eager, and actually replays its graphs."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import conformance._triton_env  # noqa: F401  (before kernels: the interpreter on a CPU)
from conformance.engine_helpers import greedy, make_prompts
from refengine import LLM, LLMEngine
from refengine.worker.cuda_graphs import (
    CudaGraphRunner,
    GraphBuckets,
    capture_sizes,
    mixed_capture_sizes,
    pad_step_inputs,
    padded_size,
)

ON_GPU = torch.cuda.is_available()
needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")]
# float32 on both sides, so that a different batch shape (padded vs not) can only move logits by rounding; the
# oracle comparison below uses the kernel tests' own float32 tolerance
ATTN_ATOL = 1e-4
UNTOUCHED = 7.0  # what an output row holds until a kernel writes it


def test_capture_sizes_are_vllm_like_and_end_at_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    s = capture_sizes(300)
    assert s[:5] == [1, 2, 4, 8, 16] and 256 in s and s[-2:] == [288, 300]
    assert padded_size(s, 3) == 4 and padded_size(s, 8) == 8 and padded_size(s, 257) == 272
    assert padded_size(s, 301) is None


def test_mixed_capture_sizes_are_bounded_and_end_at_the_budget():
    sizes = mixed_capture_sizes(8192)
    assert sizes[:3] == [16, 32, 48] and sizes[15:18] == [256, 320, 384] and sizes[-2:] == [1792, 2048]
    assert len(sizes) == 32 and sizes == sorted(set(sizes))
    assert mixed_capture_sizes(100) == [16, 32, 48, 64, 80, 96, 100]  # the budget itself is the last
    assert mixed_capture_sizes(4096, max_tokens=4096)[-3:] == [3584, 3840, 4096]
    assert mixed_capture_sizes(1) == []  # one token is never a mixed step


def test_graph_buckets_hold_every_step_up_to_the_largest():
    b = GraphBuckets.of(max_num_seqs=8, max_num_batched_tokens=64)
    assert b.shape_of(3, 3) == (4, 4) and b.shape_of(8, 8) == (8, 8) and b.shape_of(9, 9) is None
    assert b.shape_of(2, 1) == (16, 8)  # mixed: padded sequences capped at max_num_seqs
    assert b.shape_of(40, 8) == (48, 8) and b.shape_of(64, 8) == (64, 8) and b.shape_of(65, 8) is None
    small = GraphBuckets.of(max_num_seqs=256, max_num_batched_tokens=8192)
    assert small.shape_of(20, 19) == (32, 31)  # T_pad > S_pad: the kernel plans it as the mixed step it is
    for t, s in ((2, 1), (17, 16), (300, 256), (2048, 256), (257, 200)):
        pt, ps = small.shape_of(t, s)
        assert pt >= t and ps >= s and pt > ps
    assert small.shape_of(2049, 256) is None  # larger mixed steps run eagerly
    shapes = small.shapes()
    assert len(shapes) == len(set(shapes)) == 35 + 32


def test_pad_step_inputs():
    ids, pos, slots = np.array([5, 6, 7]), np.array([10, 3, 8]), np.array([41, 13, 22])
    qsl, lens, table = np.array([0, 1, 2, 3]), np.array([11, 4, 9]), np.array([[4, 5], [3, 0], [2, 6]])
    p = pad_step_inputs(ids, pos, slots, qsl, lens, table, 5, 5)
    assert p[0].tolist() == [5, 6, 7, 0, 0] and p[1].tolist() == [10, 3, 8, 0, 0]
    assert p[2].tolist() == [41, 13, 22, -1, -1]  # padded tokens write nothing
    assert p[3].tolist() == [0, 1, 2, 3, 3, 3]  # padded sequences have query length 0 ...
    assert p[4].tolist() == [11, 4, 9, 0, 0]  # ... and no context
    assert p[5].tolist() == [[4, 5], [3, 0], [2, 6], [0, 0], [0, 0]]
    # a mixed step: a prefill chunk of 3 and a decode (4 tokens, 2 sequences) padded to (8, 3)
    qsl, lens, table = np.array([0, 3, 4]), np.array([3, 9]), np.array([[4, 5], [2, 6]])
    ids, pos, slots = np.array([1, 2, 3, 4]), np.array([0, 1, 2, 8]), np.array([16, 17, 18, 32])
    p = pad_step_inputs(ids, pos, slots, qsl, lens, table, 8, 3)
    assert p[0].tolist() == [1, 2, 3, 4, 0, 0, 0, 0] and p[2].tolist() == [16, 17, 18, 32, -1, -1, -1, -1]
    assert p[3].tolist() == [0, 3, 4, 4]  # padded tokens lie past query_start_loc[-1]: no query holds them
    assert p[4].tolist() == [3, 9, 0] and p[5].tolist() == [[4, 5], [2, 6], [0, 0]]
    with pytest.raises(ValueError):
        pad_step_inputs(ids, pos, slots, qsl, lens, table, 3, 3)
    with pytest.raises(ValueError):
        pad_step_inputs(ids, pos, slots, qsl, lens, table, 8, 1)


@pytest.mark.parametrize("num_kv_segments", [1, 4])  # single pass, and split-KV as a long captured table chooses
def test_triton_kernel_on_a_padded_decode_batch_matches_the_unpadded_oracle(num_kv_segments):
    """What a graph replay runs: the Triton kernels (interpreted here) on 3 decodes padded to 8; the real rows must
    equal the oracle on the unpadded batch, and the padded tokens must write nothing to the cache."""
    from cbbench.kernels.reference import unified_attention_ref
    from cbbench.kernels.triton_reshape_and_cache import reshape_and_cache
    from cbbench.kernels.triton_unified_attention import unified_attention

    g = torch.Generator().manual_seed(0)
    num_blocks, bs, kvh, heads, d = 12, 4, 2, 4, 16
    k_cache = torch.randn(num_blocks, bs, kvh, d, generator=g)
    v_cache = torch.randn(num_blocks, bs, kvh, d, generator=g)
    lens = np.array([5, 9, 2])
    table = np.array([[3, 7, 0], [1, 2, 8], [11, 0, 0]])
    slots = np.array([table[i, (n - 1) // bs] * bs + (n - 1) % bs for i, n in enumerate(lens)])
    qsl = np.arange(4)
    q = torch.randn(3, heads, d, generator=g)
    k_new, v_new = torch.randn(3, kvh, d, generator=g), torch.randn(3, kvh, d, generator=g)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reshape_and_cache(k_new, v_new, ref_k, ref_v, torch.from_numpy(slots))
    ref = unified_attention_ref(
        q,
        ref_k,
        ref_v,
        torch.empty_like(q),
        torch.from_numpy(qsl).int(),
        torch.from_numpy(lens).int(),
        torch.from_numpy(table).int(),
        d**-0.5,
    )
    p = pad_step_inputs(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), slots, qsl, lens, table, 8, 8)
    pad = torch.zeros(5, kvh, d)
    kp, vp = k_cache.clone(), v_cache.clone()
    reshape_and_cache(torch.cat([k_new, pad + 9.0]), torch.cat([v_new, pad - 9.0]), kp, vp, torch.from_numpy(p[2]))
    assert torch.equal(kp, ref_k) and torch.equal(vp, ref_v)
    qp = torch.cat([q, torch.randn(5, heads, d, generator=g)])
    out = unified_attention(
        qp,
        kp,
        vp,
        torch.zeros_like(qp),
        torch.from_numpy(p[3]),
        torch.from_numpy(p[4]),
        torch.from_numpy(p[5]),
        d**-0.5,
        num_kv_segments=num_kv_segments,
    )
    torch.testing.assert_close(out[:3], ref, rtol=0, atol=ATTN_ATOL)


def test_triton_kernel_on_a_padded_mixed_step_matches_the_unpadded_oracle():
    """What a mixed bucket's replay runs: the Triton kernels (interpreted here) on a prefill chunk of 5 tokens
    beside 2 decodes (7 tokens, 3 sequences), padded to the bucket (16, 4). The real rows equal the oracle on the
    unpadded step; the padded tokens write nothing to the cache, and their output rows are left as they were (no
    sequence's query reaches them)."""
    from cbbench.kernels.reference import unified_attention_ref
    from cbbench.kernels.triton_reshape_and_cache import reshape_and_cache
    from cbbench.kernels.triton_unified_attention import unified_attention

    g = torch.Generator().manual_seed(1)
    num_blocks, bs, kvh, heads, d = 12, 4, 2, 4, 16
    k_cache = torch.randn(num_blocks, bs, kvh, d, generator=g)
    v_cache = torch.randn(num_blocks, bs, kvh, d, generator=g)
    lens, qlens = np.array([9, 5, 2]), np.array([5, 1, 1])  # the chunk covers positions 4..8 of its sequence
    table = np.array([[3, 7, 10], [1, 2, 0], [11, 0, 0]])
    qsl = np.concatenate([[0], np.cumsum(qlens)])
    pos = np.concatenate([np.arange(n - q, n) for n, q in zip(lens, qlens)])
    seq = np.repeat(np.arange(3), qlens)
    slots = table[seq, pos // bs] * bs + pos % bs
    t = len(pos)
    q = torch.randn(t, heads, d, generator=g)
    k_new, v_new = torch.randn(t, kvh, d, generator=g), torch.randn(t, kvh, d, generator=g)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reshape_and_cache(k_new, v_new, ref_k, ref_v, torch.from_numpy(slots))
    as_int = {name: torch.from_numpy(a).int() for name, a in (("qsl", qsl), ("lens", lens), ("table", table))}
    ref = unified_attention_ref(
        q, ref_k, ref_v, torch.empty_like(q), as_int["qsl"], as_int["lens"], as_int["table"], d**-0.5
    )
    num_tokens, num_seqs = GraphBuckets.of(max_num_seqs=4, max_num_batched_tokens=64).shape_of(t, 3)
    assert (num_tokens, num_seqs) == (16, 4)
    p = pad_step_inputs(np.zeros(t, dtype=np.int64), pos, slots, qsl, lens, table, num_tokens, num_seqs)
    pad = torch.zeros(num_tokens - t, kvh, d)
    kp, vp = k_cache.clone(), v_cache.clone()
    reshape_and_cache(torch.cat([k_new, pad + 9.0]), torch.cat([v_new, pad - 9.0]), kp, vp, torch.from_numpy(p[2]))
    assert torch.equal(kp, ref_k) and torch.equal(vp, ref_v)
    qp = torch.cat([q, torch.randn(num_tokens - t, heads, d, generator=g)])
    out = unified_attention(qp, kp, vp, torch.full_like(qp, UNTOUCHED), *(torch.from_numpy(a) for a in p[3:]), d**-0.5)
    torch.testing.assert_close(out[:t], ref, rtol=0, atol=ATTN_ATOL)
    assert (out[t:] == UNTOUCHED).all()  # padded tokens: untouched


def test_no_graphs_off_cuda_and_enforce_eager_is_a_knob():
    engine = LLMEngine("tiny-qwen2", device="cpu", num_gpu_blocks=64)
    assert engine.model_runner.cuda_graphs is None and engine.config.enforce_eager is False
    assert LLMEngine("tiny-qwen2", device="cpu", num_gpu_blocks=64, enforce_eager=True).config.enforce_eager
    with pytest.raises(ValueError, match="enforce_eager"):
        LLMEngine("tiny-qwen2", device="cpu", num_gpu_blocks=64, enforce_eager="yes")


def test_capture_warms_up_every_bucket_on_one_side_stream(monkeypatch):
    """The caching allocator keeps a block freed on one stream for that stream alone: a side stream per bucket
    would strand each bucket's warm-up activations in a pool of its own (torch hands out up to 32 streams in turn)
    that nothing else reuses, on a card whose KV cache is already sized. torch.cuda's stream and graph calls are
    faked on the CPU, recording the stream each warm-up forward runs on."""
    from refengine.worker.cuda_graphs import NUM_WARMUP_FORWARDS, CudaGraphRunner

    class Stream:
        def __init__(self, device: object = None) -> None:
            made.append(self)

        def wait_stream(self, other: object) -> None:
            pass

    made: list[Stream] = []
    default = Stream()
    state = {"current": default, "capturing": False}
    warmup_streams: list[Stream] = []

    @contextlib.contextmanager
    def stream(s):
        before, state["current"] = state["current"], s
        try:
            yield
        finally:
            state["current"] = before

    @contextlib.contextmanager
    def graph(g, pool=None):
        state["capturing"] = True
        try:
            yield
        finally:
            state["capturing"] = False

    class Graph:
        def pool(self) -> None:
            return None

    for name, value in {
        "Stream": Stream,
        "stream": stream,
        "graph": graph,
        "CUDAGraph": Graph,
        "synchronize": lambda device=None: None,
        "current_stream": lambda device=None: state["current"],
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)

    def model(input_ids, positions, kv_caches, meta):
        if not state["capturing"]:
            warmup_streams.append(state["current"])
        return torch.zeros(input_ids.shape[0], 4)

    caches = [(torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8))]
    buckets = GraphBuckets.of(max_num_seqs=8, max_num_batched_tokens=64)
    runner = CudaGraphRunner(model, caches, buckets, max_blocks=4, device=torch.device("cpu"))
    runner.capture()
    assert len(runner.graphs) == len(buckets.shapes()) > 1
    assert len(warmup_streams) == NUM_WARMUP_FORWARDS * len(buckets.shapes())
    assert len({id(s) for s in warmup_streams}) == 1 and warmup_streams[0] is not default


# ---------------------------------------------------------------- on a GPU
PROMPT_LENS = (3, 17, 40, 5, 64, 9, 33)  # 7 requests: decode batches of 7 (padded to 8), then fewer as they finish
MAX_TOKENS = (24, 9, 16, 30, 5, 12, 20)
MAX_NUM_SEQS = 8
# a token budget that splits the longer prompts into chunks scheduled beside the others' decodes: mixed steps
MAX_NUM_BATCHED_TOKENS = 24
# the KV blocks given, so that no engine sizes its cache from the memory an earlier test's engine still holds
NUM_GPU_BLOCKS = 256


def _generate(dtype: str, pad_eager: bool = False, **knobs) -> tuple[list[list[int]], dict[str, int | None]]:
    """The greedy tokens, and what ran graphed: `replays` (None: no graphs), the mixed and decode-only steps and how
    many of each replayed a graph. The engine is shut down before this returns: the next one is built on a card that
    the first has given back."""
    with LLM(
        "tiny-qwen2",
        device="cuda",
        dtype=dtype,
        attention_backend="triton",
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        **knobs,
    ) as llm:
        runner = llm.llm_engine.model_runner
        if pad_eager:  # eager, on the very shapes the graphs were captured at
            runner.pad_buckets = runner.graph_buckets
        outs = llm.generate(make_prompts(PROMPT_LENS, seed=5), [greedy(m, ignore_eos=True) for m in MAX_TOKENS])
        steps = list(llm.llm_engine.step_stats)
        mixed = [s for s in steps if s.num_prefill_tokens and s.num_decode_tokens]
        decode = [s for s in steps if s.num_decode_tokens and not s.num_prefill_tokens]
        ran = {
            "replays": None if runner.cuda_graphs is None else runner.cuda_graphs.num_replays,
            "mixed": len(mixed),
            "decode": len(decode),
            "graphed": sum(bool(s.cuda_graph) for s in mixed + decode),
        }
    return [o.outputs[0].token_ids for o in outs], ran


def _assert_mixed_steps_replayed(ran: dict[str, int | None]) -> None:
    """The run had mixed steps (prefill chunks beside decodes) and decode-only ones, and every one replayed."""
    assert ran["mixed"] and ran["decode"], "the workload must have mixed and decode-only steps"
    assert ran["graphed"] == ran["mixed"] + ran["decode"]
    assert ran["replays"] is not None and ran["replays"] >= ran["graphed"]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_gpu_graphs_give_the_greedy_tokens_of_eager():
    """float32: graphs against plain eager (other batch shapes can only round differently), mixed steps included."""
    eager, ran_eager = _generate("float32", enforce_eager=True)
    assert ran_eager["replays"] is None and not ran_eager["graphed"]
    graphs, ran = _generate("float32")
    _assert_mixed_steps_replayed(ran)
    assert graphs == eager


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_graphs_equal_eager_on_the_same_padded_shapes(dtype):
    """Eager on the captured (padded) shapes runs the same kernels as the replay: the same tokens in any dtype,
    on mixed steps as on decode-only ones."""
    padded, _ = _generate(dtype, pad_eager=True, enforce_eager=True)
    graphs, ran = _generate(dtype)
    _assert_mixed_steps_replayed(ran)
    assert graphs == padded


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_gpu_one_device_sync_per_step():
    """torch's CUDA sync debug mode raises on any synchronizing call (a blocking copy either way, .item(), nonzero,
    a boolean mask) made inside execute_model, except the one allowed: the sampled ids' copy (_to_host)."""
    with LLM(
        "tiny-qwen2",
        device="cuda",
        attention_backend="triton",
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        async_scheduling=False,  # (the debug mode is process-wide: keep every step on this thread)
    ) as llm:
        _assert_one_sync_per_step(llm)


def _assert_one_sync_per_step(llm: LLM) -> None:
    runner = llm.llm_engine.model_runner
    execute, to_host = runner.execute_model, runner._to_host

    def allowed(token_ids):
        torch.cuda.set_sync_debug_mode("default")
        try:
            return to_host(token_ids)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    def strict(out):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return execute(out)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    runner._to_host, runner.execute_model = allowed, strict
    llm.generate(make_prompts(PROMPT_LENS, seed=5), [greedy(m, ignore_eos=True) for m in MAX_TOKENS])
    steps = llm.llm_engine.step_stats
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)
    assert runner.num_host_syncs <= len(steps)


def test_a_buckets_max_query_len_bounds_every_step_it_holds():
    """A step of 10 tokens over 2 sequences (one query of 9) replays the mixed bucket (16, 15): the metadata must not
    claim a longest query shorter than 9; a decode bucket's queries are one token."""
    buckets = GraphBuckets.of(max_num_seqs=16, max_num_batched_tokens=64)
    kv = [(torch.zeros(4, 16, 1, 8), torch.zeros(4, 16, 1, 8))]
    runner = CudaGraphRunner(torch.nn.Identity(), kv, buckets, max_blocks=4, device=torch.device("cpu"))
    t_pad, s_pad = buckets.shape_of(10, 2)
    assert runner.meta(t_pad, s_pad).max_query_len >= 9
    assert runner.meta(8, 8).max_query_len == 1
