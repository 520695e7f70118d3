"""Invariants of preemption: only when a block could not be had, of the right victim, no admission after it, and
swap plans that move exactly the victims' blocks."""

from __future__ import annotations

from conformance.adapters import ReqView, StepView
from conformance.invariants._base import Snapshot, _fail, _key, admitted_ids, cdiv
from conformance.invariants.batching_invariants import effective_threshold


def max_block_growth(cfg: dict, v: ReqView, thr: int) -> int:
    """Upper bound on the blocks a running request can ask for in one step (thr: the effective threshold)."""
    left = v.num_tokens_with_placeholders - v.num_computed_tokens
    n = min(left, thr or left, cfg["max_num_batched_tokens"])
    return max(0, cdiv(v.num_computed_tokens + n, cfg["block_size"]) - len(v.block_ids))


def check_preemption_needed(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Preemption happens only when a block could not be had (`preemption_needed`), and never in sequence / static /
    none modes (`no_preemption_outside_continuous`, refengine's design of those modes).

    Sound check: before the first preemption of a step nothing has been freed, so the free blocks at that moment are
    at most the free blocks before the step. The request that failed to allocate plus those allocated before it asked
    for at most sum(max_block_growth) over the running requests. So a preemption for blocks implies
    free_before < sum over running-before of max_block_growth. (With priority_preemption on, a waiting request
    strictly more urgent than the victim is the other legitimate cause.)"""
    if not step.preempted_req_ids:
        return
    if cfg["batching"] != "continuous":
        _fail(
            "no_preemption_outside_continuous",
            f"preempted {step.preempted_req_ids} in {cfg['batching']} mode",
            cfg=cfg,
            step=step,
            snaps=[("before", before)],
        )
    thr = effective_threshold(cfg, before)
    growth = sum(max_block_growth(cfg, v, thr) for v in before.running)
    if before.free_blocks < growth:
        return
    if cfg["priority_preemption"] and before.waiting:
        most_urgent = min(v.priority for v in before.waiting)
        victims = [before.by_id[r] for r in step.preempted_req_ids if r in before.by_id]
        if all(v.priority > most_urgent for v in victims):
            return
    _fail(
        "preemption_needed",
        f"preempted {step.preempted_req_ids} although {before.free_blocks} free blocks "
        f"covered the running requests' largest possible growth ({growth})",
        cfg=cfg,
        step=step,
        snaps=[("before", before), ("after", after)],
    )


def check_preemption_victim(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """The victim is the one the policy says: FCFS the most recently admitted running request (so every survivor
    of the running list precedes every victim), priority the largest (priority, arrival_time) (so no survivor has a
    larger key than a victim). Survivors: running before and after the step."""
    if not step.preempted_req_ids:
        return
    victims = set(step.preempted_req_ids)
    order = before.running_ids
    survivors = [rid for rid in order if rid not in victims and rid in after.running_ids]
    for vid in step.preempted_req_ids:
        v = before.by_id.get(vid)
        if v is None or v.status != "running":
            if cfg["priority_preemption"] and vid in after.by_id:
                continue  # admitted earlier in this step, then preempted by a more urgent waiting request
            _fail(
                "preemption_victim",
                f"preempted {vid}, which was not running",
                cfg=cfg,
                step=step,
                snaps=[("before", before)],
            )
        if cfg["policy"] == "fcfs":
            later = [s for s in survivors if order.index(s) > order.index(vid)]
            if later:
                _fail(
                    "preemption_victim",
                    f"FCFS preempted {vid} but kept the later-admitted {later}",
                    cfg=cfg,
                    step=step,
                    snaps=[("before", before), ("after", after)],
                )
        else:
            larger = [s for s in survivors if _key(before.by_id[s]) > _key(v)]
            if larger:
                _fail(
                    "preemption_victim",
                    f"priority policy preempted {vid} {_key(v)} but kept {larger} with larger (priority, arrival_time)",
                    cfg=cfg,
                    step=step,
                    snaps=[("before", before), ("after", after)],
                )


def check_no_admission_after_preemption(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """A step that preempted admits nothing from the waiting queue (unless priority_preemption is on)."""
    if step.preempted_req_ids and not cfg["priority_preemption"]:
        admitted = admitted_ids(before, after)
        if admitted:
            _fail(
                "no_admission_after_preemption",
                f"admitted {admitted} in a step that preempted {step.preempted_req_ids}",
                cfg=cfg,
                step=step,
                snaps=[("before", before), ("after", after)],
            )


def check_swap(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Swap mode: a swapped-out victim's device blocks are all in blocks_to_swap_out, in order, paired with the host
    blocks it now holds; a victim falls back to recompute only when the host pool could not take its blocks; a
    resumed request's host blocks are all in blocks_to_swap_in, onto its first device blocks; no host block is both
    a swap-out's destination and a swap-in's source in one step (the runner copies the swap-outs first)."""
    swap_mode = cfg["preemption_mode"] == "swap"
    if not swap_mode:
        if step.blocks_to_swap_out or step.blocks_to_swap_in:
            _fail("swap", "swap copies in recompute mode", cfg=cfg, step=step)
        return
    out_map = dict((h, d) for d, h in step.blocks_to_swap_out)
    overwritten = set(out_map) & {h for h, _ in step.blocks_to_swap_in}
    if overwritten:  # the runner copies a step's swap-outs before its swap-ins
        _fail(
            "swap",
            f"host blocks {sorted(overwritten)} take a swap-out before the same step's swap-in reads them",
            cfg=cfg,
            step=step,
        )
    host_total = getattr_cfg(cfg, "num_cpu_blocks")
    host_avail = host_total - sum(len(v.host_block_ids) for v in before.waiting)
    for vid in step.preempted_req_ids:
        v0, v1 = before.by_id.get(vid), after.by_id.get(vid)
        if v0 is None or v1 is None or v1.status == "running":
            continue
        if v1.host_block_ids:
            devices = [out_map.get(h) for h in v1.host_block_ids]
            if devices != v0.block_ids:
                _fail(
                    "swap",
                    f"{vid} swapped out {devices}, held {v0.block_ids}",
                    cfg=cfg,
                    step=step,
                    snaps=[("before", before), ("after", after)],
                )
            host_avail -= len(v1.host_block_ids)
        elif len(v0.block_ids) <= host_avail:
            _fail(
                "swap",
                f"{vid} fell back to recompute with {host_avail} host blocks free for its {len(v0.block_ids)}",
                cfg=cfg,
                step=step,
                snaps=[("before", before), ("after", after)],
            )
    in_map = dict(step.blocks_to_swap_in)
    for rid in admitted_ids(before, after):
        host = before.by_id[rid].host_block_ids
        got = [in_map.get(h) for h in host]
        if got != after.by_id[rid].block_ids[: len(host)]:
            _fail(
                "swap",
                f"{rid} swapped in {got} onto {after.by_id[rid].block_ids}",
                cfg=cfg,
                step=step,
                snaps=[("before", before), ("after", after)],
            )


def getattr_cfg(cfg: dict, name: str) -> int:
    return int(cfg.get(name, 0))
