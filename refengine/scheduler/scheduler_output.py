"""The scheduler -> model runner contract, as vLLM V1 has it (vllm/v1/core/sched/output.py, vllm/v1/outputs.py).

The runner never sees a live Request or the KV manager: a request is described once in full when the runner first
meets it (`NewRequestData`), and afterwards only by what changed (`CachedRequestData`: the blocks it gained, its
computed-token count, whether it is resumed after a preemption). The runner answers with a `ModelRunnerOutput`.

`RunnerView` is the scheduler's record of what it has told the runner; it turns one step's scheduling decisions
into that description, whatever the batching mode (a static-batch member admitted before its first chunk is
simply "new" at the step that first schedules it). Only `Scheduler.schedule()` makes a `SchedulerOutput`, in one
call at its end; nothing changes it afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from refengine.request import Request
from refengine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from refengine.kv_cache.kv_cache_manager import KVCacheManager


@dataclass
class NewRequestData:
    """A request the runner has not met before (or has forgotten): everything it needs to hold its row."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]  # one KV cache group, so a flat list (vLLM: one list per group)
    num_computed_tokens: int  # before this step's tokens: the prefix-cache hit of a first admission
    eos_token_ids: frozenset[int] = frozenset()  # (vLLM keeps these inside SamplingParams)
    # prompt + already generated tokens, when the request has generated some (vLLM's v2 runner field); else None
    prefill_token_ids: list[int] | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prefill_token_ids if self.prefill_token_ids is not None else self.prompt_token_ids

    @classmethod
    def from_request(cls, request: Request, block_ids: list[int]) -> NewRequestData:
        return cls(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            eos_token_ids=request.eos_token_ids,
            prefill_token_ids=list(request.all_token_ids) if request.output_token_ids else None,
        )


@dataclass
class CachedRequestData:
    """Requests the runner already holds, as parallel lists (vLLM's layout)."""

    req_ids: list[str] = field(default_factory=list)
    # for ids in resumed_req_ids, new_block_ids replaces the request's block ids; for the others it is appended
    resumed_req_ids: set[str] = field(default_factory=set)
    # every token of the requests that were not scheduled in the previous step (the runner resyncs its row)
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)
    new_block_ids: list[list[int] | None] = field(default_factory=list)  # None: no new blocks
    num_computed_tokens: list[int] = field(default_factory=list)  # before this step's tokens


@dataclass(kw_only=True)
class SchedulerOutput:
    """One step: who runs how many tokens, and what the runner must learn or forget first.

    Every field is required and named: `Scheduler._make_output`, the one builder, says each one, so a field it
    forgets (or one added here and not there) is a TypeError on the first schedule(), never an empty default that
    the runner would read as "nothing to do"."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # in scheduling order
    total_num_scheduled_tokens: int
    is_prefill: dict[str, bool]  # per scheduled request: prefill chunk or decode
    preempted_req_ids: list[str]  # in preemption order
    finished_req_ids: set[str]  # finished or aborted since the previous schedule()
    blocks_to_swap_out: list[tuple[int, int]]  # (device block, host block)
    blocks_to_swap_in: list[tuple[int, int]]  # (host block, device block)
    num_prefill_tokens: int
    num_decode_tokens: int


@dataclass
class ModelRunnerOutput:
    """What one execute_model() produced: per scheduled request (in scheduling order) its sampled token ids, [] for
    a partial prefill, whose sample is discarded."""

    req_ids: list[str] = field(default_factory=list)
    req_id_to_index: dict[str, int] = field(default_factory=dict)
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    # requests whose own values failed their row or the sampler (refengine/worker/step_isolation.py): no token; the engine
    # aborts them alone
    failed: dict[str, BaseException] = field(default_factory=dict)
    # whether the forward replayed a CUDA graph (refengine/worker/cuda_graphs.py); None: no forward ran on a device
    # (a simulated GPU's runner, or a step with nothing scheduled)
    cuda_graph: bool | None = None

    def by_request(self) -> dict[str, list[int]]:
        """{request_id: sampled ids} for Scheduler.update_from_output; requests that sampled
        nothing are left out."""
        return {rid: toks for rid, toks in zip(self.req_ids, self.sampled_token_ids) if toks}


class RunnerView:
    """What the scheduler has told the runner, per request: how many block ids it sent and how many preemptions the
    request had then (a later preemption means the runner's copy must be resumed, blocks replaced)."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[int, int]] = {}
        self._prev_scheduled: set[str] = set()

    def describe(
        self,
        num_scheduled_tokens: dict[str, int],
        finished_req_ids: set[str],
        requests: dict[str, Request],
        kv_cache_manager: KVCacheManager,
    ) -> tuple[list[NewRequestData], CachedRequestData]:
        """The step's scheduled requests as the runner must learn them: new ones in full, the others by what
        changed, the block ids as the KV cache manager hands them out (vLLM's get_block_ids). Call after the
        step's decisions, before num_computed_tokens advances; records what was told."""
        for rid in finished_req_ids:
            self._sent.pop(rid, None)
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        sent, prev = self._sent, self._prev_scheduled
        # (this loop runs for every scheduled request every step: locals instead of attribute lookups)
        req_ids, new_block_ids, num_computed = cached.req_ids, cached.new_block_ids, cached.num_computed_tokens
        num_blocks_of, block_ids_of = kv_cache_manager.get_num_blocks, kv_cache_manager.get_block_ids
        for rid in num_scheduled_tokens:
            req = requests[rid]
            known = sent.get(rid)
            num_blocks, preemptions = num_blocks_of(rid), req.num_preemptions
            if known is None:
                new_reqs.append(NewRequestData.from_request(req, block_ids_of(rid)))
            else:
                have = known[0]
                req_ids.append(rid)
                if known[1] != preemptions:
                    cached.resumed_req_ids.add(rid)
                    have = 0
                if rid not in prev:
                    cached.all_token_ids[rid] = list(req.all_token_ids)
                new_block_ids.append(block_ids_of(rid, have) if num_blocks > have else None)
                num_computed.append(req.num_computed_tokens)
                if num_blocks == have and known[1] == preemptions:
                    continue  # nothing to record anew (the common decode step)
            sent[rid] = (num_blocks, preemptions)
        self._prev_scheduled = set(num_scheduled_tokens)
        return new_reqs, cached
