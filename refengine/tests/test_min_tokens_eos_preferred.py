"""min_tokens holds EOS back in the runner's sampler, whatever the model prefers: with a model whose every step's
argmax is EOS (the tiny model's logits with EOS raised above the rest; a random-weight model almost never picks EOS
by itself), a request samples exactly min_tokens other tokens, then EOS, in every batching mode, sync and async;
with ignore_eos nothing is held back and every token is EOS.
"""

from __future__ import annotations

import functools

import pytest
import torch

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine

EOS_MARGIN = 10.0  # how far above the best other logit EOS is put: greedy picks it whenever it is allowed


class PrefersEos(torch.nn.Module):
    """The tiny model, its logits changed so that EOS is every step's argmax."""

    def __init__(self, inner: torch.nn.Module, eos_token_ids: tuple[int, ...]) -> None:
        super().__init__()
        self.inner, self.eos = inner, list(eos_token_ids)

    def forward(self, *args: object) -> torch.Tensor:
        return self.inner(*args)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.inner.compute_logits(hidden).clone()
        logits[:, self.eos] = logits.max(dim=-1, keepdim=True).values + EOS_MARGIN
        return logits


@functools.lru_cache(maxsize=1)
def _model() -> PrefersEos:
    from refengine.worker.worker import _load_model_cached

    lm, cfg = _load_model_cached(TEST_MODEL, torch.device("cpu"), torch.float32, 0, "torch")
    assert cfg.eos_token_ids, "the test model must have an EOS"
    return PrefersEos(lm, cfg.eos_token_ids)


MIN_TOKENS = (0, 1, 3, 6)
MAX_TOKENS = 8


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("batching", ["continuous", "sequence", "static", "none"])
def test_no_eos_before_min_tokens_when_the_model_prefers_it(batching, async_scheduling):
    model = _model()
    engine = LLMEngine(
        TEST_MODEL,
        model_impl=model,
        block_size=4,
        num_gpu_blocks=64,
        max_model_len=256,
        max_num_seqs=8,
        batching=batching,
        async_scheduling=async_scheduling,
    )
    prompts = make_prompts((5, 9, 12, 3, 7), seed=5)
    params = [greedy(MAX_TOKENS, min_tokens=m) for m in MIN_TOKENS] + [greedy(5, min_tokens=3, ignore_eos=True)]
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", p, sp)
    outs = {}
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            outs.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
            if o.finished:
                outs[o.request_id] = (outs[o.request_id], o.outputs[0].finish_reason)
    eos = set(model.eos)
    for i, m in enumerate(MIN_TOKENS):
        tokens, reason = outs[f"r{i}"]
        early = [t for t in tokens[:m] if t in eos]
        assert not early, f"min_tokens={m}: EOS sampled among the first {m} outputs {tokens}"
        assert len(tokens) == m + 1 and tokens[-1] in eos and reason == "stop", (
            f"min_tokens={m}: {tokens} ({reason}); the model prefers EOS from output {m} on"
        )
    tokens, reason = outs["r4"]
    assert len(tokens) == 5 and set(tokens) <= eos and reason == "length", f"ignore_eos holds nothing back: {tokens}"
