"""FakeRunner: stands in for the model in scheduler-only tests. After a schedule() it samples one token for exactly
the requests whose prompt (plus generated tokens) is now wholly computed, as a model runner would; partial prefills
get []. Under async scheduling the token sampled is the request's output #(known + in flight + 1). EOS comes at random with a given probability, masked (with the stop token ids) until min_tokens, as the
sampler does; otherwise a random token, now and then one of the request's stop token ids.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from conformance.adapters import ReqView, StepView

EOS_TOKEN_ID = 0
VOCAB = range(1, 50)  # small, so that stop token ids and repeated prefixes actually occur


@dataclass
class RequestSpec:
    """What the test asked for, kept beside the engine so that the checks never trust the engine's own record."""

    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    priority: int = 0
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)  # what the runner sampled for it (and was delivered)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def expected_finish(self) -> str | None:
        """vLLM's check_stop order: EOS and stop ids (once min_tokens are out), then the length limit."""
        n = len(self.output_token_ids)
        if n and n >= self.min_tokens:
            last = self.output_token_ids[-1]
            if (last == EOS_TOKEN_ID and not self.ignore_eos) or last in self.stop_token_ids:
                return "stop"
        return "length" if n >= self.max_tokens else None


class FakeRunner:
    def __init__(self, rng: random.Random, eos_prob: float, stop_prob: float = 0.1) -> None:
        self.rng = rng
        self.eos_prob = eos_prob
        self.stop_prob = stop_prob

    def sample_one(self, spec: RequestSpec, index: int) -> int:
        may_stop = index + 1 > spec.min_tokens  # the token being sampled is output #index+1
        if may_stop and self.rng.random() < self.eos_prob:
            return EOS_TOKEN_ID
        if may_stop and spec.stop_token_ids and self.rng.random() < self.stop_prob:
            return self.rng.choice(spec.stop_token_ids)
        banned = set() if may_stop else {EOS_TOKEN_ID, *spec.stop_token_ids}
        while True:
            tok = self.rng.choice(VOCAB)
            if tok not in banned:
                return tok

    def sample(self, step: StepView, after: dict[str, ReqView], specs: dict[str, RequestSpec]) -> dict[str, list[int]]:
        """`after`: views right after schedule(). Returns {request_id: [token] or []} for every scheduled request."""
        out: dict[str, list[int]] = {}
        for rid in step.num_scheduled_tokens:
            v = after[rid]
            out[rid] = [self.sample_one(specs[rid], v.sample_index)] if v.samples_now() else []
        return out
