"""The planted bugs of the report side: the HTML report's slot timeline, drawn from a run's step records."""

from __future__ import annotations

from conformance.mutants.mutant import REPORT_TESTS, TIMELINE_SVG, Mutant, mutant

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
]
