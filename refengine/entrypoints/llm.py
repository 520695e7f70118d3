"""LLM: the offline entry point. generate() queues every prompt, steps the engine to completion and returns one
whole RequestOutput per prompt, in order. `with LLM(...) as llm:` shuts the engine down at the end of the block,
and its device memory goes back then (KV caches, CUDA graphs, the weights, the allocator's cache), as it does on
shutdown() or when the LLM is dropped (LLMEngine's lifetime): a second LLM in the same process finds the card free."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, NoReturn, cast

from refengine.engine.llm_engine import LLMEngine
from refengine.engine.processor import Prompt
from refengine.outputs import RequestOutput
from refengine.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    def __init__(self, model: str = "tiny-qwen2", **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(model, **kwargs)
        self._counter = 0

    def get_tokenizer(self) -> Any:  # the engine's tokenizer (duck-typed, HF-style)
        return self.llm_engine.tokenizer

    def shutdown(self) -> None:
        """Stop the engine (LLMEngine.shutdown): its worker thread exits, its device memory goes back; later
        generate() calls raise."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    @staticmethod
    def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        """One prompt (text, token ids, or a vLLM prompt dict) or a list of them -> a list."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and not isinstance(prompts[0], (str, dict, list, tuple))
        ):
            # (a list of ints, or of something else that add_request will reject by name)
            return [cast(Prompt, prompts)]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(
                f"prompts must be a string, a list of token ids, or a list of those, got {type(prompts).__name__}"
            )
        return list(prompts)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        priority: list[int] | None = None,
        *,
        use_tqdm: bool = True,  # accepted as vLLM's generate takes it; refengine draws no progress bar
    ) -> list[RequestOutput]:
        """Generate for every prompt; bad input anywhere raises ValueError (naming the field and the prompt index)
        before anything is queued. The outputs are whole completions, in prompt order."""
        prompt_list = self._prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, (list, tuple)):
            params = list(sampling_params)
            if len(params) != len(prompt_list):
                raise ValueError(f"sampling_params has {len(params)} entries for {len(prompt_list)} prompts")
        else:
            params = [sampling_params] * len(prompt_list)
        if priority is not None and (not isinstance(priority, (list, tuple)) or len(priority) != len(prompt_list)):
            raise ValueError(
                f"priority must be a list with one entry per prompt ({len(prompt_list)}), got {priority!r}"
            )
        engine = self.llm_engine
        batch = []
        for i, (prompt, sp) in enumerate(zip(prompt_list, params)):
            try:  # as vLLM's LLM, only whole completions come back: a private copy of the params asks for those
                final_only = dataclasses.replace(sp, output_kind=RequestOutputKind.FINAL_ONLY)
            except (TypeError, ValueError) as e:  # (not a SamplingParams, or one mutated into a bad state)
                final_only = sp if isinstance(e, TypeError) else _raise_for_prompt(i, len(prompt_list), e)
            batch.append((f"llm-{self._counter + i}", prompt, final_only, None, priority[i] if priority else 0))
        try:
            ids = [req.request_id for req in engine.add_requests(batch)]  # all or nothing
        except ValueError as e:  # add_requests says "request i: ..."; the caller knows them as prompts
            raise ValueError(re.sub(r"^request (\d+): ", r"prompt \1: ", str(e))) from None
        self._counter += len(ids)
        final: dict[str, RequestOutput] = {}  # (FINAL_ONLY: one output per request, the whole completion)
        while engine.has_unfinished_requests():
            for out in engine.step():
                final[out.request_id] = out
        return [final[rid] for rid in ids]


def _raise_for_prompt(i: int, num_prompts: int, e: ValueError) -> NoReturn:
    raise ValueError(f"prompt {i}: {e}" if num_prompts > 1 else str(e)) from None
