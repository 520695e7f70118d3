"""The typed records a perf run produces: `RequestRecord` (one per request) and `StepRecord` (one per engine step).

Every backend returns these (refengine's own per-request dict and `StepStats` are converted at perf's boundary, in
backends/in_process.py); `metrics.py` computes from them and the results JSON stores `to_dict()`. Each source
observes a different set of fields (an HTTP client sees no scheduling, a peer no recompute), so a record carries
its `layout`: the keys, in order, that its JSON entry holds; fields outside it are None. Times are seconds on one
clock (`time.monotonic()` / `time.perf_counter()`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from cbbench.perf.json_values import JSONObject

# What every source records about a request (the Hugging Face peers record exactly these).
REQUEST_KEYS = (
    "request_id",
    "prompt_len",
    "output_len",
    "arrival_time",
    "first_scheduled_time",
    "first_token_time",
    "token_times",
    "finish_time",
    "num_preemptions",
    "num_cached_tokens",
    "finish_reason",
)
ENGINE_REQUEST_KEYS = (*REQUEST_KEYS[:9], "num_recomputed_tokens", *REQUEST_KEYS[9:], "error")
HTTP_REQUEST_KEYS = (
    "request_id",
    "prompt_len",
    "output_len",
    "requested_output_len",
    "output_len_source",
    "scheduled_time",
    "arrival_time",
    "first_scheduled_time",
    "first_token_time",
    "token_times",
    "chunk_times",
    "finish_time",
    "num_preemptions",
    "num_cached_tokens",
    "finish_reason",
    "error",
    "text",
)
HTTP_ERROR_KEYS = tuple(k for k in HTTP_REQUEST_KEYS if k not in ("output_len_source", "text"))

STEP_KEYS = (
    "time",
    "num_scheduled_tokens",
    "num_running",
    "num_waiting",
    "num_prefill_tokens",
    "num_decode_tokens",
    "kv_blocks_used",
)
ENGINE_STEP_KEYS = (
    *STEP_KEYS,
    "num_preempted",
    "slots_held",
    "scheduled_req_ids",
    "running_req_ids",
    "prefill_req_ids",
    "batch_id",
    "cuda_graph",
)
PEER_STEP_KEYS = (
    "time",
    "num_scheduled_tokens",
    "num_waiting",
    "num_running",
    "slots_held",
    "num_prefill_tokens",
    "num_decode_tokens",
    "kv_blocks_used",
)


@dataclass
class RequestRecord:
    """One request of a run. `token_times`: the time of each output token (len == output_len), or None where only
    streamed chunks are seen (`chunk_times`, an HTTP client: a chunk may carry several tokens)."""

    request_id: str
    prompt_len: int
    output_len: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    token_times: list[float] | None
    finish_time: float | None
    num_preemptions: int | None
    num_cached_tokens: int | None
    finish_reason: str | None
    num_recomputed_tokens: int | None = None  # refengine: tokens computed again after recompute preemptions
    error: str | None = None
    requested_output_len: int | None = None  # HTTP: max_tokens as sent (a server may stop earlier)
    output_len_source: str | None = None  # HTTP: "usage" | "token_ids" | "tokenizer" | "chunks"
    chunk_times: list[float] | None = None
    text: str | None = None
    # HTTP: when a perfect client would have sent the request: its arrival in the workload's schedule, or later
    # when it waited for a `--max-concurrency` slot (the moment the slot freed). arrival_time - scheduled_time is
    # the load generator's own lateness, its schedule delay (client_lag.py).
    scheduled_time: float | None = None
    conversation_id: int | None = None  # multi-turn: the conversation and the turn (0, 1, ...) of a request
    turn: int | None = None
    layout: tuple[str, ...] = field(default=REQUEST_KEYS, repr=False, compare=False)

    def to_dict(self) -> JSONObject:
        """The JSON entry: the keys of `layout`, in order."""
        return {k: getattr(self, k) for k in self.layout}

    @classmethod
    def from_dict(cls, d: Mapping[str, object], layout: tuple[str, ...] | None = None) -> RequestRecord:
        """A record from its JSON entry (or refengine's `request_metrics` dict); its keys become the layout unless
        `layout` is given (refengine's records keep perf's own, whatever the engine's dict holds besides)."""
        rec = _from_dict(cls, d, REQUEST_KEYS, f"record {d.get('request_id')!r}")
        return rec if layout is None else dataclasses.replace(rec, layout=layout)


@dataclass
class StepRecord:
    """One engine step. `slots_held`: static batching only (a batch holds all its slots until its last member
    finishes, while `num_running` counts the members scheduled in the step); the request ids let `cbbench report`
    draw the slot timeline from the JSON alone."""

    time: float
    num_scheduled_tokens: int
    num_running: int
    num_waiting: int
    num_prefill_tokens: int | None
    num_decode_tokens: int | None
    kv_blocks_used: int | None
    num_preempted: int | None = None
    slots_held: int | None = None
    scheduled_req_ids: list[str] | None = None
    running_req_ids: list[str] | None = None
    prefill_req_ids: list[str] | None = None
    batch_id: int | None = None
    cuda_graph: bool | None = None  # the forward replayed a CUDA graph; None: not known (a simulated GPU, a peer)
    layout: tuple[str, ...] = field(default=ENGINE_STEP_KEYS, repr=False, compare=False)

    def to_dict(self) -> JSONObject:
        return {k: getattr(self, k) for k in self.layout}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> StepRecord:
        return _from_dict(cls, d, (), "step")  # a field left out (a hand-made trace's) is None


_Record = TypeVar("_Record", RequestRecord, StepRecord)


def _from_dict(cls: type[_Record], d: Mapping[str, object], required: tuple[str, ...], what: str) -> _Record:
    names = {f.name for f in dataclasses.fields(cls)} - {"layout"}
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{what}: missing key {missing[0]!r}")
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ValueError(f"{what}: unknown key {unknown[0]!r}")
    bare = {f.name: None for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    make: Callable[..., _Record] = cls  # (by name: every key is a field, checked above; the values are the entry's)
    return make(**{**bare, **d}, layout=tuple(d))


def as_request_record(r: RequestRecord | Mapping[str, object]) -> RequestRecord:
    return r if isinstance(r, RequestRecord) else RequestRecord.from_dict(r)


def as_step_record(s: StepRecord | Mapping[str, object]) -> StepRecord:
    return s if isinstance(s, StepRecord) else StepRecord.from_dict(s)
