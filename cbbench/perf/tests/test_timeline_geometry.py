"""The HTML report's slot timeline against the step records it is drawn from: every rectangle's place and size.

A run's timeline is drawn a rectangle per request stretch (`run_svg`) or, past AGGREGATE_ABOVE_REQUESTS requests or
MAX_STRETCHES stretches, aggregated (`aggregate_svg`): per bin of steps, a stack of the mean number of slots per kind.
Both are read back here from the SVG text alone (x, y, width, height, kind, the hover title) and compared with what
the step records say, counted here without the drawing code: which requests each step scheduled, prefilled, or held
admitted but unscheduled.
"""

from __future__ import annotations

import random
import re

import pytest

from cbbench.perf.report.timeline import assign_slots
from cbbench.perf.report.timeline_svg import (
    AGGREGATE_ABOVE_REQUESTS,
    BIN_PX,
    KINDS,
    MAX_WIDTH_PX,
    SLOT_PX,
    STEP_PX,
    run_svg,
)

COLOURS = [(0.5, 0.5, 0.5)]
IDLE_SHARE = 0.2  # of the running requests, how many sit out a step (drawn "idle": admitted, not scheduled)
# the SVG writes coordinates with two decimals: a drawn length is within half a hundredth of a pixel of its value
PX_TOLERANCE = 0.006

_RECT = re.compile(r"<rect ([^>]*)>(?:<title>([^<]*)</title>)?")
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')
_SVG = re.compile(r'<svg class="([^"]*)" width="([\d.]+)" height="([\d.]+)"')


def continuous_run(num_requests: int, max_num_seqs: int, seed: int) -> list[dict]:
    """Step records of a continuous run: a request joins when a slot is free, prefills for 1-2 steps, decodes for
    1-4, sits out a step now and then; `running_req_ids` is the running set after the step (it has left once done)."""
    rng = random.Random(seed)
    steps: list[dict] = []
    running: list[list] = []  # [request id, prefill steps left, decode steps left]
    nxt = 0
    while nxt < num_requests or running:
        while len(running) < max_num_seqs and nxt < num_requests:
            running.append([str(nxt), rng.randint(1, 2), rng.randint(1, 4)])
            nxt += 1
        scheduled = [r for r in running if rng.random() >= IDLE_SHARE]
        prefill = [r[0] for r in scheduled if r[1] > 0]
        for r in scheduled:
            r[1 if r[1] > 0 else 2] -= 1
        running = [r for r in running if r[1] > 0 or r[2] > 0]
        steps.append(
            {
                "scheduled_req_ids": [r[0] for r in scheduled],
                "running_req_ids": [r[0] for r in running],
                "prefill_req_ids": prefill,
                "batch_id": None,
            }
        )
    return steps


def kinds_per_step(steps: list[dict]) -> list[dict[str, int]]:
    """How many slots each step's records put in each kind (a continuous run, where nothing is held)."""
    out = []
    for s in steps:
        scheduled = set(s["scheduled_req_ids"])
        prefill = len(scheduled & set(s["prefill_req_ids"]))
        idle = len(set(s["running_req_ids"]) - scheduled)
        out.append({"prefill": prefill, "decode": len(scheduled) - prefill, "idle": idle, "held": 0})
    return out


def parse(svg: str) -> tuple[str, float, float, list[dict]]:
    """(class, width, height, rectangles as attribute dicts with their title)."""
    m = _SVG.match(svg)
    assert m, svg[:200]
    rects = [dict(_ATTR.findall(attrs), title=title) for attrs, title in _RECT.findall(svg)]
    return m.group(1), float(m.group(2)), float(m.group(3)), rects


# ---- a rectangle per request stretch ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_each_stretch_is_drawn_where_and_as_long_as_its_steps(seed):
    steps = continuous_run(40, 4, seed)
    svg = run_svg({"steps": steps}, 4, COLOURS)
    cls, width, height, rects = parse(svg)
    assert cls == "timeline-svg" and height == 4 * SLOT_PX
    dx = min(STEP_PX, MAX_WIDTH_PX / len(steps))
    assert width == pytest.approx(len(steps) * dx, abs=0.5)  # (the width attribute is rounded to a pixel)
    drawn: dict[tuple[int, int], tuple[str, str]] = {}  # (step, slot) -> (request, kind)
    title = re.compile(r"request (\S+): (.+), steps (\d+)-(\d+), slot (\d+)")
    for r in rects:
        rid, what, first, last, slot = title.fullmatch(r["title"]).groups()
        first, last, slot = int(first), int(last), int(slot)
        assert (rid, what) == (r["data-request"], KINDS[r["data-kind"]][1])
        assert float(r["x"]) == pytest.approx(first * dx, abs=PX_TOLERANCE)
        assert float(r["width"]) == pytest.approx((last - first + 1) * dx, abs=PX_TOLERANCE)
        assert float(r["y"]) == slot * SLOT_PX and float(r["height"]) == SLOT_PX - 1
        for step in range(first, last + 1):
            assert (step, slot) not in drawn, f"two rectangles cover slot {slot} at step {step}"
            drawn[step, slot] = (rid, r["data-kind"])
    for i, s in enumerate(steps):
        at_step = {rid_kind for (step, _), rid_kind in drawn.items() if step == i}
        scheduled, prefill = set(s["scheduled_req_ids"]), set(s["prefill_req_ids"])
        expected = {(rid, "prefill" if rid in prefill else "decode") for rid in scheduled}
        expected |= {(rid, "idle") for rid in set(s["running_req_ids"]) - scheduled}
        assert at_step == expected, f"step {i}"
    slot_of: dict[str, set[int]] = {}
    for (_, slot), (rid, _) in drawn.items():
        slot_of.setdefault(rid, set()).add(slot)
    assert all(len(slots) == 1 for slots in slot_of.values()), "a request moved between slots"


# ---- aggregated -----------------------------------------------------------------------------------------------------
def _bins(rects: list[dict]) -> list[tuple[int, int, list[dict]]]:
    """(first step, last step, its rectangles bottom up) per bin, left to right."""
    by_x: dict[float, list[dict]] = {}
    for r in rects:
        by_x.setdefault(float(r["x"]), []).append(r)
    out = []
    for x in sorted(by_x):
        stack = by_x[x]
        first, last = map(int, re.match(r"steps (\d+)-(\d+):", stack[0]["title"]).groups())
        assert all(r["title"].startswith(f"steps {first}-{last}:") for r in stack)
        out.append((first, last, sorted(stack, key=lambda r: -float(r["y"]))))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_aggregated_timeline_stacks_each_bins_mean_slots_per_kind(seed):
    max_num_seqs = 3
    steps = continuous_run(AGGREGATE_ABOVE_REQUESTS + 1, max_num_seqs, seed)
    svg = run_svg({"steps": steps}, max_num_seqs, COLOURS)
    cls, width, height, rects = parse(svg)
    assert cls == "timeline-svg aggregated"
    bins = _bins(rects)
    assert height == max_num_seqs * SLOT_PX and width == len(bins) * BIN_PX
    assert len(bins) == min(len(steps), MAX_WIDTH_PX // BIN_PX)  # (a bin whose slots all sat empty draws nothing)
    # the bins cut the run's steps into consecutive ranges, left to right, each drawn one BIN_PX column
    assert bins[0][0] == 0 and bins[-1][1] == len(steps) - 1
    assert all(bins[b + 1][0] == bins[b][1] + 1 for b in range(len(bins) - 1))
    counts = kinds_per_step(steps)
    for b, (first, last, stack) in enumerate(bins):
        assert {float(r["x"]) for r in stack} == {b * BIN_PX} and {r["width"] for r in stack} == {str(BIN_PX)}
        n = last - first + 1
        mean = {k: sum(c[k] for c in counts[first : last + 1]) / n for k in KINDS}
        assert [r["data-kind"] for r in stack] == [k for k in KINDS if mean[k] > 0], f"steps {first}-{last}"
        bottom = height
        for r in stack:
            kind, y, h = r["data-kind"], float(r["y"]), float(r["height"])
            assert h == pytest.approx(mean[kind] * SLOT_PX, abs=PX_TOLERANCE), f"steps {first}-{last}: {kind}"
            assert y + h == pytest.approx(bottom, abs=2 * PX_TOLERANCE), f"steps {first}-{last}: {kind} not stacked"
            assert r["title"].endswith(f" {mean[kind]:.1f} slots {KINDS[kind][1]}")
            bottom = y
        assert bottom >= -PX_TOLERANCE, f"steps {first}-{last}: the stack rises above the figure's top"


def test_an_aggregated_static_run_draws_the_slots_its_cells_hold():
    """A static run's held slots (finished members of a batch still running) are counted as `assign_slots` places
    them: each bin's stack, held included, is its steps' cells, and never more than max_num_seqs slots tall."""
    max_num_seqs, rng = 4, random.Random(5)
    steps: list[dict] = []
    for batch in range(1, 700):
        lengths = {f"b{batch}r{i}": rng.randint(1, 4) for i in range(max_num_seqs)}
        for t in range(max(lengths.values())):
            alive = [rid for rid, n in lengths.items() if t < n]
            after = [rid for rid, n in lengths.items() if t + 1 < n]
            steps.append(
                {
                    "scheduled_req_ids": alive,
                    "running_req_ids": after,
                    "prefill_req_ids": alive if t == 0 else [],
                    "batch_id": batch,
                }
            )
    svg = run_svg({"steps": steps}, max_num_seqs, COLOURS)
    cls, _, height, rects = parse(svg)
    assert cls == "timeline-svg aggregated"
    cells = assign_slots(steps, max_num_seqs)
    assert any(c.kind == "held" for c in cells)
    for first, last, stack in _bins(rects):
        n = last - first + 1
        for r in stack:
            got = sum(1 for c in cells if first <= c.step <= last and c.kind == r["data-kind"])
            assert float(r["height"]) == pytest.approx(got / n * SLOT_PX, abs=PX_TOLERANCE)
        assert min(float(r["y"]) for r in stack) >= -PX_TOLERANCE
        assert sum(float(r["height"]) for r in stack) <= height + len(stack) * PX_TOLERANCE  # (each one rounded)


def test_a_preempted_request_holds_no_slot_while_it_waits():
    """Continuous batching: a request preempted at a step is neither scheduled nor running there. It leaves its slot
    (drawn nowhere until it is readmitted, then wherever a slot is free), never drawn as a slot held by a finished
    static-batch member, which it is not."""

    def step(scheduled, running, prefill=()):
        return {"scheduled_req_ids": scheduled, "running_req_ids": running, "prefill_req_ids": list(prefill)}

    steps = [
        step(["a", "b"], ["a", "b"], prefill=["a", "b"]),
        step(["a", "b"], ["a", "b"]),
        step(["a"], ["a"]),  # b is preempted: a needed its blocks
        step(["a", "c"], [], prefill=["c"]),  # c is admitted into the free slot; a and c both finish
        step(["b"], ["b"], prefill=["b"]),  # b is readmitted
    ]
    for s in steps:
        s["batch_id"] = None
    cells = assign_slots(steps, 2)
    assert not [c for c in cells if c.kind == "held"]
    assert [(c.step, c.slot, c.request_id, c.kind) for c in cells if c.step in (2, 3)] == [
        (2, 0, "a", "decode"),
        (3, 0, "a", "decode"),
        (3, 1, "c", "prefill"),
    ]
