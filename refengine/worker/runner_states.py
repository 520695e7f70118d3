"""What the model runner keeps of each request between steps (CachedRequestState, vLLM's name) and how one
SchedulerOutput updates it and the InputBatch's rows before the step runs (`update_states`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from refengine.sampling_params import SamplingParams
from refengine.scheduler.scheduler_output import CachedRequestData, SchedulerOutput
from refengine.worker.input_batch import InputBatch
from refengine.worker.step_isolation import add_row_isolated


@dataclass
class CachedRequestState:
    """What the runner keeps of a request between its steps, including while it is preempted (vLLM's name)."""

    req_id: str
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    parked_token_ids: list[int] | None = None  # the row's tokens while preempted (the row itself is freed)


def update_states(
    batch: InputBatch,
    requests: dict[str, CachedRequestState],
    failed_rows: dict[str, BaseException],
    out: SchedulerOutput,
) -> None:
    """Apply one SchedulerOutput to the runner's rows and records before its step: forget finished requests, park
    preempted ones, admit new ones, place resumed ones, append blocks and resynchronise tokens (a request whose
    own values fail its row lands in `failed_rows`)."""
    for rid in out.finished_req_ids:
        batch.remove(rid)
        requests.pop(rid, None)
    for rid in out.preempted_req_ids:
        state = requests.get(rid)
        if state is not None and rid in batch:
            state.parked_token_ids = batch.token_ids_of(rid)
            batch.remove(rid)
    for new in out.scheduled_new_reqs:
        tokens = new.all_token_ids
        state = requests[new.req_id] = CachedRequestState(
            new.req_id, len(new.prompt_token_ids), new.sampling_params, new.eos_token_ids
        )
        add_row_isolated(
            batch,
            failed_rows,
            new.req_id,
            tokens,
            state.num_prompt_tokens,
            new.block_ids,
            new.num_computed_tokens,
            state.sampling_params,
            state.eos_token_ids,
        )
    cached = out.scheduled_cached_reqs
    if not cached.req_ids:
        return
    row_of, resumed, all_tokens = batch.row_of, cached.resumed_req_ids, cached.all_token_ids
    if not resumed and row_of.keys() >= set(cached.req_ids):  # (the common step: every row is in place)
        for i in itertools.compress(range(len(cached.req_ids)), cached.new_block_ids):  # (those with new blocks)
            batch.append_blocks(cached.req_ids[i], cached.new_block_ids[i] or [])  # (never None: compress)
    else:
        _place_rows(batch, requests, failed_rows, cached)
    for rid, tokens in all_tokens.items():
        if rid not in resumed:
            batch.set_token_ids(rid, tokens)
    batch.num_computed_tokens[batch.rows_of(cached.req_ids)] = cached.num_computed_tokens


def _place_rows(
    batch: InputBatch,
    requests: dict[str, CachedRequestState],
    failed_rows: dict[str, BaseException],
    cached: CachedRequestData,
) -> None:
    """Write the rows of resumed requests (and of any the batch lacks), append the others' new blocks."""
    row_of, resumed, all_tokens = batch.row_of, cached.resumed_req_ids, cached.all_token_ids
    for i, (rid, blocks) in enumerate(zip(cached.req_ids, cached.new_block_ids)):
        if rid in resumed or rid not in row_of:
            state = requests[rid]
            tokens = all_tokens.get(rid) or state.parked_token_ids or batch.token_ids_of(rid)
            state.parked_token_ids = None
            add_row_isolated(
                batch,
                failed_rows,
                rid,
                tokens,
                state.num_prompt_tokens,
                blocks or [],
                cached.num_computed_tokens[i],
                state.sampling_params,
                state.eos_token_ids,
            )
        elif blocks:
            batch.append_blocks(rid, blocks)
