"""The `trace` workload: replay a request trace at its own timestamps.

A trace is a list of (timestamp, input length, output length). Three formats are read, told apart by their
columns (`format="auto"`), so the public traces work unchanged:
- Azure LLM inference trace (AzurePublicDataset, 2023 and 2024): CSV `TIMESTAMP,ContextTokens,GeneratedTokens`,
  TIMESTAMP a date-time such as `2023-11-16 18:15:46.6805900`;
- Mooncake (FAST'25 traces): JSONL `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`, each hash
  id naming one 512-token block of the prompt, so requests that share hash ids share that prefix;
- plain: CSV or JSONL `timestamp` (seconds), `input_len`, `output_len`.

The first `num_prompts` requests in time order are kept; arrivals are (t - t0) * `time_scale` seconds (2.0 replays
at half speed, 0.5 at double). Prompts are synthetic token ids (the trace carries only lengths), drawn from the
seeded stream of each Mooncake block, or of each request elsewhere, so a replay is reproducible and Mooncake's
prefix sharing is real for a prefix cache.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from .local_datasets import TooFewRecords, _need_path
from .synthetic import DEFAULT_TOKEN_ID_RANGE
from .workload import WorkloadRequest

MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces' hash block size
FORMATS = ("auto", "azure", "mooncake", "plain")
_TRACE_STREAM = 0x7ACE  # SeedSequence word of the prompt-id stream (apart from the other samplers')
Row = tuple[float, int, int, tuple[int, ...]]  # (timestamp s, input_len, output_len, mooncake hash ids)


def _records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".jsonl", ".json") or text.lstrip().startswith("{"):
        out = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not a JSON object ({e.msg})") from None
        return out
    return list(csv.DictReader(text.splitlines()))


def _detect(rec: dict[str, Any]) -> str:
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= rec.keys():
        return "azure"
    if {"timestamp", "input_length", "output_length"} <= rec.keys():
        return "mooncake"
    if {"timestamp", "input_len", "output_len"} <= rec.keys():
        return "plain"
    raise ValueError(
        f"format: columns {sorted(rec)} match no known trace (azure: TIMESTAMP, ContextTokens, "
        "GeneratedTokens; mooncake: timestamp, input_length, output_length; plain: timestamp, "
        "input_len, output_len)"
    )


def _azure_seconds(stamp: str) -> float:
    date, _, frac = stamp.strip().partition(".")
    whole = datetime.fromisoformat(date)
    return whole.timestamp() + (float("0." + frac) if frac else 0.0)  # 7 fractional digits: beyond fromisoformat


def _row(rec: dict[str, Any], fmt: str, where: str) -> Row:
    ids: tuple[int, ...]
    try:
        if fmt == "azure":
            t, n_in, n_out, ids = _azure_seconds(rec["TIMESTAMP"]), rec["ContextTokens"], rec["GeneratedTokens"], ()
        elif fmt == "mooncake":
            t, n_in, n_out = float(rec["timestamp"]) / 1000.0, rec["input_length"], rec["output_length"]
            ids = tuple(int(h) for h in rec.get("hash_ids") or ())
        else:
            t, n_in, n_out, ids = float(rec["timestamp"]), rec["input_len"], rec["output_len"], ()
        n_in, n_out = int(n_in), int(n_out)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a {fmt} trace record ({e})") from None
    if not math.isfinite(t) or n_in < 1 or n_out < 1:
        raise ValueError(f"{where}: needs a finite timestamp and lengths >= 1, got ({t}, {n_in}, {n_out})")
    return t, n_in, n_out, ids


def _prompt(row: Row, index: int, seed: int, lo: int, hi: int) -> list[int]:
    _, n_in, _, hash_ids = row
    if not hash_ids:
        random_ids: list[int] = np.random.default_rng([seed, _TRACE_STREAM, index]).integers(lo, hi, n_in).tolist()
        return random_ids
    ids: list[int] = []
    for h in hash_ids:  # the same hash id gives the same block in every request: a shared prefix
        ids += np.random.default_rng([seed, _TRACE_STREAM, 1 << 40, h]).integers(lo, hi, MOONCAKE_BLOCK_TOKENS).tolist()
        if len(ids) >= n_in:
            break
    if len(ids) < n_in:  # more tokens than the hash ids cover: a unique tail
        ids += np.random.default_rng([seed, _TRACE_STREAM, index]).integers(lo, hi, n_in - len(ids)).tolist()
    return ids[:n_in]


def sample_trace(
    num_prompts: int, seed: int, dataset_path: str | None = None, time_scale: float = 1.0, format: str = "auto"
) -> tuple[list[WorkloadRequest], dict[str, Any]]:
    """The first `num_prompts` requests of the trace, at their own (scaled) arrival times."""
    path = _need_path(dataset_path, "trace")
    if format not in FORMATS:
        raise ValueError(f"format: expected one of {', '.join(FORMATS)}, got {format!r}")
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale: must be a finite number > 0, got {time_scale!r}")
    recs = _records(path)
    if not recs:
        raise ValueError(f"dataset_path: {path} holds no trace records")
    fmt = _detect(recs[0]) if format == "auto" else format
    rows = sorted((_row(r, fmt, f"{path} record {i + 1}") for i, r in enumerate(recs)), key=lambda r: r[0])
    if len(rows) < num_prompts:
        raise TooFewRecords(f"num_prompts: {path} holds only {len(rows)} records, {num_prompts} asked", len(rows))
    rows = rows[:num_prompts]
    lo, hi = DEFAULT_TOKEN_ID_RANGE
    t0 = rows[0][0]
    requests = [
        WorkloadRequest(_prompt(r, i, seed, lo, hi), r[2], (r[0] - t0) * float(time_scale)) for i, r in enumerate(rows)
    ]
    return requests, {
        "dataset_path": str(dataset_path),
        "time_scale": float(time_scale),
        "format": fmt,
        "num_dataset_records": len(recs),
    }


# the registry keeps these arrival times instead of drawing its own
sample_trace.replays_arrivals = True  # type: ignore[attr-defined]
