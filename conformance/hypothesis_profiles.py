"""The suite's Hypothesis profiles, chosen by CBBENCH_HYPOTHESIS_PROFILE (conftest.py loads one before any test
module is imported), and `scaled`, which sizes a test's own example count to the profile loaded.

  fast      the default (.ci/run, `pytest conformance/ perf/tests/ refengine/tests/`): 30 examples, 40 steps per state machine
  ci        the former default: 100 examples, 40 steps
  thorough  the nightly run (.github/workflows/nightly.yml): 1500 examples, 80 steps

Only the number of examples changes between fast and ci: every property, strategy and invariant is the same, and
the state machines keep their step count, so the planted-bug tests (test_suite_bites.py, whose example counts are
their own) search exactly as before.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "CBBENCH_HYPOTHESIS_PROFILE"
CI_EXAMPLES = 100  # the `ci` profile's count, against which `scaled` counts are written

# Stateful scheduler runs are many small steps each; `deadline=None` because a shared 2-core CI box makes per-example
# timing meaningless, and too_slow is suppressed for the same reason.
_COMMON = dict(
    deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
settings.register_profile("fast", max_examples=30, stateful_step_count=40, **_COMMON)
settings.register_profile("ci", max_examples=CI_EXAMPLES, stateful_step_count=40, **_COMMON)
settings.register_profile("thorough", max_examples=1500, stateful_step_count=80, **_COMMON)


def load() -> str:
    name = os.environ.get(PROFILE_ENV, "fast")
    settings.load_profile(name)
    return name


def scaled(n_at_ci: int, minimum: int = 20) -> int:
    """A test's own max_examples, written as its count under `ci`, in proportion to the profile loaded."""
    return max(minimum, n_at_ci * settings.default.max_examples // CI_EXAMPLES)
