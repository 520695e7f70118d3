"""Whether one run of one arm may be judged: a run with failed requests, or with a figure no sound run can make, is an
error of its arm (head: the change broke the benchmark; base: nothing to judge against), never a ratio.

The checks read the run's own files with this tree's code, whatever code the arm ran, so an older base whose perf
made none of these checks is held to them too:
- its rows: `failed` is 0; every metric is a number (NaN: not measured), finite and >= 0; a run with output took
  at least `MIN_RUN_S` and made at most `MAX_TOKENS_PER_S`;
- its request records (completed ones): the counts are whole numbers >= 0; the clock runs forward (arrival <= first
  token <= finish, the finish after the arrival for any output, token and chunk times in order, none before the
  arrival); the usage agrees with the stream (no more tokens than the request's max_tokens, no fewer than the
  content chunks streamed, each of which carries one token or more).
A failed request is left out of every statistic by perf, so a server that fails half its requests could make its
arm look faster; a usage that reports 1000x the tokens streamed makes every throughput 1000x; a clock that stops
makes the throughput near infinite and a latency zero or negative.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from cbbench.perf.results.columns import METRIC_COLUMNS

NOT_COMPLETED = ("abort", "error")
# Figures no machine makes, so a clock that (all but) stopped: a billion tokens a second is three orders of magnitude
# beyond a whole GPU cluster's decode rate, and a run that streamed tokens took more than a microsecond (a clock's
# resolution is nanoseconds; one decode step of the smallest model is tens of microseconds).
MAX_TOKENS_PER_S = 1e9
MIN_RUN_S = 1e-6
THROUGHPUTS = ("output_throughput", "total_token_throughput")
SHOWN = 3  # problems named in one message; the rest are counted


def _num(v: object) -> float | None:
    """A cell as a float (None for an empty cell, NaN for text: not a number)."""
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        return math.nan
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))
    except ValueError:
        return math.nan


def row_problems(row: Mapping[str, object]) -> list[str]:
    """What makes one result row unsound (empty when it may be judged)."""
    out = []
    failed = _num(row.get("failed"))
    if failed is not None and not (math.isnan(failed) or failed == 0):
        total = (_num(row.get("completed")) or 0) + failed
        out.append(f"failed {failed:g} of {total:g} requests")
    for m in METRIC_COLUMNS:
        raw = row.get(m)
        v = _num(raw)
        if v is None or (math.isnan(v) and isinstance(raw, float)):
            continue  # not measured
        if math.isnan(v):
            out.append(f"{m} is {raw!r}, not a number")
        elif not math.isfinite(v) or v < 0:
            out.append(f"{m} is {v:g}")
    duration = _num(row.get("duration"))
    tokens = _num(row.get("total_output_tokens")) or 0.0
    if duration is not None and math.isfinite(duration) and 0 <= duration < MIN_RUN_S and tokens > 0:
        out.append(f"duration is {duration:g} s for {tokens:g} output tokens (a clock that stopped)")
    for m in THROUGHPUTS:
        v = _num(row.get(m))
        if v is not None and math.isfinite(v) and v > MAX_TOKENS_PER_S:
            out.append(f"{m} is {v:.3g} tok/s, beyond any machine (a clock that stopped)")
    return out


def _times(rec: Mapping[str, object], key: str) -> list[float] | None:
    v = rec.get(key)
    if v is None:
        return None
    if not isinstance(v, list):
        return [math.nan]
    return [t if isinstance(t, (int, float)) and not isinstance(t, bool) else math.nan for t in v]


def record_problem(rec: Mapping[str, object]) -> str | None:
    """What makes one completed request's record impossible, in a few words (None when it is sound)."""
    counts = {}
    for key in ("prompt_len", "output_len", "requested_output_len"):
        v = rec.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v != int(v):
            return f"{key} is {v!r}, not a count"
        counts[key] = int(v)
    raw = [rec.get(k) for k in ("arrival_time", "first_token_time", "finish_time")]
    stamps = [t for t in raw if t is not None]
    if any(isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) for t in stamps):
        return "a time is not a finite number"
    arrival, first, finish = (float(t) if isinstance(t, (int, float)) else None for t in raw)
    if first is not None and arrival is not None and first < arrival:
        return "its first token came before its arrival (a clock that ran backwards)"
    if finish is not None and first is not None and finish < first:
        return "it finished before its first token (a clock that ran backwards)"
    n = counts.get("output_len", 0)
    if finish is not None and arrival is not None and n > 0 and not finish > arrival:
        return "it finished no later than it arrived (a clock that stopped)"
    for key in ("token_times", "chunk_times"):
        ts = _times(rec, key)
        if ts is None:
            continue
        if any(math.isnan(t) or not math.isfinite(t) for t in ts):
            return f"{key} holds a value that is not a finite number"
        if any(b < a for a, b in zip(ts, ts[1:])) or (ts and arrival is not None and ts[0] < arrival):
            return f"its {key} run backwards"
    want = counts.get("requested_output_len")
    if want is not None and "output_len" in counts and n > want:
        return f"it reports {n} output tokens for max_tokens {want}"
    chunks = rec.get("chunk_times")
    if isinstance(chunks, list) and rec.get("output_len_source") == "usage" and n < len(chunks):
        return f"its usage reports {n} output tokens, fewer than the {len(chunks)} content chunks it streamed"
    return None


def records_problems(records: Iterable[object]) -> list[str]:
    bad: list[str] = []
    count = 0
    for rec in records:
        if not isinstance(rec, Mapping):
            bad.append("a request record is not an object")
            continue
        if rec.get("finish_reason") in NOT_COMPLETED:
            continue
        why = record_problem(rec)
        if why is not None:
            count += 1
            if len(bad) < SHOWN:
                bad.append(f"request {rec.get('request_id')!s}: {why}")
    if count > len(bad):
        bad.append(f"{count - len(bad)} more request(s) like that")
    return bad


def run_problems(rows: Sequence[Mapping[str, object]], records: Mapping[str, Sequence[object]] | None) -> list[str]:
    """Every problem of one run (its rows, and its records by run label when read): empty when it may be judged."""
    out = []
    for i, row in enumerate(rows):
        where = f"configuration {i + 1}: " if len(rows) > 1 else ""
        out += [where + p for p in row_problems(row)]
    for label, recs in (records or {}).items():
        where = f"{label}: " if len(records or {}) > 1 else ""
        out += [where + p for p in records_problems(recs or ())]
    return out


def describe(problems: Sequence[str]) -> str:
    shown = "; ".join(problems[:SHOWN])
    return shown + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
