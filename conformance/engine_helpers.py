"""Shared helpers for the engine-level (real tiny model) conformance tests."""

from __future__ import annotations

import functools

import torch

from conformance.progress import guarded_generate
from refengine import LLM, SamplingParams
from refengine.models.presets import TEST_MODEL

# Prompt lengths from 1 to a few hundred tokens; 16 and 17 straddle the default block size.
PROMPT_LENS = (1, 5, 16, 17, 40, 129, 260)
MAX_TOKENS = (7, 12, 3, 20, 9, 15, 6)
# TEST_MODEL, the engine and HTTP tests' model: tiny-qwen2 with an 8192-row vocabulary (refengine/models/loader.py). Same
# code paths, 18x less logits GEMM per step, which on a CPU is most of a tiny-qwen2 step; what the 151936-row default
# model alone can show (its HF parity, the Qwen BPE's exact ids) stays tested on it: refengine/tests/test_model.py,
# test_serve.py, test_bad_input.py, test_kv_sizing.py and the perf CLI's default runs.
TOKEN_ID_RANGE = (100, 8_000)  # ordinary BPE ids, in both models' vocabularies


def make_prompts(lens=PROMPT_LENS, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(*TOKEN_ID_RANGE, (n,), generator=g).tolist() for n in lens]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def run_llm(prompts, max_tokens=MAX_TOKENS, model: str = TEST_MODEL, **knobs) -> tuple[list[list[int]], LLM]:
    llm = LLM(model=model, device="cpu", **knobs)
    outs = guarded_generate(llm, prompts, [greedy(m) for m in max_tokens])  # a stuck engine fails, with its state
    return [o.outputs[0].token_ids for o in outs], llm


@functools.lru_cache(maxsize=4)
def _hf_for(model: str):
    from refengine.models.hf_twin import to_hf_model
    from refengine.worker.worker import _load_model_cached

    lm, cfg = _load_model_cached(model, torch.device("cpu"), torch.float32, 0, "torch")
    return to_hf_model(lm, cfg), cfg


def hf_greedy(prompts, max_tokens, model: str = TEST_MODEL, hf_model=None, eos=None) -> list[list[int]]:
    """Hugging Face generate, greedy, one prompt at a time (no padding), on the same weights."""
    if hf_model is None:
        hf_model, cfg = _hf_for(model)
        eos = list(cfg.eos_token_ids)
    outs = []
    with torch.inference_mode():
        for p, m in zip(prompts, max_tokens):
            ids = torch.tensor([p])
            g = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=m,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0] if eos else 0,
            )
            outs.append(g[0, len(p) :].tolist())
    return outs
