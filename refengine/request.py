"""Request and RequestStatus: one generation request as the scheduler and engine see it."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence

from refengine.checks import INT64_MAX, INT64_MIN, check_int, check_real
from refengine.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # everything after PREEMPTED is a finished state
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def finish_reason(status: RequestStatus) -> str | None:
        return _FINISH_REASON.get(status)


_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """Token state of one request. `num_computed_tokens` counts tokens whose KV is (or, after this step's
    forward, will be) in the cache; it advances in `Scheduler.schedule()`, as in vLLM."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        eos_token_id: int | list[int] | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        # vLLM's cache_salt: mixed into the first KV block's hash, so that only requests of the same salt share
        # prefixes (refengine/kv_cache/block_pool.py's hash_block_tokens)
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"cache_salt must be a non-empty string if given, got {cache_salt!r}")
        self.cache_salt = cache_salt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.stop_token_ids = frozenset(
            self.sampling_params.stop_token_ids or ()
        )  # (a list after SamplingParams checks it) O(1) per sampled token
        # checked here, so that a bad value never reaches the waiting queue's sort keys
        self.priority = check_int("priority", priority, INT64_MIN, INT64_MAX)
        self.arrival_time = time.monotonic() if arrival_time is None else check_real("arrival_time", arrival_time)
        if eos_token_id is None:
            self.eos_token_ids: frozenset[int] = frozenset()
        elif isinstance(eos_token_id, int):
            self.eos_token_ids = frozenset([eos_token_id])
        else:
            self.eos_token_ids = frozenset(eos_token_id)

        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_tokens = len(self.all_token_ids)  # prompt + output; kept in step (read several times per step)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # tokens prefilled again after a recompute preemption
        self.num_lost_tokens = 0  # computed tokens whose KV the last recompute preemption dropped
        # async scheduling (vLLM's names): tokens sampled by steps still in flight, counted in num_computed_tokens
        # but not yet in output_token_ids; tokens scheduled in steps whose output has not come back; of those, the
        # tokens of steps from before the last preemption, whose output is still appended when it comes back
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        # sync scheduling, driven with two steps outstanding: whether the step in flight when the request was
        # preempted samples a token (it reached the last known token), which is then still appended, as in vLLM
        self.stale_output_samples = False
        self.num_cached_tokens = -1  # prefix-cache hit at first admission (-1: not admitted yet)
        self.stop_reason: int | str | None = None
        self.error: str | None = None  # set when the engine aborts the request because handling it failed
        # timestamps (time.monotonic()) for TTFT / TPOT / ITL
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.token_times: list[float] = []
        self.finish_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_tokens(self) -> int:
        return self.sampling_params.max_tokens

    def append_output_token_ids(self, token_ids: Sequence[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
        self.num_tokens = len(self.all_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.finish_reason(self.status)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, prio={self.priority})"
        )
