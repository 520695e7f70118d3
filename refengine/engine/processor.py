"""Processor: turns what a caller hands `add_request` into a `Request`, or a ValueError naming the bad field.

As vLLM's v1 `Processor`, it checks everything that depends on the model and the engine's limits before anything
is queued, so that nothing it accepts can fail later inside a step: prompt type and token ids, the context and KV
capacity, stop_token_ids inside the vocabulary, stop strings only where there is a tokenizer. It also takes a
private copy of the SamplingParams (re-checked), so that a caller mutating its object afterwards cannot reach the
engine. Building a request has no side effect: LLM.generate builds all of its requests first, then queues them.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from refengine.config import SchedulerConfig
from refengine.limits import check_request_fits
from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.tokenizer import NoTokenizer, Tokenizer

# text, token ids, or vLLM's {"prompt": ...} / {"prompt_token_ids": ...}, either with vLLM's optional "cache_salt"
Prompt = str | list[int] | dict[str, Any]


class Processor:
    def __init__(
        self, tokenizer: Tokenizer, model_config: Any, scheduler_config: SchedulerConfig, max_model_len: int
    ) -> None:  # model_config: an HF-style config (vocab_size, eos_token_id)
        self.tokenizer = tokenizer
        self.vocab_size = model_config.vocab_size
        self.eos_token_id = model_config.eos_token_id
        self.sc = scheduler_config
        self.max_model_len = max_model_len

    def process(
        self, request_id: str, prompt: Prompt, params: SamplingParams | None, arrival_time: float | None, priority: int
    ) -> tuple[Request, str | None]:
        """(the Request, the prompt text or None for token ids); ValueError naming the field if anything is bad."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        params = self.check_params(params)
        salt = None
        if isinstance(prompt, dict) and "cache_salt" in prompt:
            prompt = dict(prompt)
            salt = prompt.pop("cache_salt")
            if not isinstance(salt, str) or not salt:  # vLLM's words for it
                raise ValueError(f"cache_salt must be a non-empty string if provided, got {salt!r}")
        text, token_ids = self.tokenize(prompt)
        self.check_prompt(token_ids, params)
        req = Request(
            request_id,
            token_ids,
            params,
            priority=priority,
            arrival_time=arrival_time,
            eos_token_id=self.eos_token_id,
            cache_salt=salt,
        )
        return req, text

    def check_params(self, params: SamplingParams | None) -> SamplingParams:
        if params is None:
            return SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        params = dataclasses.replace(params)  # a private copy, checked again by __post_init__
        bad = [t for t in params.stop_token_ids or () if t >= self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids holds token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        if params.stop and isinstance(self.tokenizer, NoTokenizer):
            raise ValueError("stop strings need a tokenizer, and this model has none: use stop_token_ids")
        if params.top_k >= self.vocab_size:
            params.top_k = 0  # keeps every token: the same as disabled (vLLM's rule), and fits any int tensor
        return params

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            prompt = self._from_dict(prompt)
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            try:
                return prompt, list(self.tokenizer.encode(prompt))
            except Exception as exc:  # e.g. a lone surrogate that UTF-8 cannot encode, or a model with no tokenizer
                raise ValueError(f"prompt could not be tokenized: {exc}") from exc
        if not isinstance(prompt, (list, tuple)) or not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt
        ):
            raise ValueError(f"prompt must be a string or a list of token ids (ints), got {type(prompt).__name__}")
        return None, [int(t) for t in prompt]

    @staticmethod
    def _from_dict(prompt: dict[str, Any]) -> Any:
        keys = set(prompt)
        if keys == {"prompt"}:
            return prompt["prompt"]
        if keys == {"prompt_token_ids"}:
            ids = prompt["prompt_token_ids"]
            if isinstance(ids, str):
                raise ValueError("prompt_token_ids must be a list of token ids, got a string")
            return ids
        raise ValueError(
            "a prompt dict takes exactly one of 'prompt' or 'prompt_token_ids' (and optionally 'cache_salt'), got "
            f"keys {sorted(keys)}"
        )

    def check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        vocab, sc = self.vocab_size, self.sc
        if not ids:
            raise ValueError("prompt_token_ids must not be empty")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_token_ids holds token id {bad[0]} outside the vocabulary [0, {vocab})")
        check_request_fits(
            len(ids),
            params.max_tokens,
            max_model_len=self.max_model_len,
            block_size=sc.block_size,
            num_gpu_blocks=sc.num_gpu_blocks,
            enable_chunked_prefill=sc.enable_chunked_prefill,
            max_num_batched_tokens=sc.max_num_batched_tokens,
        )
