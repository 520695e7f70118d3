"""Multi-turn replay shared by the runners: which request is due when, each turn's prompt, and the turn metrics.

A multi-turn workload (`workloads/multiturn.py`) holds each turn's new user message only. `TurnFeeder` hands a
runner the requests in the order they become due: a plain request (and a conversation's first turn) at its own
arrival time; turn k of a conversation the moment turn k - 1's answer has returned, with the conversation so far as
its prefix: every earlier user message and the tokens actually generated for it (`finished`), so a later turn's
prompt is exactly what a prefix cache saw before. The prompt is token ids (`prompt_ids`: in-process, and the
completions endpoint's ids format), one text (`prompt_text`: completions' text format), or chat messages
(`messages`: openai-chat).

`conversation_metrics` adds per-turn and per-conversation figures to a run's metrics (the CSV's `extra`, the JSON
rows): `ttft_by_turn_ms` (mean TTFT of the k-th turns, k = 0, 1, ...), `mean_conversation_latency_ms` /
`median_conversation_latency_ms` (first turn's arrival to last turn's finish) and `num_conversations`.
"""

from __future__ import annotations

import dataclasses
import heapq
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cbbench.perf.records import RequestRecord

CONVERSATION_KEYS = ("conversation_id", "turn")
_NOT_DONE = ("error", "abort")  # turns left out of the turn metrics (no TTFT to speak of)


@dataclass
class _Exchange:
    """One earlier turn of a conversation: the user's message and the answer that came back."""

    request: Any
    answer_ids: list[int]
    answer_text: str | None


@dataclass
class TurnFeeder:
    """The requests of a workload in the order they become due (see the module docstring); times are seconds from
    the run's start."""

    requests: Sequence[Any]
    _heap: list[tuple[float, int]] = field(default_factory=list)
    _next: dict[int, int] = field(default_factory=dict)
    _history: dict[int, list[_Exchange]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        turns: dict[int, list[int]] = {}
        for i, r in enumerate(self.requests):
            if r.conversation_id is None:
                self._heap.append((r.arrival_time, i))
            else:
                turns.setdefault(r.conversation_id, []).append(i)
        for idx in turns.values():
            idx.sort(key=lambda i: self.requests[i].turn)
            self._heap.append((self.requests[idx[0]].arrival_time, idx[0]))
            self._next.update(zip(idx, idx[1:]))
        heapq.heapify(self._heap)  # (due, index): ties in workload order, as a stable sort by arrival

    def next_due(self) -> float | None:
        """When the next request is due, or None while none is (the rest wait for an answer, or all were sent)."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> tuple[int, float] | None:
        """The next request due by `now` as (index, due time), or None."""
        if self._heap and self._heap[0][0] <= now:
            due, i = heapq.heappop(self._heap)
            return i, due
        return None

    def finished(self, i: int, now: float, answer_ids: Sequence[int] = (), answer_text: str | None = None) -> None:
        """Request i's answer returned at `now`: its conversation's next turn is due now, with this exchange in its
        history."""
        r = self.requests[i]
        if r.conversation_id is None:
            return
        self._history.setdefault(r.conversation_id, []).append(_Exchange(r, list(answer_ids), answer_text))
        if i in self._next:
            heapq.heappush(self._heap, (now, self._next[i]))

    def starts(self) -> list[tuple[float, int]]:
        """(arrival, index) of each plain request and each conversation's first turn, in arrival order."""
        return sorted(self._heap)

    def next_turn(self, i: int) -> int | None:
        """The index of the turn after request i in its conversation, or None."""
        return self._next.get(i)

    def abandon(self, i: int) -> list[int]:
        """Request i failed: the indices of its conversation's later turns, which will not be sent."""
        out = []
        while i in self._next:
            i = self._next.pop(i)
            out.append(i)
        return out

    def _past(self, i: int) -> list[_Exchange]:
        r = self.requests[i]
        return self._history.get(r.conversation_id, []) if r.conversation_id is not None and r.turn > 0 else []

    def prompt_ids(self, i: int) -> list[int]:
        """Request i's prompt as token ids: the history's user messages and answers, then its own message."""
        out: list[int] = []
        for ex in self._past(i):
            out += list(ex.request.prompt_token_ids) + ex.answer_ids
        return out + list(self.requests[i].prompt_token_ids)

    def prompt_text(self, i: int, text_of: Callable[[Any], str]) -> str:
        """Request i's prompt as one text (`text_of(request)` gives a request's own message)."""
        parts = []
        for ex in self._past(i):
            parts += [text_of(ex.request), ex.answer_text or ""]
        return "".join(parts) + text_of(self.requests[i])

    def messages(self, i: int, text_of: Callable[[Any], str]) -> list[dict[str, str]]:
        """Request i's prompt as chat messages: user / assistant pairs of the history, then its own message."""
        out = []
        for ex in self._past(i):
            out += [
                {"role": "user", "content": text_of(ex.request)},
                {"role": "assistant", "content": ex.answer_text or ""},
            ]
        return out + [{"role": "user", "content": text_of(self.requests[i])}]


def tag_record(rec: RequestRecord, request: Any) -> RequestRecord:
    """The record of a conversation's turn carries its conversation id and turn (in its JSON entry too)."""
    if request.conversation_id is None:
        return rec
    layout = rec.layout + tuple(k for k in CONVERSATION_KEYS if k not in rec.layout)
    return dataclasses.replace(rec, conversation_id=request.conversation_id, turn=request.turn, layout=layout)


def conversation_metrics(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Per-turn and per-conversation metrics (see the module docstring); {} for a run without conversations."""
    by_turn: dict[int, list[float]] = {}
    convs: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.conversation_id is None:
            continue
        convs.setdefault(r.conversation_id, []).append(r)
        if r.finish_reason not in _NOT_DONE and r.first_token_time is not None:
            by_turn.setdefault(r.turn or 0, []).append((r.first_token_time - r.arrival_time) * 1e3)
    if not convs:
        return {}
    # a conversation's latency counts only if every turn completed (a cut conversation has no end to time)
    lat = []
    for rs in convs.values():
        ends = [r.finish_time for r in rs if r.finish_reason not in _NOT_DONE and r.finish_time is not None]
        if len(ends) == len(rs):
            lat.append((max(ends) - min(r.arrival_time for r in rs)) * 1e3)
    nan = float("nan")
    return {
        "num_conversations": len(convs),
        "ttft_by_turn_ms": [
            statistics.fmean(by_turn[k]) if by_turn.get(k) else nan for k in range(max(by_turn, default=-1) + 1)
        ],
        "mean_conversation_latency_ms": statistics.fmean(lat) if lat else nan,
        "median_conversation_latency_ms": statistics.median(lat) if lat else nan,
    }


def conversation_note(label: str, metrics: dict[str, Any]) -> list[str]:
    """The line under the table for a multi-turn run: TTFT by turn and the conversation latency."""
    if not metrics.get("num_conversations"):
        return []
    ttft = ", ".join(f"{v:.1f}" for v in metrics["ttft_by_turn_ms"])
    return [
        f"{label}: {metrics['num_conversations']} conversations; mean TTFT by turn (ms): {ttft}; "
        f"conversation latency mean {metrics['mean_conversation_latency_ms']:.1f} ms, median "
        f"{metrics['median_conversation_latency_ms']:.1f} ms"
    ]
