"""The shared ground of the invariant checks: the violation type and its message, the `Snapshot` of an
adapter's state, and the small helpers every family reads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from conformance.adapters import ReqView, StepView


class InvariantViolation(AssertionError):
    def __init__(self, message: str, invariant: str = "") -> None:
        super().__init__(message)
        self.invariant = invariant  # the invariant's name, as _fail was given it


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fmt(v: ReqView) -> str:
    extra = f" host={v.host_block_ids}" if v.host_block_ids else ""
    return (
        f"{v.request_id}[{v.status} prompt={v.num_prompt_tokens} out={v.num_output_tokens} "
        f"computed={v.num_computed_tokens} prio={v.priority} t={v.arrival_time:g} blocks={v.block_ids}{extra}]"
    )


def _fail(
    name: str,
    msg: str,
    *,
    cfg: dict | None = None,
    step: StepView | None = None,
    snaps: Iterable[tuple[str, Snapshot]] = (),
) -> None:
    lines = [f"invariant `{name}` violated: {msg}"]
    if cfg is not None:
        lines.append("  config: " + ", ".join(f"{k}={v}" for k, v in sorted(cfg.items())))
    if step is not None:
        lines.append(
            f"  step: scheduled={step.num_scheduled_tokens} preempted={step.preempted_req_ids} "
            f"new={step.new_req_ids} swap_out={step.blocks_to_swap_out} swap_in={step.blocks_to_swap_in}"
        )
    for label, s in snaps:
        lines.append(f"  {label}: free_blocks={s.free_blocks}")
        lines.append("    running: " + "; ".join(map(_fmt, s.running)))
        lines.append("    waiting: " + "; ".join(map(_fmt, s.waiting)))
    raise InvariantViolation("\n".join(lines), name)


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
