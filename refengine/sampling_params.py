"""SamplingParams: how one request samples and when it stops (vLLM's field names and defaults).

Every field is checked in __post_init__ (ValueError naming it), so that nothing accepted here can fail later inside
a step. What depends on the model (stop_token_ids inside the vocabulary, top_k beyond it) is checked, and the
params copied, by LLMEngine.add_request.

Numbers are refused when the sampler cannot represent them, so that no accepted value can fail a batched step: the
float fields (temperature, top_p, min_p, the penalties) must be finite and, once rounded to the sampler's float32,
still in range (at most FLOAT32_MAX, and a field that must be > 0 must not round to 0); the int fields (max_tokens,
min_tokens, seed, each stop_token_ids entry) must fit in int64. top_k may be any size, as in vLLM: add_request
turns one at or above the vocabulary size into 0 (disabled), which is what it means. A max_tokens (or min_tokens)
beyond the model's context is accepted, as in vLLM's LLMEngine: the request ends with finish_reason "length" when
it reaches max_model_len, whatever it asked for. (vLLM's OpenAI server instead refuses a prompt + max_tokens above
max_model_len; that is the server's check, not this one's.)

vLLM's other SamplingParams fields (logprobs, logit_bias, bad_words, ...) are accepted as keywords so that vLLM
code runs unchanged; at their defaults they mean nothing, any other value is a ValueError "<field> is not supported
by refengine" rather than being silently ignored. A keyword neither refengine nor vLLM knows is a ValueError too.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from refengine.checks import INT64_MAX, INT64_MIN, check_bool, check_int, check_real

_GREEDY_EPS = 1e-5  # temperatures below this are treated as greedy, as vLLM does
PENALTY_LIMIT = 2.0  # presence / frequency penalties lie in [-2, 2] (OpenAI's and vLLM's range)
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the sampler's dtype: a larger value overflows its tensors
# Stop lists are bounded so that one request's list cannot slow the steps of everyone batched with it (the engine's
# host work is serial): the stop check costs O(new characters x distinct stop lengths) per request and step (see
# refengine/engine/detokenizer.py), the stop-id check O(1), and a request still short of min_tokens masks its stop ids in
# the sampler every step. vLLM sets no limits; these are far above what clients send (OpenAI's API allows 4 stops).
MAX_STOP_STRINGS = 128  # entries of `stop`
MAX_STOP_STRING_CHARS = 128  # characters of each stop string (also what a stream holds back while it runs)
MAX_STOP_TOKEN_IDS = 1024  # entries of `stop_token_ids`


def _sampler_real(
    name: str, value: object, minimum: float, maximum: float = FLOAT32_MAX, *, min_open: bool = False
) -> float:
    """check_real, and the value must keep its range once the sampler rounds it to float32."""
    value = check_real(name, value, minimum, maximum, min_open=min_open)
    if min_open and float(np.float32(value)) <= minimum:
        raise ValueError(
            f"{name} must be > {minimum} in float32 (the sampler's dtype), got {value!r}, which rounds to {minimum}"
        )
    return value


class RequestOutputKind(enum.Enum):
    """vLLM's enum: what LLMEngine.step() returns for a request. DELTA: the tokens and text new since its last
    output (refengine's default: incremental outputs); CUMULATIVE: everything so far (vLLM's default);
    FINAL_ONLY: nothing until it finishes, then the whole completion (what LLM.generate uses)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _unsupported(default: Any = None) -> Any:  # Any: the field takes its annotation's type
    return field(default=default, repr=False, metadata={"unsupported": True})


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled; a value >= the vocabulary size acts as disabled (as in vLLM)
    seed: int | None = None  # any 64-bit signed integer (what the OpenAI API and torch's generators take); -1: None
    stop: str | list[str] | None = None  # one string or a list of them; stored as a list
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    n: int = 1  # completions per prompt; only 1 is supported (accepted so that vLLM-style calls work)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    # penalties (vLLM's apply_penalties; applied before temperature, to greedy rows too)
    presence_penalty: float = 0.0  # subtracted once from every token the output holds
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # tokens seen in prompt or output: logit / rp if > 0, else logit * rp
    min_p: float = 0.0  # drop tokens whose probability is below min_p * the top token's (after temperature)
    # vLLM-only fields: accepted at their defaults (see the module docstring)
    best_of: int | None = _unsupported()
    logprobs: int | None = _unsupported()
    prompt_logprobs: int | None = _unsupported()
    prompt_logprob_token_ids: list[int] | None = _unsupported()
    prompt_logprob_start: int | None = _unsupported()
    logprob_token_ids: list[int] | None = _unsupported()
    flat_logprobs: bool = _unsupported(False)
    detokenize: bool = _unsupported(True)
    skip_special_tokens: bool = _unsupported(True)
    spaces_between_special_tokens: bool = _unsupported(True)
    output_kind: RequestOutputKind | None = None  # None: DELTA, the engine's incremental outputs (see the enum)
    stream_interval: int | None = _unsupported()
    structured_outputs: object | None = _unsupported()
    guided_decoding: object | None = _unsupported()
    logit_bias: dict[int, float] | None = _unsupported()
    allowed_token_ids: list[int] | None = _unsupported()
    bad_words: list[str] | None = _unsupported()
    logits_processors: list[Any] | None = _unsupported()
    truncate_prompt_tokens: int | None = _unsupported()
    thinking_token_budget: int | None = _unsupported()
    repetition_detection: object | None = _unsupported()
    skip_reading_prefix_cache: bool | None = _unsupported()
    routed_experts_prompt_start: int = _unsupported(0)
    trace_decode_token_ids: list[int] | None = _unsupported()
    # no effect on the tokens in vLLM either (plugin arguments; a cloning hint): any value is accepted
    extra_args: dict[str, Any] | None = field(default=None, repr=False)
    skip_clone: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.max_tokens = check_int("max_tokens", self.max_tokens, 1, INT64_MAX)
        self.min_tokens = check_int("min_tokens", self.min_tokens, 0, INT64_MAX)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        self.temperature = _sampler_real("temperature", self.temperature, 0.0)
        self.top_p = _sampler_real("top_p", self.top_p, 0.0, 1.0, min_open=True)
        self.top_k = check_int("top_k", self.top_k, -1)  # any size: add_request turns >= vocabulary into 0
        if self.seed is not None:
            self.seed = check_int("seed", self.seed, INT64_MIN, INT64_MAX)
            if self.seed == -1:  # vLLM's (and its server's) spelling of "no seed"
                self.seed = None
        self.stop = self._stop_list(self.stop)
        self.stop_token_ids = self._token_id_list(self.stop_token_ids)
        self.ignore_eos = check_bool("ignore_eos", self.ignore_eos)
        self.include_stop_str_in_output = check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        if check_int("n", self.n) != 1:
            raise ValueError(f"n must be 1 (refengine returns one completion per prompt), got {self.n!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a dict, got {self.extra!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, _sampler_real(name, getattr(self, name), -PENALTY_LIMIT, PENALTY_LIMIT))
        self.repetition_penalty = _sampler_real("repetition_penalty", self.repetition_penalty, 0.0, min_open=True)
        self.min_p = _sampler_real("min_p", self.min_p, 0.0, 1.0)
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args must be a dict or None, got {self.extra_args!r}")
        self.skip_clone = check_bool("skip_clone", self.skip_clone)
        if self.output_kind is not None and not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(
                f"output_kind must be a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY) or None, "
                f"got {self.output_kind!r}"
            )
        for f in _UNSUPPORTED:
            if not _at_default(f.name, getattr(self, f.name), f.default):
                raise ValueError(
                    f"{f.name} is not supported by refengine (only its default, {f.default!r}), "
                    f"got {getattr(self, f.name)!r}"
                )

    @staticmethod
    def _stop_list(stop: object) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a non-empty string or a list of non-empty strings, got {stop!r:.200}")
        if len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop holds {len(stop)} strings; at most {MAX_STOP_STRINGS} (MAX_STOP_STRINGS)")
        longest = max(map(len, stop), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise ValueError(
                f"stop holds a string of {longest} characters; at most {MAX_STOP_STRING_CHARS} (MAX_STOP_STRING_CHARS)"
            )
        return list(stop)

    @staticmethod
    def _token_id_list(ids: object) -> list[int]:
        if ids is None:
            return []
        if not isinstance(ids, (list, tuple, set, frozenset)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {ids!r:.200}")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids holds {len(ids)} ids; at most {MAX_STOP_TOKEN_IDS} (MAX_STOP_TOKEN_IDS)")
        try:
            return [check_int("stop_token_ids", t, 0, INT64_MAX) for t in ids]
        except ValueError:
            raise ValueError(f"stop_token_ids must be a list of non-negative integers, got {ids!r}") from None

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's method), checked again."""
        return dataclasses.replace(self, **{f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)})

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


_UNSUPPORTED = tuple(f for f in fields(SamplingParams) if f.metadata.get("unsupported"))
_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))
# values vLLM treats exactly as the default: best_of=1 is n, an empty list or dict restricts nothing,
# thinking_token_budget=-1 is unlimited
_SAME_AS_DEFAULT = {"best_of": (1,), "thinking_token_budget": (-1,)}


def _at_default(name: str, value: object, default: object) -> bool:
    if default is None:
        return (
            value is None
            or value in _SAME_AS_DEFAULT.get(name, ())
            or (isinstance(value, (list, tuple, dict)) and not value and name != "allowed_token_ids")
        )
    return type(value) is type(default) and value == default


# The dataclass's own __init__ raises TypeError for a keyword it does not know; vLLM users get a ValueError naming
# it, as for every other bad input. (dataclasses.replace and copies go through the same __init__.)
_dataclass_init = SamplingParams.__init__


@functools.wraps(_dataclass_init)
def _init(self: SamplingParams, *args: Any, **kwargs: Any) -> None:
    unknown = sorted(set(kwargs) - _FIELD_NAMES)
    if unknown:
        raise ValueError(f"{unknown[0]} is not a SamplingParams field (neither refengine nor vLLM has it)")
    if len(args) > len(_FIELD_NAMES):
        raise ValueError(f"SamplingParams takes at most {len(_FIELD_NAMES)} positional arguments, got {len(args)}")
    _dataclass_init(self, *args, **kwargs)


# mypy forbids assigning to a method; this wrapper keeps the dataclass __init__'s signature (functools.wraps)
SamplingParams.__init__ = _init  # type: ignore[method-assign]
