"""Serving-level validation through the real engine (refengine/tests/sim/silicon_engine.py): the measured H200
runs replayed by closed-loop clients against LLMEngine(device="sim:h200"), on a fast subset.

Kept fast by replaying the five rows with osl <= 500 except 4000 / 500 (all rows of >= 1000 output tokens take
minutes) with 3 waves of `concurrency` requests each (the full table uses 6), so only the middle wave is measured.
The other half of the check is exact: on every replayed row the engine's steady-state TTFT, TPOT, duration and
step count equal replay_fixed_lengths' bit for bit, so the all-row errors pinned in test_replay.py (cost model
only, fast) are the engine's too. The full table: `python -m refengine.tests.sim.silicon_engine`.
"""

from __future__ import annotations

import pytest

from refengine.tests.sim.silicon import median_abs
from refengine.tests.sim.silicon_engine import engine_rows

WAVES = 3
SUBSET = {(1000, 100), (2000, 100), (4000, 100), (8000, 100), (8000, 500)}
# Measured on this subset at 3 waves: median |TTFT error| 67.7%, median |TPOT error| 100.1%. These are the rows
# the targets (TPOT <= 15%, TTFT <= 30%) miss: their measured runs imply more fp8 GEMM throughput than the
# H200 tables hold (docs/sim-validation.md). The bounds sit a few points above, so the errors cannot grow unnoticed.
SUBSET_TTFT_MEDIAN_MAX = 0.72
SUBSET_TPOT_MEDIAN_MAX = 1.05


@pytest.fixture(scope="module")
def rows():
    return engine_rows(WAVES, lambda isl, osl, conc: (isl, osl) in SUBSET)


def test_the_engine_replays_each_row_exactly_as_the_cost_model_replay(rows) -> None:
    assert {(r.isl, r.osl) for r in rows} == SUBSET
    for r in rows:
        assert r.engine.num_steps > 0 and r.engine == r.replay, (r.isl, r.osl)


def test_serving_level_errors_through_the_engine_stay_pinned(rows) -> None:
    assert median_abs([r.ttft_error for r in rows]) <= SUBSET_TTFT_MEDIAN_MAX
    assert median_abs([r.tpot_error for r in rows]) <= SUBSET_TPOT_MEDIAN_MAX
