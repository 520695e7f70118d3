"""vLLM's recorded decisions, replayed: the scheduler under test (refengine by default, any adapter with --engine)
makes the same decisions as vLLM 0.33's own V1 scheduler did, at every step of every recorded trace, with no vLLM
installed.

The corpus (conformance/traces/vllm_decisions.jsonl.gz) was recorded once by `python -m conformance.record_traces`
(ci/record_vllm_traces.sh) over the 16 configurations the vLLM differential draws (fcfs/priority, prefix caching,
chunked prefill, sync/async scheduling; preemption, aborts and exact (priority, arrival_time) ties among them). Each
trace holds the operations (requests, arrival steps, aborts, the fake sampler's seed) and vLLM's record of every
step: the scheduled tokens in order, the preempted ids in order, the admitted ids, the free blocks, every running
request's computed tokens, placeholders and block ids, the waiting requests, the finished ids; then each request's
final output length and finish_reason. A failure names the trace and its first diverging step.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest

from conformance.adapters.refengine_adapter import RefEngineAdapter
from conformance.record_traces import CORPUS
from conformance.sched_traces import TraceDivergence, replay
from refengine.scheduler import Scheduler

MIN_TRACES = 200  # the corpus must stay at least this large: a re-record with fewer is a mistake


def _load() -> tuple[dict, list[dict]]:
    with gzip.open(CORPUS, "rt") as f:
        rows = [json.loads(line) for line in f]
    return rows[0], rows[1:]


HEADER, ROWS = _load()


def test_corpus_covers_what_it_is_for():
    """The corpus spans every configuration and exercises preemption, aborts, prefix hits and exact ties."""
    stats = HEADER["stats"]
    assert stats["traces"] == len(ROWS) >= MIN_TRACES, stats
    configs = {row["id"].rsplit("-", 1)[0] for row in ROWS}
    assert len(configs) == 16, sorted(configs)
    for what in ("with_preemption", "with_exact_ties", "with_aborts", "with_prefix_hits"):
        assert stats[what] > 0, (what, stats)


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_replay_matches_vllm(adapter_cls, row):
    reason = adapter_cls.supports(row["knobs"]) if hasattr(adapter_cls, "supports") else None
    departures = sorted(getattr(adapter_cls, "departures", {}))
    if reason is None and departures:
        reason = (
            f"{adapter_cls.name} departs from vLLM's rules by design ({', '.join(departures)}): a replay of vLLM's "
            "own decisions does not apply to it"
        )
    if reason is not None:
        pytest.skip(reason)
    try:
        replay(adapter_cls, row, HEADER["recorded_with"])
    except TraceDivergence as e:  # the message is the report: the trace, its first diverging step, both views
        pytest.fail(str(e), pytrace=False)


class _PreemptedToBack(RefEngineAdapter):
    """A planted bug: a preempted request re-enters the waiting queue at its back (FCFS), not its front."""

    class scheduler_cls(Scheduler):
        def _preempt(self, req, step) -> None:
            super()._preempt(req, step)
            if self.config.policy == "fcfs":
                self.waiting.remove(req)
                self.waiting.add(req)


def test_replay_catches_a_waiting_order_bug_after_preemption():
    """The corpus bites: the planted bug diverges from vLLM on some trace, and the report names the first step."""
    failures = []
    for row in ROWS:
        try:
            replay(_PreemptedToBack, row, HEADER["recorded_with"])
        except TraceDivergence as e:
            failures.append(str(e))
    assert failures, "no recorded trace tells a preempted request sent to the back of the queue"
    assert re.match(r"trace \S+ \(recorded with vllm .*\): first divergence at step \d+: ", failures[0]), failures[0]
