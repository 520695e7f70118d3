"""SamplingParams: how one request samples and when it stops (vLLM's field names and defaults).

Every field is checked in __post_init__ (ValueError naming it), so that nothing accepted here can fail later inside
a step. What depends on the model (stop_token_ids inside the vocabulary, top_k beyond it) is checked, and the
params copied, by LLMEngine.add_request.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from refengine.checks import INT64_MAX, INT64_MIN, check_bool, check_int, check_real

_GREEDY_EPS = 1e-5  # temperatures below this are treated as greedy, as vLLM does


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled; a value >= the vocabulary size acts as disabled (as in vLLM)
    seed: int | None = None  # any 64-bit signed integer (what the OpenAI API and torch's generators take)
    stop: str | list[str] | None = None  # one string or a list of them; stored as a list
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    n: int = 1  # completions per prompt; only 1 is supported (accepted so that vLLM-style calls work)
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.max_tokens = check_int("max_tokens", self.max_tokens, 1)
        self.min_tokens = check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        self.temperature = check_real("temperature", self.temperature, 0.0)
        self.top_p = check_real("top_p", self.top_p, 0.0, 1.0, min_open=True)
        self.top_k = check_int("top_k", self.top_k, -1)
        if self.seed is not None:
            self.seed = check_int("seed", self.seed, INT64_MIN, INT64_MAX)
        self.stop = self._stop_list(self.stop)
        self.stop_token_ids = self._token_id_list(self.stop_token_ids)
        self.ignore_eos = check_bool("ignore_eos", self.ignore_eos)
        self.include_stop_str_in_output = check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        if check_int("n", self.n) != 1:
            raise ValueError(f"n must be 1 (refengine returns one completion per prompt), got {self.n!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a dict, got {self.extra!r}")

    @staticmethod
    def _stop_list(stop: object) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a non-empty string or a list of non-empty strings, got {stop!r}")
        return list(stop)

    @staticmethod
    def _token_id_list(ids: object) -> list[int]:
        if ids is None:
            return []
        if not isinstance(ids, (list, tuple, set, frozenset)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {ids!r}")
        try:
            return [check_int("stop_token_ids", t, 0, INT64_MAX) for t in ids]
        except ValueError:
            raise ValueError(f"stop_token_ids must be a list of non-negative integers, got {ids!r}") from None

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS
