"""`--backend openai|openai-chat` with a multi-turn workload: each conversation is a chain of requests.

A conversation's first turn is sent at its arrival; turn k when turn k - 1's answer has returned, with the history
as its prefix (`conversations.TurnFeeder`): openai-chat sends it as user / assistant messages, openai as token ids
(the answer's text re-encoded by the workloads' tokenizer: a completions stream carries text, not ids) or, with
`--prompt-format text`, as one text. A failed turn ends its conversation: the later turns are error records, so a
run's records still cover every request of the workload.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from cbbench.perf.backends.conversations import TurnFeeder, tag_record
from cbbench.perf.backends.http_client import HttpTarget, Slots, error_record, scheduled, stream_request
from cbbench.perf.records import RequestRecord


def _prompt(target: HttpTarget, feeder: TurnFeeder, i: int, text_of: Callable[[Any], str]) -> Any:
    if target.backend == "openai-chat":
        return feeder.messages(i, text_of)
    return feeder.prompt_ids(i) if target.prompt_format == "ids" else feeder.prompt_text(i, text_of)


async def replay_turns(
    target: HttpTarget,
    requests: Sequence[Any],
    *,
    text_of: Callable[[Any], str],
    tokenizer: Any,
    session: aiohttp.ClientSession,
    max_concurrency: int | None = None,
    progress: Any = None,
) -> tuple[list[RequestRecord], float, float]:
    """Replay the conversations of `requests`; returns (records in request order, t0, the time the last ended)."""
    if target.prompt_format == "ids" and target.backend == "openai" and tokenizer is None:
        raise ValueError(
            "tokenizer: a multi-turn run over /v1/completions with token ids needs a tokenizer "
            "to turn each answer back into the ids of the next turn's history"
        )
    feeder = TurnFeeder(requests)
    slots = Slots(max_concurrency)
    records: list[RequestRecord | None] = [None] * len(requests)
    t0 = time.perf_counter()

    async def chain(start: float, i: int | None) -> None:
        await asyncio.sleep(max(0.0, t0 + start - time.perf_counter()))
        due = t0 + start  # a later turn: due when its previous answer has been read (re-encoding it is the client's)
        while i is not None:
            r = requests[i]
            freed = await slots.take()
            try:
                rec = await stream_request(
                    session,
                    target,
                    str(i),
                    _prompt(target, feeder, i, text_of),
                    len(feeder.prompt_ids(i)),
                    r.output_len,
                    tokenizer,
                )
            finally:
                slots.give()
            records[i], due = tag_record(scheduled(rec, max(due, freed)), r), time.perf_counter()
            if progress:
                progress(1, [rec])
            if rec.finish_reason == "error":
                for j in feeder.abandon(i):
                    records[j] = tag_record(
                        error_record(
                            str(j),
                            requests[j].prompt_len,
                            requests[j].output_len,
                            time.perf_counter(),
                            f"an earlier turn of its conversation failed (request {i})",
                        ),
                        requests[j],
                    )
                    if progress:
                        progress(1)
                return
            ids = tokenizer.encode(rec.text) if tokenizer is not None and rec.text else []
            feeder.finished(i, time.perf_counter() - t0, ids, rec.text)
            i = feeder.next_turn(i)

    await asyncio.gather(*(chain(at, i) for at, i in feeder.starts()))
    return [r for r in records if r is not None], t0, time.perf_counter()
