"""Workloads from files users bring: `custom` (vLLM's JSONL) and `hf` (a local Hugging Face dataset).

- `custom`: one JSON object per line with `prompt` (text), and optionally the request's output length as
  `output_len`, `max_tokens` or `output_tokens` (the first present wins); a line without one gets `output_len`
  (default 256, vLLM's `--custom-output-len`). This is the file `vllm bench serve --dataset-name custom` reads.
- `hf`: a local dataset, never a hub id (nothing downloads): a folder written by `datasets`' `save_to_disk`
  (Arrow files, with or without splits), or one `.parquet`, `.arrow`, `.jsonl`, `.json` or `.csv` file. The prompt
  is the text column `column` (default: the first of `prompt`, `text`, `question`, `instruction`, `input`); the
  output length comes from `output_column` when given, else `output_len` for every request.

Both keep the file's order unless `shuffle` is set (then seeded), take the first `num_prompts` usable rows, and
encode the prompt with the run's tokenizer. A row whose prompt is empty or not text raises ValueError naming
its line (custom) or row (hf): a benchmark must not silently drop what the user asked for.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from .workload import Tokenizer, WorkloadRequest

DEFAULT_OUTPUT_LEN = 256  # vLLM's --custom-output-len / --hf-output-len default
OUTPUT_LEN_KEYS = ("output_len", "max_tokens", "output_tokens")
PROMPT_COLUMNS = ("prompt", "text", "question", "instruction", "input")
TABLE_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".csv")
Sample = tuple[list[WorkloadRequest], dict[str, Any]]


def _need_path(dataset_path: str | None, workload: str) -> Path:
    if not dataset_path:
        raise ValueError(f"dataset_path: workload {workload!r} needs --dataset-path FILE")
    path = Path(dataset_path).expanduser()
    if not path.exists():
        hint = " (hub ids are not fetched: download the dataset to a folder first)" if "/" in dataset_path else ""
        raise ValueError(f"dataset_path: {dataset_path!r} does not exist{hint}")
    return path


def _need_tokenizer(tokenizer: Tokenizer | None, workload: str) -> Tokenizer:
    if tokenizer is None:
        raise ValueError(f"tokenizer: workload {workload!r} holds text prompts and needs a tokenizer")
    return tokenizer


def _output_len(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ValueError(f"{where}: output length must be an integer >= 1, got {value!r}")
    return int(value)


def _request(tokenizer: Tokenizer, prompt: Any, output_len: int, where: str) -> WorkloadRequest:
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"{where}: prompt must be non-empty text, got {type(prompt).__name__} {prompt!r:.40}")
    ids = list(tokenizer.encode(prompt))
    if not ids:
        raise ValueError(f"{where}: prompt encodes to no tokens")
    return WorkloadRequest(ids, output_len, 0.0, prompt)


class TooFewRecords(ValueError):
    """A file with fewer usable records than `num_prompts` asked for; `available` says how many it has (a caller
    whose count was a default, not the user's, can take them all)."""

    def __init__(self, message: str, available: int) -> None:
        super().__init__(message)
        self.available = available


def _order(n: int, shuffle: bool, seed: int, num_prompts: int, source: Path) -> list[int]:
    """The indices of the rows to use, in order; fewer rows than asked is an error, as for `sharegpt`."""
    if n < num_prompts:
        raise TooFewRecords(f"num_prompts: {source} holds only {n} records, {num_prompts} asked", n)
    order = list(range(n))
    if shuffle:
        random.Random(seed).shuffle(order)
    return order[:num_prompts]


def sample_custom(
    num_prompts: int,
    seed: int,
    tokenizer: Tokenizer | None = None,
    dataset_path: str | None = None,
    output_len: int = DEFAULT_OUTPUT_LEN,
    shuffle: bool = False,
) -> Sample:
    """`num_prompts` requests from a vLLM custom JSONL file (see the module docstring)."""
    path, tok = _need_path(dataset_path, "custom"), _need_tokenizer(tokenizer, "custom")
    default_len = _output_len(output_len, "output_len")
    rows: list[tuple[int, dict[str, Any]]] = []
    with open(path, encoding="utf-8") as fp:
        for lineno, line in enumerate(fp, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON object ({e.msg})") from None
            if not isinstance(obj, dict) or "prompt" not in obj:
                raise ValueError(f"{path}:{lineno}: each line must be a JSON object with a 'prompt' field")
            rows.append((lineno, obj))
    if not rows:
        raise ValueError(f"dataset_path: {path} holds no records")
    requests = []
    for i in _order(len(rows), shuffle, seed, num_prompts, path):
        lineno, obj = rows[i]
        key = next((k for k in OUTPUT_LEN_KEYS if obj.get(k) is not None), None)
        n = _output_len(obj[key], f"{path}:{lineno}: {key}") if key else default_len
        requests.append(_request(tok, obj["prompt"], n, f"{path}:{lineno}"))
    return requests, {
        "dataset_path": str(dataset_path),
        "output_len": default_len,
        "shuffle": shuffle,
        "num_dataset_records": len(rows),
    }


def _arrow_table(path: Path) -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            "dataset_path: reading Arrow/Parquet needs pyarrow (pip install 'cbbench[datasets]')"
        ) from None
    if path.suffix == ".parquet":
        return pq.read_table(path)
    try:
        return pa.ipc.open_stream(path).read_all()  # what datasets' save_to_disk writes
    except pa.ArrowInvalid:
        return pa.ipc.open_file(path).read_all()


def _dataset_files(path: Path, split: str | None) -> list[Path]:
    if path.is_file():
        if path.suffix not in TABLE_SUFFIXES:
            raise ValueError(f"dataset_path: {path.name} is not one of {', '.join(TABLE_SUFFIXES)}")
        return [path]
    if (path / "dataset_dict.json").exists():  # a DatasetDict: one folder per split
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        name = split or ("train" if "train" in splits else splits[0])
        if name not in splits:
            raise ValueError(f"split: {name!r} is not in {path} (splits: {', '.join(splits)})")
        path = path / name
    files = sorted(path.glob("*.arrow")) or sorted(path.glob("*.parquet"))
    if not files:
        raise ValueError(f"dataset_path: {path} holds no .arrow or .parquet files (a save_to_disk folder expected)")
    return files


def _rows(files: list[Path]) -> list[dict[str, Any]]:
    import pandas as pd

    frames = []
    for f in files:
        if f.suffix in (".parquet", ".arrow"):
            frames.append(_arrow_table(f).to_pandas())
        elif f.suffix == ".csv":
            frames.append(pd.read_csv(f))
        else:
            frames.append(pd.read_json(f, lines=f.suffix == ".jsonl"))
    records: list[dict[str, Any]] = pd.concat(frames, ignore_index=True).to_dict("records")
    return records


def sample_hf(
    num_prompts: int,
    seed: int,
    tokenizer: Tokenizer | None = None,
    dataset_path: str | None = None,
    column: str = "",
    output_column: str = "",
    output_len: int = DEFAULT_OUTPUT_LEN,
    split: str = "",
    shuffle: bool = False,
) -> Sample:
    """`num_prompts` requests from a local Hugging Face dataset (see the module docstring)."""
    path, tok = _need_path(dataset_path, "hf"), _need_tokenizer(tokenizer, "hf")
    default_len = _output_len(output_len, "output_len")
    rows = _rows(_dataset_files(path, split or None))
    if not rows:
        raise ValueError(f"dataset_path: {path} holds no rows")
    names = list(rows[0])
    col = column or next((c for c in PROMPT_COLUMNS if c in names), "")
    if col not in names:
        raise ValueError(
            f"column: {column or 'a prompt column'!r} not found; the dataset's columns: {', '.join(map(str, names))}"
        )
    if output_column and output_column not in names:
        raise ValueError(f"output_column: {output_column!r} not found; the dataset's columns: {', '.join(names)}")
    requests = []
    for i in _order(len(rows), shuffle, seed, num_prompts, path):
        n = _output_len(rows[i][output_column], f"row {i}: {output_column}") if output_column else default_len
        requests.append(_request(tok, rows[i][col], n, f"row {i}"))
    return requests, {
        "dataset_path": str(dataset_path),
        "column": col,
        "output_column": output_column,
        "output_len": default_len,
        "split": split,
        "shuffle": shuffle,
        "num_dataset_records": len(rows),
    }
