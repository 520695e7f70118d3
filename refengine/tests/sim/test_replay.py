"""The fixed-length serving replay: its scheduling on a stub clock, and the serving-level validation against
measured vLLM runs (Llama-3.1-8B-Instruct-FP8 on an H200)."""

from __future__ import annotations

import pytest

from perf.sim.replay import replay_fixed_lengths
from refengine.sim.cost_model import StepShape
from refengine.tests.sim.silicon import LLAMA_31_8B, best_table_tflops, median_abs, replay_rows

# The targets are a median TPOT error <= 15% and a median TTFT error <= 30%. Measured over all ten rows:
# TTFT 44%, TPOT 54%; the targets are not met (docs/sim-validation.md says why: three rows need more GEMM throughput
# than the measured tables reach). On the four decode-heavy rows (osl >= 1000) TPOT is 12% (target met) and
# TTFT 43% (not met). The bounds pin today's errors with a few points of margin, so they cannot grow unnoticed.
ALL_ROWS_TPOT_MEDIAN_MAX = 0.58
ALL_ROWS_TTFT_MEDIAN_MAX = 0.48
LONG_OUTPUT_TPOT_MEDIAN_MAX = 0.15  # the target, met here
LONG_OUTPUT_TTFT_MEDIAN_MAX = 0.48


class StubCost:
    """One second per step, whatever the step; records the shapes it was asked about."""

    def __init__(self) -> None:
        self.steps: list[StepShape] = []

    def step_seconds(self, step: StepShape) -> float:
        self.steps.append(step)
        return 1.0


def test_one_client_waits_one_step_for_its_first_token() -> None:
    stub = StubCost()
    result = replay_fixed_lengths(stub, isl=10, osl=5, concurrency=1, num_requests=6)
    assert (result.mean_ttft_s, result.mean_tpot_s, result.num_steps, result.duration_s) == (1.0, 1.0, 30, 30.0)
    assert stub.steps[0] == StepShape((10,), (0,), 1)
    assert stub.steps[1] == StepShape((1,), (10,), 1)


def test_prompts_are_chunked_to_the_token_budget() -> None:
    stub = StubCost()
    result = replay_fixed_lengths(stub, isl=20, osl=2, concurrency=2, num_requests=2, max_num_batched_tokens=8)
    # the running prompt is chunked first, the waiting one joins with what is left, decodes go before prefills
    assert [s.new_tokens for s in stub.steps] == [(8,), (8,), (4, 4), (1, 7), (8,), (1,), (1,)]
    assert [s.context_tokens for s in stub.steps] == [(0,), (8,), (16, 0), (20, 4), (11,), (19,), (20,)]
    assert [s.num_sampling_rows for s in stub.steps] == [0, 0, 1, 1, 0, 1, 1]
    assert (result.mean_ttft_s, result.mean_tpot_s, result.num_steps) == (4.5, 1.0, 7)


def test_bad_lengths_name_the_field() -> None:
    with pytest.raises(ValueError, match="osl"):
        replay_fixed_lengths(StubCost(), isl=10, osl=0, concurrency=1)


@pytest.fixture(scope="module")
def silicon_rows():
    return replay_rows()


def test_serving_level_errors_stay_pinned(silicon_rows) -> None:
    assert len(silicon_rows) == 10
    assert median_abs([r.tpot_error for r in silicon_rows]) <= ALL_ROWS_TPOT_MEDIAN_MAX
    assert median_abs([r.ttft_error for r in silicon_rows]) <= ALL_ROWS_TTFT_MEDIAN_MAX
    long = [r for r in silicon_rows if r.osl >= 1000]
    assert median_abs([r.tpot_error for r in long]) <= LONG_OUTPUT_TPOT_MEDIAN_MAX
    assert median_abs([r.ttft_error for r in long]) <= LONG_OUTPUT_TTFT_MEDIAN_MAX


def test_the_short_output_rows_exceed_what_the_gemm_table_allows(silicon_rows) -> None:
    # why the osl = 100 rows cannot be matched: at full concurrency they imply more decoder-linear FLOP/s than any
    # measured GEMM reaches on the H200 (a property of the data, checked so the docs' claim stays true)
    best = best_table_tflops(LLAMA_31_8B)
    over = {(r.isl, r.osl) for r in silicon_rows if r.implied_linear_tflops > best}
    assert over == {(1000, 100), (2000, 100), (4000, 100)}
