"""An adapter's declared departures (SchedulerAdapter.departures) excuse exactly the invariants they name: the
state machine's checks count those violations and raise every other one."""

from __future__ import annotations

from collections import Counter

import pytest

from conformance import invariants as inv


def _violates(name: str):
    def check() -> None:
        inv._fail(name, "planted")

    return check


def test_a_departure_is_counted_and_every_other_violation_raised():
    seen: Counter[str] = Counter()
    departures = {"preemption_victim"}
    inv.run_check(_violates("preemption_victim"), departures=departures, seen=seen)
    inv.run_check(_violates("preemption_victim"), departures=departures, seen=seen)
    assert seen == {"preemption_victim": 2}
    with pytest.raises(inv.InvariantViolation, match="invariant `token_budget` violated") as info:
        inv.run_check(_violates("token_budget"), departures=departures, seen=seen)
    assert info.value.invariant == "token_budget" and seen == {"preemption_victim": 2}


def test_without_departures_every_violation_raises():
    with pytest.raises(inv.InvariantViolation, match="preemption_victim"):
        inv.run_check(_violates("preemption_victim"))
