"""The planted bugs of the report side: the HTML report's charts, drawn from a run's step records, rows and scraped
server metrics."""

from __future__ import annotations

from conformance.mutants.mutant import FRONTIER_SVG, REPORT_TESTS, SERVER_SERIES, TIMELINE, TIMELINE_SVG, Mutant, mutant

REPORT_MUTANTS: list[Mutant] = [
    mutant(
        "timeline-agg-bins-rounded",
        TIMELINE_SVG,
        "    starts = [-(-b * steps // bins) for b in range(bins + 1)]\n",
        "    starts = [round(b * steps / bins) for b in range(bins + 1)]\n",
        REPORT_TESTS,
        "aggregated timeline: a bin's steps are named and counted by rounding, its cells placed by flooring",
    ),
    mutant(
        "timeline-agg-kinds-overlap",
        TIMELINE_SVG,
        "            y -= h\n",
        "            y = height - h\n",
        REPORT_TESTS,
        "aggregated timeline: every kind's bar starts at the bottom, so they overlap instead of stacking",
    ),
    mutant(
        "timeline-stretch-one-step-wide",
        TIMELINE_SVG,
        'width="{(b - a) * dx:.2f}"',
        'width="{(b - a + 1) * dx:.2f}"',
        REPORT_TESTS,
        "timeline: a stretch's end (last step + 1) is read as its last step: each rectangle one step too wide",
    ),
    mutant(
        "frontier-y-not-inverted",
        FRONTIER_SVG,
        "        return TOP + h * (1 - v / yt[-1])\n",
        "        return TOP + h * v / yt[-1]\n",
        REPORT_TESTS,
        "capacity plan chart: throughput per GPU drawn from the top down (SVG's y grows downwards)",
    ),
    mutant(
        "series-kv-usage-as-fraction",
        SERVER_SERIES,
        '    return float(v) * 100 if key == "kv_usage" else float(v)\n',
        "    return float(v)\n",
        REPORT_TESTS,
        "/metrics chart: KV usage, a fraction, drawn on the 0-100 % axis unscaled",
    ),
    mutant(
        "timeline-preempted-holds-slot",
        TIMELINE,
        "        for rid in [r for r in slot_of if r not in present and r not in batch_of]:\n"
        "            free.append(slot_of.pop(rid))  # preempted since the last step: it waits, holding no slot\n",
        "",
        REPORT_TESTS,
        "timeline: a request preempted in continuous mode keeps its slot a step, drawn as a static batch's held slot",
    ),
]
