"""LLM: the offline entry point. generate() queues every prompt, steps the engine to completion and returns one
whole RequestOutput per prompt, in order."""
from __future__ import annotations

from refengine.engine import LLMEngine
from refengine.outputs import CompletionOutput, RequestOutput
from refengine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str = "tiny-qwen2", **kwargs) -> None:
        self.llm_engine = LLMEngine(model, **kwargs)
        self._counter = 0

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts")
        engine = self.llm_engine
        ids = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            rid = f"llm-{self._counter}"
            self._counter += 1
            engine.add_request(rid, prompt, sp, priority=priority[i] if priority else 0)
            ids.append(rid)
        merged: dict[str, RequestOutput] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                delta = out.outputs[0]
                prev = merged.setdefault(
                    out.request_id,
                    RequestOutput(out.request_id, out.prompt, out.prompt_token_ids, [CompletionOutput(0, "", [])], False),
                )
                whole = prev.outputs[0]
                whole.text += delta.text
                whole.token_ids.extend(delta.token_ids)
                whole.finish_reason, whole.stop_reason, whole.error = delta.finish_reason, delta.stop_reason, delta.error
                prev.finished, prev.metrics = out.finished, out.metrics
        return [merged[rid] for rid in ids]
