"""Invariants of each request's tokens and end: token accounting, outputs kept, where a sample lands, finish
reasons and aborts, progress, liveness and leaks."""

from __future__ import annotations

from collections.abc import Iterable

from conformance.adapters import ReqView, StepView
from conformance.invariants._base import Snapshot, _fail, _fmt


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
            _fail(
                "token_accounting", f"{rid} tokens changed in schedule(): {_fmt(v0)} -> {_fmt(v1)}", cfg=cfg, step=step
            )
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
            _fail(
                "token_accounting",
                f"{rid} num_computed_tokens {c0} -> {c1} ({why})",
                cfg=cfg,
                step=step,
                snaps=[("before", before), ("after", after)],
            )


def check_cached_tokens(cfg: dict, before: Snapshot, step: StepView, after: Snapshot) -> None:
    """A request's prefix-cache hit count (vLLM's num_cached_tokens, what its usage and metrics report) is the hit
    of its first admission: the tokens it started from then (its computed tokens less those scheduled in that
    step), 0 without prefix caching; a readmission after preemption, which may hit its own freed blocks, leaves it
    as it was. Skipped where the adapter does not report it."""
    for rid, v1 in after.by_id.items():
        v0 = before.by_id.get(rid)
        if v0 is None or v1.num_cached_tokens is None or v0.num_cached_tokens is None:
            continue
        if v0.num_cached_tokens >= 0:
            expected, why = v0.num_cached_tokens, "kept from its first admission"
        elif rid in step.preempted_req_ids:
            continue  # (priority_preemption) admitted and preempted again within the step: its hit is not seen
        elif v1.status == "running" and v0.status == "waiting":
            expected = v1.num_computed_tokens - step.num_scheduled_tokens.get(rid, 0)
            why = "its first admission's prefix-cache hit"
        else:
            expected, why = -1, "not admitted yet"
        if v1.num_cached_tokens != expected:
            _fail(
                "cached_tokens",
                f"{rid} reports {v1.num_cached_tokens} cached tokens, expected {expected} ({why})",
                cfg=cfg,
                step=step,
                snaps=[("before", before), ("after", after)],
            )


def check_outputs_kept(
    views: dict[str, ReqView], expected_outputs: dict[str, int], prompt_lens: dict[str, int]
) -> None:
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
        _fail(
            "sample_position",
            f"{request_id}: a token sampled as output #{sampled_for} arrived as output #{delivered_at}",
        )


def check_finish(view: ReqView, expected: str | None, returned: bool) -> None:
    """After update: a request finishes exactly when its last token is EOS / a stop token id (once min_tokens are
    out) or it reached max_tokens, with that finish_reason, and update() reports it."""
    finished = view.status == "finished"
    if expected is None and (finished or returned):
        _fail("finish", f"{_fmt(view)} finished ({view.finish_reason}) but should still run")
    if expected is not None and (not finished or view.finish_reason != expected or not returned):
        _fail(
            "finish",
            f"{_fmt(view)} should have finished with {expected!r} and been reported "
            f"(finished={finished}, reason={view.finish_reason!r}, reported={returned})",
        )


def check_aborted(view: ReqView, snap: Snapshot) -> None:
    """An aborted request ends with finish_reason 'abort', holds no blocks and is neither running nor waiting."""
    if view.finish_reason != "abort" or view.block_ids or view.host_block_ids or view.request_id in snap.by_id:
        _fail("aborted", f"after abort: {_fmt(view)} (reason {view.finish_reason!r})", snaps=[("state", snap)])


# ---- liveness and leaks -------------------------------------------------------------------------------------------
def check_progress(idle_steps: int, window: int, snap: Snapshot) -> None:
    """Nothing deadlocks: a step with unfinished requests that schedules and preempts nothing may only happen
    transiently (fewer than `window` in a row)."""
    if idle_steps >= window:
        _fail(
            "progress",
            f"{idle_steps} steps in a row scheduled nothing with requests unfinished",
            snaps=[("state", snap)],
        )


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
        _fail(
            "no_leaks",
            f"after all finished: device blocks still referenced {used}, host {host}, "
            f"free {snap.free_blocks}/{num_gpu_blocks}",
            snaps=[("state", snap)],
        )
