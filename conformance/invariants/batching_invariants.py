"""Invariants of what one step schedules: the token budget, max_num_seqs, decodes before prefills, admission
order, and who may share a step in the sequence and static batching modes."""

from __future__ import annotations

from conformance.adapters import ReqView, StepView
from conformance.invariants._base import Snapshot, _fail, _key, _max_seqs, admitted_ids


def effective_threshold(cfg: dict, before: Snapshot) -> int:
    """long_prefill_token_threshold as it applies this step: a lone request (nothing else running or waiting) has
    nobody to starve and may use the whole budget (vLLM's rule)."""
    return cfg["long_prefill_token_threshold"] if len(before.running) + len(before.waiting) > 1 else 0


def check_token_budget(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """vLLM's one budget: every token a step schedules, decodes and prefill chunks alike, counts against
    max_num_batched_tokens; no request gets more than long_prefill_token_threshold (when set)."""
    total = sum(step.num_scheduled_tokens.values())
    if total > cfg["max_num_batched_tokens"]:
        _fail(
            "token_budget",
            f"{total} tokens scheduled > max_num_batched_tokens {cfg['max_num_batched_tokens']}",
            cfg=cfg,
            step=step,
            snaps=[("before", before)],
        )
    thr = effective_threshold(cfg, before)
    for rid, n in step.num_scheduled_tokens.items():
        if thr and n > thr:
            _fail(
                "token_budget",
                f"{rid} scheduled {n} tokens > long_prefill_token_threshold {thr}",
                cfg=cfg,
                step=step,
                snaps=[("before", before)],
            )


def check_prefill_budget(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Every engine's budget: the prompt (and re-prefill) tokens one step computes <= max_num_batched_tokens.
    Decodes (one token of a request whose every earlier token is computed) are left out: whether they count against
    the budget is one engine's design (vLLM's `token_budget`)."""
    prefill = {
        rid: n for rid, n in step.num_scheduled_tokens.items() if rid in before.by_id and _is_prefill(before.by_id[rid])
    }
    if sum(prefill.values()) > cfg["max_num_batched_tokens"]:
        _fail(
            "prefill_budget",
            f"{sum(prefill.values())} prefill tokens scheduled ({prefill}) > max_num_batched_tokens "
            f"{cfg['max_num_batched_tokens']}",
            cfg=cfg,
            step=step,
            snaps=[("before", before)],
        )


def check_scheduled_tokens(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """A step schedules only running or waiting requests, each at least one and no more tokens than it had left to
    compute, and each is running afterwards with computed <= its tokens."""
    for rid, n in step.num_scheduled_tokens.items():
        v = before.by_id.get(rid)
        if v is None:
            _fail(
                "scheduled_tokens",
                f"{rid} was scheduled but was neither running nor waiting",
                cfg=cfg,
                step=step,
                snaps=[("before", before)],
            )
        left = v.num_tokens_with_placeholders - v.num_computed_tokens
        if rid in step.preempted_req_ids:
            left = v.num_tokens  # preempted and admitted again within the step (priority_preemption): may restart
        if not 0 < n <= left:
            _fail(
                "scheduled_tokens",
                f"{rid} scheduled {n} tokens with {left} left to compute",
                cfg=cfg,
                step=step,
                snaps=[("before", before)],
            )
        a = after.by_id.get(rid)
        if a is None or a.status != "running" or a.num_computed_tokens > a.num_tokens_with_placeholders:
            _fail(
                "scheduled_tokens",
                f"{rid} scheduled but not running with computed <= num_tokens after schedule()",
                cfg=cfg,
                step=step,
                snaps=[("after", after)],
            )


def check_max_num_seqs(cfg: dict, snap: Snapshot) -> None:
    """running <= max_num_seqs (1 in `none` mode)."""
    if len(snap.running) > _max_seqs(cfg):
        _fail("max_num_seqs", f"{len(snap.running)} running > {_max_seqs(cfg)}", cfg=cfg, snaps=[("state", snap)])


# ---- who may be scheduled together ----------------------------------------------------------------------------------
def check_decode_first(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Continuous mode: if anything was admitted, every request running before the step (and not preempted in it) was
    scheduled. The one sound exception: with chunked prefill off, a running request whose next chunk
    (min(left, threshold)) exceeded the budget still left at its turn is skipped (head of line for running); and
    under async scheduling a request whose token in flight is its last (max_tokens) is not scheduled again."""
    if cfg["batching"] != "continuous":
        return
    admitted = admitted_ids(before, after)
    if not admitted:
        return
    preempted = set(step.preempted_req_ids)
    if preempted and cfg["priority_preemption"]:
        # a victim scheduled earlier in the step gave its (unknown) tokens back: the budget at each turn is unknown
        return
    remaining = cfg["max_num_batched_tokens"]
    thr = effective_threshold(cfg, before)
    for v in before.running:
        rid = v.request_id
        if rid in preempted:
            continue
        left = v.num_tokens_with_placeholders - v.num_computed_tokens
        if rid in step.num_scheduled_tokens:
            remaining -= step.num_scheduled_tokens[rid]
            continue
        if (
            v.num_output_placeholders
            and v.max_tokens is not None
            and (v.num_computed_tokens + 2 - v.num_output_placeholders >= v.num_prompt_tokens + v.max_tokens)
        ):
            continue  # async: its token in flight is its last
        need = min(left, thr) if thr else left
        if left <= 0 or (not cfg["enable_chunked_prefill"] and need > remaining):
            continue
        _fail(
            "decode_first",
            f"admitted {admitted} while running {rid} ({left} left, budget {remaining} at its turn) was not scheduled",
            cfg=cfg,
            step=step,
            snaps=[("before", before), ("after", after)],
        )


def check_admission_order(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Admitted requests are a prefix of the waiting queue as it was before the step, in its order (the adapter's
    waiting() is queue order), and under the priority policy no request waits behind a less urgent one. How requests
    of one priority are ordered is the engine's design: `priority_arrival_order`."""
    admitted = admitted_ids(before, after)
    if admitted != before.waiting_ids[: len(admitted)]:
        _fail(
            "admission_order",
            f"admitted {admitted}, but the waiting queue was {before.waiting_ids}",
            cfg=cfg,
            step=step,
            snaps=[("before", before), ("after", after)],
        )
    if cfg["policy"] == "priority":
        priorities = [v.priority for v in before.waiting]
        if priorities != sorted(priorities):
            _fail(
                "admission_order",
                f"waiting queue not in priority order: {priorities}",
                cfg=cfg,
                snaps=[("before", before)],
            )


def check_priority_arrival_order(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """vLLM's priority queue: under the priority policy the waiting queue is in (priority, arrival_time, request_id)
    order, exact ties by request id, and a preempted request keeps the place its arrival time gives it."""
    if cfg["policy"] != "priority":
        return
    keys = [(*_key(v), v.request_id) for v in before.waiting]
    if keys != sorted(keys):
        _fail(
            "priority_arrival_order",
            "waiting queue not in (priority, arrival_time, request_id) order",
            cfg=cfg,
            snaps=[("before", before)],
        )


def _is_prefill(v: ReqView) -> bool:
    return v.num_computed_tokens < max(v.num_prompt_tokens, v.num_tokens - 1)


def check_sequence_no_mixing(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Sequence mode (TGI-like): a step is all prefill chunks or all decodes."""
    if cfg["batching"] != "sequence":
        return
    kinds = {rid: _is_prefill(before.by_id[rid]) for rid in step.num_scheduled_tokens}
    if len(set(kinds.values())) > 1:
        _fail(
            "sequence_no_mixing",
            f"prefill/decode mixed in one step: {kinds}",
            cfg=cfg,
            step=step,
            snaps=[("before", before)],
        )


def check_static_batch(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Static / none: nothing is admitted while a request of the current batch is unfinished."""
    if cfg["batching"] not in ("static", "none"):
        return
    admitted = admitted_ids(before, after)
    if admitted and before.running:
        _fail(
            "static_batch",
            f"admitted {admitted} while {before.running_ids} of the batch were unfinished",
            cfg=cfg,
            step=step,
            snaps=[("before", before), ("after", after)],
        )
