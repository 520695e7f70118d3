"""The named scheduling invariants of the conformance suite, checked through the engine-neutral adapter views.

Each check is a plain function that raises `InvariantViolation` (an AssertionError) whose message names the
invariant and shows the offending state. They read only `Snapshot`s (taken from a SchedulerAdapter before and after
`schedule()`) and the `StepView`, so they hold for any engine that has an adapter. Where a rule can only be checked
soundly from outside (preemption "only when a block could not be had"), the docstring says what is checked and why
it is sound.

Vocabulary: `before` is the state right before schedule(), `after` right after it (num_computed_tokens already
advanced, as in vLLM), `step` what schedule() returned. A request's "left" tokens are num_tokens - num_computed,
where, under async scheduling, num_tokens counts the output placeholders (tokens sampled by a step in flight), which
a decode schedules as its input before the real token is back.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from conformance.adapters import ReqView, StepView


class InvariantViolation(AssertionError):
    pass


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fmt(v: ReqView) -> str:
    extra = f" host={v.host_block_ids}" if v.host_block_ids else ""
    return (f"{v.request_id}[{v.status} prompt={v.num_prompt_tokens} out={v.num_output_tokens} "
            f"computed={v.num_computed_tokens} prio={v.priority} t={v.arrival_time:g} blocks={v.block_ids}{extra}]")


def _fail(name: str, msg: str, *, cfg: dict | None = None, step: StepView | None = None,
          snaps: Iterable[tuple[str, Snapshot]] = ()) -> None:
    lines = [f"invariant `{name}` violated: {msg}"]
    if cfg is not None:
        lines.append("  config: " + ", ".join(f"{k}={v}" for k, v in sorted(cfg.items())))
    if step is not None:
        lines.append(f"  step: scheduled={step.num_scheduled_tokens} preempted={step.preempted_req_ids} "
                     f"new={step.new_req_ids} swap_out={step.blocks_to_swap_out} swap_in={step.blocks_to_swap_in}")
    for label, s in snaps:
        lines.append(f"  {label}: free_blocks={s.free_blocks}")
        lines.append("    running: " + "; ".join(map(_fmt, s.running)))
        lines.append("    waiting: " + "; ".join(map(_fmt, s.waiting)))
    raise InvariantViolation("\n".join(lines))


@dataclass
class Snapshot:
    running: list[ReqView]
    waiting: list[ReqView]
    free_blocks: int
    ref_counts: dict[int, int]
    host_ref_counts: dict[int, int] | None = None
    by_id: dict[str, ReqView] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {v.request_id: v for v in self.running + self.waiting}

    @property
    def running_ids(self) -> list[str]:
        return [v.request_id for v in self.running]

    @property
    def waiting_ids(self) -> list[str]:
        return [v.request_id for v in self.waiting]


def snapshot(adapter) -> Snapshot:
    host = adapter.host_block_ref_counts() if hasattr(adapter, "host_block_ref_counts") else None
    return Snapshot(adapter.running(), adapter.waiting(), adapter.num_free_blocks(), adapter.block_ref_counts(), host)


def _key(v: ReqView) -> tuple[int, float]:
    return (v.priority, v.arrival_time)


def _max_seqs(cfg: dict) -> int:
    return 1 if cfg["batching"] == "none" else cfg["max_num_seqs"]


def admitted_ids(before: Snapshot, after: Snapshot) -> list[str]:
    """Requests that went from waiting to running in this step, in admission order (the running list grows by
    appending, in vLLM as here). Derived from state, so that zero-token admissions (static mode) count too."""
    was_waiting = set(before.waiting_ids)
    return [rid for rid in after.running_ids if rid in was_waiting]


# ---- budget -------------------------------------------------------------------------------------------------------
def effective_threshold(cfg: dict, before: Snapshot) -> int:
    """long_prefill_token_threshold as it applies this step: a lone request (nothing else running or waiting) has
    nobody to starve and may use the whole budget (vLLM's rule)."""
    return cfg["long_prefill_token_threshold"] if len(before.running) + len(before.waiting) > 1 else 0


def check_token_budget(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Scheduled tokens of a step <= max_num_batched_tokens; no request gets more than it had left to compute or
    (when set) more than long_prefill_token_threshold."""
    total = sum(step.num_scheduled_tokens.values())
    if total > cfg["max_num_batched_tokens"]:
        _fail("token_budget", f"{total} tokens scheduled > max_num_batched_tokens {cfg['max_num_batched_tokens']}",
              cfg=cfg, step=step, snaps=[("before", before)])
    thr = effective_threshold(cfg, before)
    for rid, n in step.num_scheduled_tokens.items():
        v = before.by_id.get(rid)
        if v is None:
            _fail("token_budget", f"{rid} was scheduled but was neither running nor waiting", cfg=cfg, step=step,
                  snaps=[("before", before)])
        left = v.num_tokens_with_placeholders - v.num_computed_tokens
        if rid in step.preempted_req_ids:
            left = v.num_tokens  # preempted and admitted again within the step (priority_preemption): may restart
        if not 0 < n <= left:
            _fail("token_budget", f"{rid} scheduled {n} tokens with {left} left to compute", cfg=cfg, step=step,
                  snaps=[("before", before)])
        if thr and n > thr:
            _fail("token_budget", f"{rid} scheduled {n} tokens > long_prefill_token_threshold {thr}", cfg=cfg,
                  step=step, snaps=[("before", before)])
        a = after.by_id.get(rid)
        if a is None or a.status != "running" or a.num_computed_tokens > a.num_tokens_with_placeholders:
            _fail("token_budget", f"{rid} scheduled but not running with computed <= num_tokens after schedule()",
                  cfg=cfg, step=step, snaps=[("after", after)])


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
        if v.num_output_placeholders and v.max_tokens is not None and (
                v.num_computed_tokens + 2 - v.num_output_placeholders >= v.num_prompt_tokens + v.max_tokens):
            continue  # async: its token in flight is its last
        need = min(left, thr) if thr else left
        if left <= 0 or (not cfg["enable_chunked_prefill"] and need > remaining):
            continue
        _fail("decode_first", f"admitted {admitted} while running {rid} ({left} left, budget {remaining} at its turn) "
              "was not scheduled", cfg=cfg, step=step, snaps=[("before", before), ("after", after)])


def check_admission_order(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Admitted requests are a prefix of the waiting queue as it was before the step, in its order (FCFS, or
    (priority, arrival_time, request_id) under the priority policy, exact ties by request id as vLLM: the adapter's
    waiting() is queue order)."""
    admitted = admitted_ids(before, after)
    if admitted != before.waiting_ids[: len(admitted)]:
        _fail("admission_order", f"admitted {admitted}, but the waiting queue was {before.waiting_ids}", cfg=cfg,
              step=step, snaps=[("before", before), ("after", after)])
    if cfg["policy"] == "priority":
        keys = [(*_key(v), v.request_id) for v in before.waiting]
        if keys != sorted(keys):
            _fail("admission_order", "waiting queue not in (priority, arrival_time, request_id) order", cfg=cfg,
                  snaps=[("before", before)])


def _is_prefill(v: ReqView) -> bool:
    return v.num_computed_tokens < max(v.num_prompt_tokens, v.num_tokens - 1)


def check_sequence_no_mixing(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Sequence mode (TGI-like): a step is all prefill chunks or all decodes."""
    if cfg["batching"] != "sequence":
        return
    kinds = {rid: _is_prefill(before.by_id[rid]) for rid in step.num_scheduled_tokens}
    if len(set(kinds.values())) > 1:
        _fail("sequence_no_mixing", f"prefill/decode mixed in one step: {kinds}", cfg=cfg, step=step,
              snaps=[("before", before)])


def check_static_batch(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Static / none: nothing is admitted while a request of the current batch is unfinished."""
    if cfg["batching"] not in ("static", "none"):
        return
    admitted = admitted_ids(before, after)
    if admitted and before.running:
        _fail("static_batch", f"admitted {admitted} while {before.running_ids} of the batch were unfinished",
              cfg=cfg, step=step, snaps=[("before", before), ("after", after)])


# ---- blocks -------------------------------------------------------------------------------------------------------
def check_block_accounting(cfg: dict, snap: Snapshot, num_gpu_blocks: int) -> None:
    """free + used = total; ref counts never negative; each block's ref count == the number of running requests'
    tables holding it (waiting requests hold none)."""
    refs = snap.ref_counts
    if len(refs) != num_gpu_blocks:
        _fail("block_accounting", f"{len(refs)} blocks reported, {num_gpu_blocks} configured", cfg=cfg)
    neg = {b: r for b, r in refs.items() if r < 0}
    if neg:
        _fail("block_accounting", f"negative ref counts {neg}", cfg=cfg, snaps=[("state", snap)])
    num_free = sum(1 for r in refs.values() if r == 0)
    if snap.free_blocks != num_free:
        _fail("block_accounting", f"num_free_blocks {snap.free_blocks} != {num_free} blocks with ref count 0 "
              f"(used {num_gpu_blocks - num_free}, total {num_gpu_blocks})", cfg=cfg, snaps=[("state", snap)])
    holders: dict[int, int] = {}
    for v in snap.running + snap.waiting:
        for b in v.block_ids:
            holders[b] = holders.get(b, 0) + 1
    bad = {b: (r, holders.get(b, 0)) for b, r in refs.items() if r != holders.get(b, 0)}
    if bad:
        _fail("block_accounting", f"block: (ref count, tables holding it) disagree: {bad}", cfg=cfg,
              snaps=[("state", snap)])


def check_blocks_per_request(cfg: dict, snap: Snapshot) -> None:
    """A running request holds exactly ceil(num_computed / block_size) blocks in continuous mode (at least that
    many in the modes that reserve at admission); a waiting one holds no device blocks."""
    bs = cfg["block_size"]
    for v in snap.running:
        need, held = cdiv(v.num_computed_tokens, bs), len(v.block_ids)
        ok = held == need if cfg["batching"] == "continuous" else held >= need
        if not ok:
            _fail("blocks_per_request", f"{v.request_id} holds {held} blocks, its {v.num_computed_tokens} computed "
                  f"tokens need {need}", cfg=cfg, snaps=[("state", snap)])
    for v in snap.waiting:
        if v.block_ids:
            _fail("blocks_per_request", f"waiting {v.request_id} holds device blocks {v.block_ids}", cfg=cfg,
                  snaps=[("state", snap)])


def check_block_sharing(cfg: dict, snap: Snapshot, tokens: dict[str, list[int]]) -> None:
    """No block is in two tables (or twice in one) unless prefix caching is on and it is, in every table, the same
    full block of an identical prefix: same index i, same token ids up to (i + 1) * block_size, all computed."""
    bs = cfg["block_size"]
    where: dict[int, list[tuple[str, int]]] = {}
    for v in snap.running:
        for i, b in enumerate(v.block_ids):
            where.setdefault(b, []).append((v.request_id, i))
    for b, holders in where.items():
        if len(holders) == 1:
            continue
        rids = [r for r, _ in holders]
        if not cfg["enable_prefix_caching"] or len(set(rids)) != len(rids):
            _fail("block_sharing", f"block {b} held by {holders} without prefix caching", cfg=cfg,
                  snaps=[("state", snap)])
        idx = {i for _, i in holders}
        end = (holders[0][1] + 1) * bs
        prefixes = {tuple(tokens[r][:end]) for r in rids}
        short = [r for r in rids if snap.by_id[r].num_computed_tokens < end]
        if len(idx) != 1 or len(prefixes) != 1 or short:
            _fail("block_sharing", f"block {b} shared by {holders}, but not one full block of an identical prefix "
                  f"(distinct prefixes: {len(prefixes)}, not yet computed by: {short})", cfg=cfg,
                  snaps=[("state", snap)])


def check_host_blocks(cfg: dict, snap: Snapshot, in_flight: Iterable[int] = ()) -> None:
    """Host pool: ref counts 0/1; the used host blocks are exactly those held by swapped-out (waiting) requests,
    plus `in_flight` for an adapter that frees a swap-in's source blocks only after the copy (refengine frees them
    as schedule() returns, so its suites pass none); running requests hold none. So the pool is empty when idle."""
    if snap.host_ref_counts is None:
        return
    used = {b for b, r in snap.host_ref_counts.items() if r > 0}
    if any(r not in (0, 1) for r in snap.host_ref_counts.values()):
        _fail("host_blocks", f"host ref counts {snap.host_ref_counts}", cfg=cfg, snaps=[("state", snap)])
    held: list[int] = [b for v in snap.waiting for b in v.host_block_ids]
    if any(v.host_block_ids for v in snap.running):
        _fail("host_blocks", "a running request still holds host blocks", cfg=cfg, snaps=[("state", snap)])
    expected = set(held) | set(in_flight)
    if len(held) != len(set(held)) or used != expected:
        _fail("host_blocks", f"used host blocks {sorted(used)} != held by swapped requests {sorted(held)} + "
              f"in-flight swap-in sources {sorted(set(in_flight))}", cfg=cfg, snaps=[("state", snap)])


# ---- preemption ---------------------------------------------------------------------------------------------------
def max_block_growth(cfg: dict, v: ReqView, thr: int) -> int:
    """Upper bound on the blocks a running request can ask for in one step (thr: the effective threshold)."""
    left = v.num_tokens_with_placeholders - v.num_computed_tokens
    n = min(left, thr or left, cfg["max_num_batched_tokens"])
    return max(0, cdiv(v.num_computed_tokens + n, cfg["block_size"]) - len(v.block_ids))


def check_preemption_needed(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Preemption happens only when a block could not be had, and never in sequence / static / none modes.

    Sound check: before the first preemption of a step nothing has been freed, so the free blocks at that moment are
    at most the free blocks before the step. The request that failed to allocate plus those allocated before it asked
    for at most sum(max_block_growth) over the running requests. So a preemption for blocks implies
    free_before < sum over running-before of max_block_growth. (With priority_preemption on, a waiting request
    strictly more urgent than the victim is the other legitimate cause.)"""
    if not step.preempted_req_ids:
        return
    if cfg["batching"] != "continuous":
        _fail("preemption_needed", f"preempted {step.preempted_req_ids} in {cfg['batching']} mode", cfg=cfg,
              step=step, snaps=[("before", before)])
    thr = effective_threshold(cfg, before)
    growth = sum(max_block_growth(cfg, v, thr) for v in before.running)
    if before.free_blocks < growth:
        return
    if cfg["priority_preemption"] and before.waiting:
        most_urgent = min(v.priority for v in before.waiting)
        victims = [before.by_id[r] for r in step.preempted_req_ids if r in before.by_id]
        if all(v.priority > most_urgent for v in victims):
            return
    _fail("preemption_needed", f"preempted {step.preempted_req_ids} although {before.free_blocks} free blocks "
          f"covered the running requests' largest possible growth ({growth})", cfg=cfg, step=step,
          snaps=[("before", before), ("after", after)])


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
            _fail("preemption_victim", f"preempted {vid}, which was not running", cfg=cfg, step=step,
                  snaps=[("before", before)])
        if cfg["policy"] == "fcfs":
            later = [s for s in survivors if order.index(s) > order.index(vid)]
            if later:
                _fail("preemption_victim", f"FCFS preempted {vid} but kept the later-admitted {later}", cfg=cfg,
                      step=step, snaps=[("before", before), ("after", after)])
        else:
            larger = [s for s in survivors if _key(before.by_id[s]) > _key(v)]
            if larger:
                _fail("preemption_victim", f"priority policy preempted {vid} {_key(v)} but kept {larger} with larger "
                      "(priority, arrival_time)", cfg=cfg, step=step, snaps=[("before", before), ("after", after)])


def check_no_admission_after_preemption(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """A step that preempted admits nothing from the waiting queue (unless priority_preemption is on)."""
    if step.preempted_req_ids and not cfg["priority_preemption"]:
        admitted = admitted_ids(before, after)
        if admitted:
            _fail("no_admission_after_preemption", f"admitted {admitted} in a step that preempted "
                  f"{step.preempted_req_ids}", cfg=cfg, step=step, snaps=[("before", before), ("after", after)])


def check_swap(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """Swap mode: a swapped-out victim's device blocks are all in blocks_to_swap_out, in order, paired with the host
    blocks it now holds; a victim falls back to recompute only when the host pool could not take its blocks; a
    resumed request's host blocks are all in blocks_to_swap_in, onto its first device blocks."""
    swap_mode = cfg["preemption_mode"] == "swap"
    if not swap_mode:
        if step.blocks_to_swap_out or step.blocks_to_swap_in:
            _fail("swap", "swap copies in recompute mode", cfg=cfg, step=step)
        return
    out_map = dict((h, d) for d, h in step.blocks_to_swap_out)
    host_total = getattr_cfg(cfg, "num_cpu_blocks")
    host_avail = host_total - sum(len(v.host_block_ids) for v in before.waiting)
    for vid in step.preempted_req_ids:
        v0, v1 = before.by_id.get(vid), after.by_id.get(vid)
        if v0 is None or v1 is None or v1.status == "running":
            continue
        if v1.host_block_ids:
            devices = [out_map.get(h) for h in v1.host_block_ids]
            if devices != v0.block_ids:
                _fail("swap", f"{vid} swapped out {devices}, held {v0.block_ids}", cfg=cfg, step=step,
                      snaps=[("before", before), ("after", after)])
            host_avail -= len(v1.host_block_ids)
        elif len(v0.block_ids) <= host_avail:
            _fail("swap", f"{vid} fell back to recompute with {host_avail} host blocks free for its "
                  f"{len(v0.block_ids)}", cfg=cfg, step=step, snaps=[("before", before), ("after", after)])
    in_map = dict(step.blocks_to_swap_in)
    for rid in admitted_ids(before, after):
        host = before.by_id[rid].host_block_ids
        got = [in_map.get(h) for h in host]
        if got != after.by_id[rid].block_ids[: len(host)]:
            _fail("swap", f"{rid} swapped in {got} onto {after.by_id[rid].block_ids}", cfg=cfg, step=step,
                  snaps=[("before", before), ("after", after)])


def getattr_cfg(cfg: dict, name: str) -> int:
    return int(cfg.get(name, 0))


# ---- token accounting ---------------------------------------------------------------------------------------------
def check_token_accounting(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """num_computed_tokens only grows, by exactly the tokens scheduled, except: a recompute victim returns to 0
    (a swap victim keeps it); an admitted request starts from 0, its swapped-in count, or a prefix-cache hit
    (a whole number of blocks, short of the last token). schedule() never changes a request's tokens."""
    bs = cfg["block_size"]
    preempted = set(step.preempted_req_ids)
    for rid, v0 in before.by_id.items():
        v1 = after.by_id.get(rid)
        if v1 is None:
            _fail("token_accounting", f"{rid} vanished in schedule()", cfg=cfg, step=step, snaps=[("before", before)])
        if (v1.num_prompt_tokens, v1.num_output_tokens) != (v0.num_prompt_tokens, v0.num_output_tokens):
            _fail("token_accounting", f"{rid} tokens changed in schedule(): {_fmt(v0)} -> {_fmt(v1)}", cfg=cfg,
                  step=step)
        c0, c1, n = v0.num_computed_tokens, v1.num_computed_tokens, step.num_scheduled_tokens.get(rid, 0)
        if rid in preempted:
            if v1.status == "running":
                continue  # preempted and admitted again within one step (priority_preemption)
            ok = c1 == 0 or (cfg["preemption_mode"] == "swap" and c1 == c0 and bool(v1.host_block_ids))
            why = "a preempted request must restart from 0 (recompute) or keep its count (swap)"
        elif v0.status == "running":
            ok, why = c1 == c0 + n, f"running: {c0} + {n} scheduled"
        elif v1.status == "running":
            base = c1 - n
            ok = base == c0 or (c0 == 0 and cfg["enable_prefix_caching"] and base % bs == 0 and base < v1.num_tokens)
            if v0.host_block_ids:
                ok = base == c0
            why = f"admitted with {n} scheduled: start must be {c0} or a prefix-cache hit"
        else:
            ok, why = c1 == c0, "still waiting"
        if not ok:
            _fail("token_accounting", f"{rid} num_computed_tokens {c0} -> {c1} ({why})", cfg=cfg, step=step,
                  snaps=[("before", before), ("after", after)])


def check_outputs_kept(views: dict[str, ReqView], expected_outputs: dict[str, int],
                       prompt_lens: dict[str, int]) -> None:
    """Generated tokens are never lost (by preemption or anything else): every request holds exactly the tokens
    the runner sampled for it."""
    for rid, n in expected_outputs.items():
        v = views[rid]
        if v.num_output_tokens != n or v.num_prompt_tokens != prompt_lens[rid]:
            _fail("outputs_kept", f"{_fmt(v)} should hold {prompt_lens[rid]} prompt + {n} sampled tokens")


def check_sample_position(request_id: str, sampled_for: int, delivered_at: int) -> None:
    """A step samples the output token at one index (right after schedule(): the known outputs plus those of steps
    in flight); when its output comes back, that is exactly where it lands. Under async scheduling a request
    preempted with a step in flight must not be resumed (and resample that index) before its output is back."""
    if sampled_for != delivered_at:
        _fail("sample_position", f"{request_id}: a token sampled as output #{sampled_for} arrived as output "
              f"#{delivered_at}")


def check_finish(view: ReqView, expected: str | None, returned: bool) -> None:
    """After update: a request finishes exactly when its last token is EOS / a stop token id (once min_tokens are
    out) or it reached max_tokens, with that finish_reason, and update() reports it."""
    finished = view.status == "finished"
    if expected is None and (finished or returned):
        _fail("finish", f"{_fmt(view)} finished ({view.finish_reason}) but should still run")
    if expected is not None and (not finished or view.finish_reason != expected or not returned):
        _fail("finish", f"{_fmt(view)} should have finished with {expected!r} and been reported "
              f"(finished={finished}, reason={view.finish_reason!r}, reported={returned})")


def check_aborted(view: ReqView, snap: Snapshot) -> None:
    """An aborted request ends with finish_reason 'abort', holds no blocks and is neither running nor waiting."""
    if view.finish_reason != "abort" or view.block_ids or view.host_block_ids or view.request_id in snap.by_id:
        _fail("aborted", f"after abort: {_fmt(view)} (reason {view.finish_reason!r})", snaps=[("state", snap)])


# ---- liveness and leaks -------------------------------------------------------------------------------------------
def check_progress(idle_steps: int, window: int, snap: Snapshot) -> None:
    """Nothing deadlocks: a step with unfinished requests that schedules and preempts nothing may only happen
    transiently (fewer than `window` in a row)."""
    if idle_steps >= window:
        _fail("progress", f"{idle_steps} steps in a row scheduled nothing with requests unfinished",
              snaps=[("state", snap)])


def liveness_bound(pending: Iterable[tuple[int, int]]) -> int:
    """A generous bound on the steps to drain requests that each fit alone: while no new request arrives, the most
    urgent unfinished request is never a victim and gains at least one token per step, so the requests finish
    one after another within (prompt + max_tokens) steps each; every other request's work may be thrown away
    (recompute) once per finish, hence the factor (n + 1)."""
    pending = list(pending)
    return (len(pending) + 1) * sum(p + m for p, m in pending) + 2 * len(pending) + 8


def check_all_finished(views: Iterable[ReqView]) -> None:
    """Every request ends with a finish_reason."""
    bad = [_fmt(v) for v in views if v.status != "finished" or v.finish_reason not in ("stop", "length", "abort")]
    if bad:
        _fail("all_finished", f"requests without a finish_reason after draining: {bad}")


def check_no_leaks(snap: Snapshot, num_gpu_blocks: int) -> None:
    """After every request finished: every device and host block is free (cached-but-free blocks count as free)."""
    used = {b: r for b, r in snap.ref_counts.items() if r}
    host = {b: r for b, r in (snap.host_ref_counts or {}).items() if r}
    if used or host or snap.free_blocks != num_gpu_blocks or snap.running or snap.waiting:
        _fail("no_leaks", f"after all finished: device blocks still referenced {used}, host {host}, "
              f"free {snap.free_blocks}/{num_gpu_blocks}", snaps=[("state", snap)])


STEP_CHECKS = (
    check_token_budget,
    check_decode_first,
    check_admission_order,
    check_sequence_no_mixing,
    check_static_batch,
    check_preemption_needed,
    check_preemption_victim,
    check_no_admission_after_preemption,
    check_swap,
    check_token_accounting,
)


def check_state(cfg: dict, snap: Snapshot, tokens: dict[str, list[int]], num_gpu_blocks: int,
                in_flight: Iterable[int] = ()) -> None:
    """The checks that read one state at rest (after schedule() and after update())."""
    check_max_num_seqs(cfg, snap)
    check_block_accounting(cfg, snap, num_gpu_blocks)
    check_blocks_per_request(cfg, snap)
    check_block_sharing(cfg, snap, tokens)
    check_host_blocks(cfg, snap, in_flight)


def check_step(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    for check in STEP_CHECKS:
        check(cfg, before, step, after)
