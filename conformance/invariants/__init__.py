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

The checks live in one module per family (`batching_invariants`, `blocks`, `preemption_invariants`, `requests`, and `_base` for what they
share); every name is importable from here (the package's API: test_scheduler_stateful.py reads `inv.<name>`), and
`check_state` / `check_step` run them all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable

from conformance.adapters import StepView
from conformance.invariants._base import (  # noqa: F401  (the package's API: the suite reads `inv.<name>`)
    InvariantViolation,
    Snapshot,
    _fail,
    _fmt,
    _key,
    _max_seqs,
    admitted_ids,
    cdiv,
    snapshot,
)
from conformance.invariants.batching_invariants import (  # noqa: F401  (the package's API: the suite reads `inv.<name>`)
    _is_prefill,
    check_admission_order,
    check_decode_first,
    check_max_num_seqs,
    check_prefill_budget,
    check_priority_arrival_order,
    check_scheduled_tokens,
    check_sequence_no_mixing,
    check_static_batch,
    check_token_budget,
    effective_threshold,
)
from conformance.invariants.blocks import (  # noqa: F401  (the package's API: the suite reads `inv.<name>`)
    check_block_accounting,
    check_block_sharing,
    check_blocks_per_request,
    check_host_blocks,
)
from conformance.invariants.preemption_invariants import (  # noqa: F401  (the package's API: the suite reads `inv.<name>`)
    check_no_admission_after_preemption,
    check_preemption_needed,
    check_preemption_victim,
    check_swap,
    getattr_cfg,
    max_block_growth,
)
from conformance.invariants.requests import (  # noqa: F401  (the package's API: the suite reads `inv.<name>`)
    check_aborted,
    check_all_finished,
    check_cached_tokens,
    check_finish,
    check_no_leaks,
    check_outputs_kept,
    check_progress,
    check_sample_position,
    check_token_accounting,
    liveness_bound,
)

STEP_CHECKS = (
    check_token_budget,
    check_prefill_budget,
    check_scheduled_tokens,
    check_decode_first,
    check_admission_order,
    check_priority_arrival_order,
    check_sequence_no_mixing,
    check_static_batch,
    check_preemption_needed,
    check_preemption_victim,
    check_no_admission_after_preemption,
    check_swap,
    check_token_accounting,
    check_cached_tokens,
)


def run_check(
    check: Callable[..., None], *args, departures: Collection[str] = (), seen: Counter[str] | None = None
) -> None:
    """Run one check; a violation of an invariant named in `departures` (an adapter's declared, documented departures
    from a rule: SchedulerAdapter.departures) is counted in `seen` instead of raised. Every other one raises."""
    try:
        check(*args)
    except InvariantViolation as e:
        if e.invariant not in departures:
            raise
        if seen is not None:
            seen[e.invariant] += 1


def check_state(
    cfg: dict,
    snap: Snapshot,
    tokens: dict[str, list[int]],
    num_gpu_blocks: int,
    in_flight: Iterable[int] = (),
    *,
    departures: Collection[str] = (),
    seen: Counter[str] | None = None,
) -> None:
    """The checks that read one state at rest (after schedule() and after update())."""
    in_flight = list(in_flight)
    for check, args in (
        (check_max_num_seqs, (cfg, snap)),
        (check_block_accounting, (cfg, snap, num_gpu_blocks)),
        (check_blocks_per_request, (cfg, snap)),
        (check_block_sharing, (cfg, snap, tokens)),
        (check_host_blocks, (cfg, snap, in_flight)),
    ):
        run_check(check, *args, departures=departures, seen=seen)


def check_step(
    cfg: dict,
    before: Snapshot,
    step: StepView,
    after: Snapshot,
    *,
    departures: Collection[str] = (),
    seen: Counter[str] | None = None,
) -> None:
    for check in STEP_CHECKS:
        run_check(check, cfg, before, step, after, departures=departures, seen=seen)
