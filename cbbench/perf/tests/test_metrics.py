"""Metric formulas on a hand-made trace, against values computed by hand (see the comments)."""

from __future__ import annotations

import math

import pytest

from cbbench.perf.metrics import (
    RECORD_KEYS,
    compute_metrics,
    parse_goodput,
    parse_metric_percentiles,
    per_request_metrics,
    stat_keys,
    step_metrics,
)

# float sums of seconds converted to ms: equal to the hand values up to rounding
REL = 1e-9


def rec(rid, prompt_len, token_times, *, arrival, scheduled, preempt=0, cached=0, reason="length"):
    return {
        "request_id": rid,
        "prompt_len": prompt_len,
        "output_len": len(token_times),
        "arrival_time": arrival,
        "first_scheduled_time": scheduled,
        "first_token_time": token_times[0] if token_times else None,
        "token_times": token_times,
        "finish_time": token_times[-1] if token_times else None,
        "num_preemptions": preempt,
        "num_cached_tokens": cached,
        "finish_reason": reason,
    }


# r0: TTFT 1.0, E2EL 2.5, TPOT (2.5 - 1.0) / 2 = 0.75, ITL 0.5 and 1.0, queue 0.5, one preemption
# r1: one token: TTFT 1.0, E2EL 1.0, no TPOT, no ITL, queue 0, 16 prompt tokens from the prefix cache
# r2: TTFT 0.5, E2EL 1.5, TPOT 1.0, ITL 1.0, queue 0
# r3: aborted: in no statistic
TRACE = [
    rec("r0", 10, [1.0, 1.5, 2.5], arrival=0.0, scheduled=0.5, preempt=1),
    rec("r1", 20, [2.0], arrival=1.0, scheduled=1.0, cached=16),
    rec("r2", 30, [0.5, 1.5], arrival=0.0, scheduled=0.0, reason="stop"),
    rec("r3", 5, [], arrival=0.0, scheduled=None, reason="abort"),
]
DURATION = 4.0

# a static batch of r0 (3 tokens) and r1 (1 token): prefill step, then two decode steps where r1's slot is held idle
STEPS = [
    {
        "num_scheduled_tokens": 30,
        "num_running": 2,
        "num_waiting": 1,
        "num_prefill_tokens": 30,
        "num_decode_tokens": 0,
        "kv_blocks_used": 4,
        "slots_held": 2,
        "time": 1.0,
    },
    {
        "num_scheduled_tokens": 1,
        "num_running": 1,
        "num_waiting": 1,
        "num_prefill_tokens": 0,
        "num_decode_tokens": 1,
        "kv_blocks_used": 3,
        "slots_held": 2,
        "time": 1.5,
    },
    {
        "num_scheduled_tokens": 1,
        "num_running": 1,
        "num_waiting": 1,
        "num_prefill_tokens": 0,
        "num_decode_tokens": 1,
        "kv_blocks_used": 3,
        "slots_held": 2,
        "time": 2.5,
    },
]


@pytest.fixture(scope="module")
def m():
    return compute_metrics(
        TRACE,
        DURATION,
        steps=STEPS,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        num_gpu_blocks=8,
        goodput={"ttft": 1000, "tpot": 800},
    )


def test_counts_and_throughputs(m):
    assert (m["completed"], m["failed"]) == (3, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 6)
    assert m["request_throughput"] == pytest.approx(3 / 4, rel=REL)
    assert m["output_throughput"] == pytest.approx(6 / 4, rel=REL)
    assert m["total_token_throughput"] == pytest.approx(66 / 4, rel=REL)
    assert m["duration"] == DURATION


def test_ttft(m):
    # [1000, 1000, 500] ms: mean 833.33, median 1000, population std sqrt((2 * 166.67^2 + 333.33^2) / 3)
    assert m["mean_ttft_ms"] == pytest.approx(2500 / 3, rel=REL)
    assert m["median_ttft_ms"] == pytest.approx(1000, rel=REL)
    assert m["std_ttft_ms"] == pytest.approx(math.sqrt((2 * (500 / 3) ** 2 + (1000 / 3) ** 2) / 3), rel=REL)
    # linear interpolation on [500, 1000, 1000]: p50 at index 1.0, p90 at 1.8, p99 at 1.98
    assert m["p50_ttft_ms"] == m["p90_ttft_ms"] == m["p99_ttft_ms"] == pytest.approx(1000, rel=REL)


def test_tpot_excludes_one_token_requests(m):
    # [750, 1000] ms (r1 has one token)
    assert m["mean_tpot_ms"] == pytest.approx(875, rel=REL)
    assert m["median_tpot_ms"] == pytest.approx(875, rel=REL)
    assert m["std_tpot_ms"] == pytest.approx(125, rel=REL)
    assert m["p90_tpot_ms"] == pytest.approx(750 + 0.9 * 250, rel=REL)


def test_itl_pools_every_gap(m):
    # r0: 500, 1000; r2: 1000
    assert m["mean_itl_ms"] == pytest.approx(2500 / 3, rel=REL)
    assert m["median_itl_ms"] == pytest.approx(1000, rel=REL)
    assert m["p50_itl_ms"] == pytest.approx(1000, rel=REL)


def test_e2el_and_queue(m):
    # E2EL [2500, 1000, 1500]; queue [500, 0, 0]
    assert m["mean_e2el_ms"] == pytest.approx(5000 / 3, rel=REL)
    assert m["median_e2el_ms"] == pytest.approx(1500, rel=REL)
    assert m["p99_e2el_ms"] == pytest.approx(1500 + 0.98 * 1000, rel=REL)
    assert m["mean_queue_ms"] == pytest.approx(500 / 3, rel=REL)
    assert m["median_queue_ms"] == 0.0
    assert m["p99_queue_ms"] == pytest.approx(0.98 * 500, rel=REL)


def test_goodput_follows_vllm():
    # ttft <= 1000 and tpot <= 800: r0 (1000, 750) good, r1 (1000, one token counts as tpot 0) good,
    # r2 (500, 1000) fails tpot -> 2 good requests / 4 s
    m = compute_metrics(TRACE, DURATION, goodput={"ttft": 1000, "tpot": 800})
    assert m["request_goodput"] == pytest.approx(0.5, rel=REL)
    assert compute_metrics(TRACE, DURATION, goodput={"e2el": 1500})["request_goodput"] == pytest.approx(0.5)
    assert compute_metrics(TRACE, DURATION, goodput={"ttft": 499})["request_goodput"] == 0.0
    assert math.isnan(compute_metrics(TRACE, DURATION)["request_goodput"])
    assert parse_goodput(["ttft:1000", "tpot:800"]) == {"ttft": 1000.0, "tpot": 800.0}
    for bad in (["ttfb:10"], ["ttft=10"], ["ttft:-1"]):
        with pytest.raises(ValueError, match="goodput"):
            parse_goodput(bad)


def test_engine_side_metrics(m):
    assert m["num_preemptions"] == 1
    assert math.isnan(m["recomputed_tokens"])
    assert m["prefix_cache_hit_rate"] == pytest.approx(16 / 60, rel=REL)
    assert m["peak_kv_blocks"] == 4 and m["peak_kv_usage"] == pytest.approx(0.5)
    assert m["mean_slot_utilisation"] == pytest.approx((2 + 1 + 1) / 3 / 4, rel=REL)
    assert m["mean_token_budget_utilisation"] == pytest.approx((30 + 1 + 1) / 3 / 64, rel=REL)
    # 6 slot-steps held for 4 useful ones: B * max(L) / sum(L) = 2 * 3 / (3 + 1)
    assert m["slot_waste"] == pytest.approx(1.5, rel=REL)
    assert compute_metrics(TRACE, DURATION, recomputed_tokens=12)["recomputed_tokens"] == 12


def test_continuous_steps_have_no_slot_waste():
    steps = [{k: v for k, v in s.items() if k != "slots_held"} for s in STEPS]
    assert math.isnan(step_metrics(steps, max_num_seqs=4, max_num_batched_tokens=64)["slot_waste"])
    assert math.isnan(step_metrics([])["peak_kv_blocks"])


def test_percentile_keys_and_validation():
    m = compute_metrics(TRACE, DURATION, metric_percentiles=[25, 99.9])
    assert "p25_ttft_ms" in m and "p99.9_e2el_ms" in m and "p99_ttft_ms" not in m
    assert m["p25_ttft_ms"] == pytest.approx(750, rel=REL)  # index 0.5 between 500 and 1000
    assert stat_keys("ttft") == [
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p50_ttft_ms",
        "p90_ttft_ms",
        "p99_ttft_ms",
    ]
    assert parse_metric_percentiles("50,90,99") == [50.0, 90.0, 99.0]
    with pytest.raises(ValueError, match="metric_percentiles"):
        parse_metric_percentiles("0,100")
    with pytest.raises(ValueError, match="token_times"):
        compute_metrics([{**TRACE[0], "output_len": 2}], DURATION)
    with pytest.raises(ValueError, match="missing key"):
        compute_metrics([{k: v for k, v in TRACE[0].items() if k != "finish_reason"}], DURATION)
    with pytest.raises(ValueError, match="duration"):
        compute_metrics(TRACE, 0.0)


def test_one_token_outputs_only_give_nan_tpot():
    m = compute_metrics([TRACE[1]], 1.0)
    assert math.isnan(m["mean_tpot_ms"]) and math.isnan(m["mean_itl_ms"])
    assert m["mean_ttft_ms"] == pytest.approx(1000, rel=REL)


def test_per_request_metrics():
    out = per_request_metrics(TRACE[:3])
    assert [o["request_id"] for o in out] == ["r0", "r1", "r2"]
    assert out[0]["tpot_ms"] == pytest.approx(750) and out[1]["tpot_ms"] is None
    assert out[0]["itl_ms"] == pytest.approx([500, 1000]) and out[0]["queue_ms"] == pytest.approx(500)
    assert set(TRACE[0]) == set(RECORD_KEYS)
