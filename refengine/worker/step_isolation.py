"""Failure isolation inside one batched step: what the model runner does when a request's own values make its row
fail, so that the failure costs that request alone and not every request batched with it.

SamplingParams refuses every value known to break the sampler; this is for a value nothing checked for. Two
places read a request's values on their own: writing its row of the input batch, and the batched sampler.
  - A row that cannot be written is written with greedy defaults instead, so that the step runs as scheduled;
    the request is reported failed (its token is discarded and the engine aborts it).
  - When the batched sample() raises, every row is sampled again alone, once, on freshly computed logits (the
    failed call may have changed them in place): the rows that fail alone are the failing requests; the others
    keep the token they drew alone. Greedy and seeded rows draw the same token alone as in the batch.
A failure that no single row reproduces (the forward itself, or all rows failing) still aborts the whole step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from refengine.sample.sampler import SamplingMetadata
from refengine.sampling_params import SamplingParams
from refengine.worker.input_batch import InputBatch

_SAFE_PARAMS = SamplingParams(temperature=0.0)  # a failed row is written greedy: its token is discarded anyway


def add_row_isolated(
    batch: InputBatch,
    failed: dict[str, BaseException],
    request_id: str,
    token_ids: list[int],
    num_prompt_tokens: int,
    block_ids: list[int],
    num_computed_tokens: int,
    params: SamplingParams,
    eos_token_ids: frozenset[int],
) -> None:
    """InputBatch.add_request; if the request's values make it raise, the row gets greedy defaults and the error
    goes to `failed` (request id -> exception)."""
    try:
        batch.add_request(
            request_id, token_ids, num_prompt_tokens, block_ids, num_computed_tokens, params, eos_token_ids
        )
    except Exception as exc:  # noqa: BLE001 (any value-dependent failure: this request alone fails)
        failed[request_id] = exc
        batch.add_request(
            request_id, token_ids, num_prompt_tokens, block_ids, num_computed_tokens, _SAFE_PARAMS, frozenset()
        )


def _position(index: torch.Tensor | None, i: int) -> int | None:
    """Where row i sits in an index tensor of rows (None: absent). Reads the device: failure path only."""
    if index is None:
        return None
    hits = (index == i).nonzero()
    return int(hits[0, 0]) if len(hits) else None


def row_metadata(md: SamplingMetadata, i: int) -> SamplingMetadata:
    """The metadata of row i of `md` alone, as a one-row batch."""
    one = SamplingMetadata(all_greedy=True)
    if md.banned_rows is not None:
        assert md.banned_tokens is not None, "set with banned_rows"
        mine = md.banned_rows == i
        if bool(mine.any()):
            one.banned_tokens = md.banned_tokens[mine]
            one.banned_rows = torch.zeros_like(one.banned_tokens)
    penalty_idx = md.penalty_idx
    q = _position(penalty_idx, i)
    if penalty_idx is not None and q is not None:
        one.penalty_idx = torch.zeros(1, dtype=penalty_idx.dtype, device=penalty_idx.device)
        for name in ("prompt_mask", "output_counts", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            setattr(one, name, getattr(md, name)[q : q + 1])
    if md.all_greedy:
        return one
    j = i if md.random_idx is None else _position(md.random_idx, i)  # its place among the random rows
    if j is None:
        return one
    assert md.temperature is not None, "a batch that is not all greedy has its temperatures"
    one.all_greedy = False
    one.temperature = md.temperature[j : j + 1]
    for name in ("top_k", "top_p", "min_p"):
        value = getattr(md, name)
        setattr(one, name, None if value is None else value[j : j + 1])
    seeded_idx = md.seeded_idx
    s = _position(seeded_idx, j)
    one.any_unseeded = s is None
    if seeded_idx is not None and s is not None:
        assert md.seeds is not None and md.output_index is not None, "set with seeded_idx"
        one.seeded_idx = torch.zeros(1, dtype=seeded_idx.dtype, device=seeded_idx.device)
        one.seeds, one.output_index = md.seeds[s : s + 1], md.output_index[s : s + 1]
    return one


def sample_rows_apart(
    sample: Callable[[torch.Tensor, SamplingMetadata, torch.Generator | None], torch.Tensor],
    logits: torch.Tensor,
    md: SamplingMetadata,
    generator: torch.Generator | None,
) -> tuple[list[int], dict[int, BaseException]]:
    """The batched sample() failed: sample each row alone. Returns a token per row (0 for a failed row, whose
    token is discarded) and {row index: exception} for the rows that failed alone. Raises if every one of several
    rows fails: then nothing tells the failing request from the others."""
    tokens: list[int] = []
    failed: dict[int, BaseException] = {}
    for i in range(logits.shape[0]):
        try:
            tokens.append(int(sample(logits[i : i + 1], row_metadata(md, i), generator)[0]))
        except Exception as exc:  # noqa: BLE001
            tokens.append(0)
            failed[i] = exc
    if len(tokens) > 1 and len(failed) == len(tokens):
        raise next(iter(failed.values()))
    return tokens, failed
