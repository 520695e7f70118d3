"""Waiting queues: FCFS (a deque; preempted requests go back to the front) and priority (sorted by
(priority, arrival_time, request_id); lower value = more urgent; exact ties fall to the request id, compared as a
string, as vLLM's Request.__lt__ does)."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from refengine.config import POLICIES, SchedulingPolicy
from refengine.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._q.append(request)

    def prepend(self, request: Request) -> None:
        self._q.appendleft(request)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, request: Request) -> None:
        self._q.remove(request)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)

    def __len__(self) -> int:
        return len(self._q)

    def __contains__(self, request: object) -> bool:
        return request in self._q


class PriorityQueue:
    """Kept sorted, so that iteration is scheduling order; a preempted request re-enters at its key."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, float, str]] = []
        self._reqs: list[Request] = []

    def add(self, request: Request) -> None:
        key = (request.priority, request.arrival_time, request.request_id)  # ids are unique: a total order
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._reqs.insert(i, request)

    prepend = add

    def peek(self) -> Request:
        return self._reqs[0]

    def pop(self) -> Request:
        self._keys.pop(0)
        return self._reqs.pop(0)

    def remove(self, request: Request) -> None:
        i = next(i for i, r in enumerate(self._reqs) if r is request)
        del self._keys[i], self._reqs[i]

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._reqs))

    def __len__(self) -> int:
        return len(self._reqs)

    def __contains__(self, request: object) -> bool:
        return any(r is request for r in self._reqs)


def create_request_queue(policy: str) -> FCFSQueue | PriorityQueue:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return PriorityQueue() if SchedulingPolicy(policy) is SchedulingPolicy.PRIORITY else FCFSQueue()
