"""Greedy token ids equal Hugging Face generate's, whatever the chunking, block size or batch around them."""

from __future__ import annotations

import pytest
import torch

from conformance.engine_helpers import MAX_TOKENS, TEST_MODEL, greedy, hf_greedy, make_prompts, run_llm
from refengine import LLMEngine


@pytest.fixture(scope="module")
def prompts():
    return make_prompts()


@pytest.fixture(scope="module")
def hf_tokens(prompts):
    return hf_greedy(prompts, MAX_TOKENS)


@pytest.mark.parametrize("block_size", [1, 16, 7])
def test_greedy_equals_hf_generate_with_chunked_prefill(prompts, hf_tokens, block_size):
    # budget 32 forces every prompt longer than that into chunks, mixed with other requests' decodes
    ours, llm = run_llm(
        prompts, block_size=block_size, max_num_batched_tokens=32, num_gpu_blocks=4096 // block_size * 4
    )
    assert ours == hf_tokens
    assert llm.llm_engine.scheduler.num_free_blocks == llm.llm_engine.scheduler.config.num_gpu_blocks


def test_tokens_independent_of_batch_and_arrival_order(prompts, hf_tokens):
    order = list(reversed(range(len(prompts))))
    ours, _ = run_llm([prompts[i] for i in order], [MAX_TOKENS[i] for i in order], max_num_batched_tokens=64)
    assert [ours[order.index(i)] for i in range(len(prompts))] == hf_tokens
    alone, _ = run_llm(prompts[:1], MAX_TOKENS[:1], max_num_batched_tokens=64)
    assert alone[0] == hf_tokens[0]


def test_the_default_model_with_ids_from_its_whole_vocabulary():
    """The other tests run on tiny-qwen2-8k; this one drives the 151936-row default model with prompt ids from all
    of its vocabulary (an id truncated or wrapped anywhere on the way in, e.g. to 16 bits, changes the tokens), in
    chunks beside other requests' decodes."""
    g = torch.Generator().manual_seed(3)
    big = [torch.randint(100, 151_643, (n,), generator=g).tolist() for n in (5, 17, 40)]
    assert max(max(p) for p in big) > 2**16
    max_tokens = (6, 4, 5)
    ours, _ = run_llm(big, max_tokens, model="tiny-qwen2", block_size=16, max_num_batched_tokens=32, num_gpu_blocks=64)
    assert ours == hf_greedy(big, max_tokens, model="tiny-qwen2")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_folder_saved_by_save_pretrained(tmp_path, arch):
    import transformers

    common = dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
    )
    torch.manual_seed(1)
    if arch == "qwen2":
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=True))
    else:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, tie_word_embeddings=False))
    hf.save_pretrained(tmp_path)
    hf.eval()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (1, 9, 23, 70)]
    max_tokens = [10, 6, 12, 8]
    want = hf_greedy(prompts, max_tokens, hf_model=hf, eos=[2])
    for block_size in (1, 16, 5):
        engine = LLMEngine(str(tmp_path), block_size=block_size, max_num_batched_tokens=16, num_gpu_blocks=512)
        for i, (p, m) in enumerate(zip(prompts, max_tokens)):
            engine.add_request(str(i), p, greedy(m))
        got: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                got.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        assert [got[str(i)] for i in range(len(prompts))] == want, f"block_size={block_size}"
        assert engine.scheduler.num_free_blocks == 512


def test_all_blocks_return_after_finish_and_abort(prompts):
    engine = LLMEngine(TEST_MODEL, max_num_batched_tokens=48, num_gpu_blocks=256, block_size=4)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, greedy(50))
    finished = {}
    for _ in range(6):
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].finish_reason
    engine.abort_request(["0", "3", "6"])
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].finish_reason
    assert sorted(finished) == [str(i) for i in range(len(prompts))]
    assert finished["0"] == finished["3"] == finished["6"] == "abort"
    engine.scheduler.check_invariants()
    assert engine.scheduler.num_free_blocks == 256


def test_triton_backend_under_interpreter_matches_torch_backend():
    """The Triton kernels (through TRITON_INTERPRET=1 on a CPU machine) give the engine the same greedy tokens."""
    prompts = make_prompts((3, 11, 20), seed=5)
    max_tokens = (4, 3, 5)
    knobs = dict(block_size=16, max_num_batched_tokens=16, num_gpu_blocks=64)  # a chunked prefill beside decodes
    torch_tokens, _ = run_llm(prompts, max_tokens, attention_backend="torch", **knobs)
    triton_tokens, llm = run_llm(prompts, max_tokens, attention_backend="triton", **knobs)
    assert llm.llm_engine.attention_backend == "triton"
    assert triton_tokens == torch_tokens
