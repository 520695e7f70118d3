"""CUDA graphs for decode-only steps (refengine/worker/cuda_graphs.py). On the CPU: the size list, the padding, and the
Triton kernel (interpreted) on a padded decode batch; graphs are never used off CUDA. On a GPU (`gpu`): the
engine with graphs gives the same greedy tokens as with enforce_eager, and actually replays its graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import conformance._triton_env  # noqa: F401  (before kernels: the interpreter on a CPU)
from conformance.engine_helpers import greedy, make_prompts
from refengine import LLM, LLMEngine
from refengine.worker.cuda_graphs import capture_sizes, pad_decode_inputs, padded_size

ON_GPU = torch.cuda.is_available()
needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")]
# float32 on both sides, so that a different batch shape (padded vs not) can only move logits by rounding; the
# oracle comparison below uses the kernel tests' own float32 tolerance
ATTN_ATOL = 1e-4


def test_capture_sizes_are_vllm_like_and_end_at_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    s = capture_sizes(300)
    assert s[:5] == [1, 2, 4, 8, 16] and 256 in s and s[-2:] == [288, 300]
    assert padded_size(s, 3) == 4 and padded_size(s, 8) == 8 and padded_size(s, 257) == 272
    assert padded_size(s, 301) is None


def test_pad_decode_inputs():
    ids, pos, slots = np.array([5, 6, 7]), np.array([10, 3, 8]), np.array([41, 13, 22])
    qsl, lens, table = np.array([0, 1, 2, 3]), np.array([11, 4, 9]), np.array([[4, 5], [3, 0], [2, 6]])
    p = pad_decode_inputs(ids, pos, slots, qsl, lens, table, 5)
    assert p[0].tolist() == [5, 6, 7, 0, 0] and p[1].tolist() == [10, 3, 8, 0, 0]
    assert p[2].tolist() == [41, 13, 22, -1, -1]  # padded tokens write nothing
    assert p[3].tolist() == [0, 1, 2, 3, 3, 3]  # padded sequences have query length 0 ...
    assert p[4].tolist() == [11, 4, 9, 0, 0]  # ... and no context
    assert p[5].tolist() == [[4, 5], [3, 0], [2, 6], [0, 0], [0, 0]]
    with pytest.raises(ValueError):
        pad_decode_inputs(ids, pos, slots, qsl, lens, table, 2)


@pytest.mark.parametrize("num_kv_segments", [1, 4])  # single pass, and split-KV as a long captured table chooses
def test_triton_kernel_on_a_padded_decode_batch_matches_the_unpadded_oracle(num_kv_segments):
    """What a graph replay runs: the Triton kernels (interpreted here) on 3 decodes padded to 8; the real rows must
    equal the oracle on the unpadded batch, and the padded tokens must write nothing to the cache."""
    from cbbench.kernels.reference import unified_attention_ref
    from cbbench.kernels.reshape_and_cache import reshape_and_cache
    from cbbench.kernels.unified_attention import unified_attention

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
    p = pad_decode_inputs(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), slots, qsl, lens, table, 8)
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


def test_no_graphs_off_cuda_and_enforce_eager_is_a_knob():
    engine = LLMEngine("tiny-qwen2", device="cpu", num_gpu_blocks=64)
    assert engine.model_runner.cuda_graphs is None and engine.config.enforce_eager is False
    assert LLMEngine("tiny-qwen2", device="cpu", num_gpu_blocks=64, enforce_eager=True).config.enforce_eager
    with pytest.raises(ValueError, match="enforce_eager"):
        LLMEngine("tiny-qwen2", device="cpu", num_gpu_blocks=64, enforce_eager="yes")


# ---------------------------------------------------------------- on a GPU
PROMPT_LENS = (3, 17, 40, 5, 64, 9, 33)  # 7 requests: decode batches of 7 (padded to 8), then fewer as they finish
MAX_TOKENS = (24, 9, 16, 30, 5, 12, 20)
MAX_NUM_SEQS = 8


NUM_GPU_BLOCKS = 64  # 7 requests of up to 64 + 30 tokens: sized, not profiled (each engine asked for 0.9 of the card)


def _generate(dtype: str, pad_eager: bool = False, **knobs) -> tuple[list[list[int]], int | None]:
    """The greedy tokens, and the decode graphs' replay count (None: no graphs). The engine is shut down before
    this returns: the next one is built on a card that the first has given back."""
    with LLM(
        "tiny-qwen2",
        device="cuda",
        dtype=dtype,
        attention_backend="triton",
        max_num_seqs=MAX_NUM_SEQS,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        **knobs,
    ) as llm:
        runner = llm.llm_engine.model_runner
        if pad_eager:  # eager, on the very shapes the graphs were captured at
            runner.decode_pad_sizes = capture_sizes(MAX_NUM_SEQS)
        outs = llm.generate(make_prompts(PROMPT_LENS, seed=5), [greedy(m, ignore_eos=True) for m in MAX_TOKENS])
        replays = None if runner.cuda_graphs is None else runner.cuda_graphs.num_replays
    return [o.outputs[0].token_ids for o in outs], replays


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_gpu_graphs_give_the_greedy_tokens_of_eager():
    """float32: graphs against plain eager (other batch shapes can only round differently)."""
    eager, eager_replays = _generate("float32", enforce_eager=True)
    graphs, replays = _generate("float32")
    assert eager_replays is None
    assert replays is not None and replays > 0  # the decodes did replay
    assert graphs == eager


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_graphs_equal_eager_on_the_same_padded_shapes(dtype):
    """Eager on the captured (padded) shapes runs the same kernels as the replay: the same tokens in any dtype."""
    padded, _ = _generate(dtype, pad_eager=True, enforce_eager=True)
    graphs, replays = _generate(dtype)
    assert replays is not None and replays > 0
    assert graphs == padded
