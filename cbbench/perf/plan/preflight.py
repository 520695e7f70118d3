"""Checks that `cbbench perf` makes before anything runs, so that an unusable output or an infeasible
configuration anywhere in a sweep fails at once with one line, never after an hour of runs. (Each option's own
value is checked where it is parsed: plan/options.py's option groups, and refengine's `DeviceSpec` for the device.)

- `check_output_name`: the CSV and its JSON are two regular files;
- `check_writable`: the result folder (or the output file's folder) can be written;
- `check_feasible`: every request of the workload can run under one configuration (the same KV and token-budget
  conditions `LLMEngine.add_request` applies, computed without loading a model).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refengine.engine.engine_args import EngineArgs


def check_output_name(csv_path: Path) -> None:
    """`--output` must name a CSV whose JSON (the same name, .json) is another file, and neither may be a device
    or a folder: the pair is replaced by renaming, which would replace `/dev/full` itself."""
    if csv_path.suffix.lower() == ".json":
        raise ValueError(
            f"output: {csv_path} would make the CSV and its JSON the same file; name the CSV "
            f"({csv_path.with_suffix('.csv')}), the JSON is written beside it"
        )
    for p in (csv_path, csv_path.with_suffix(".json")):
        if p.exists() and not p.is_file():
            raise ValueError(f"output: {p} exists and is not a regular file")


def check_writable(folder: str | os.PathLike[str], what: str = "result-dir") -> Path:
    """Create `folder` if needed and prove a file can be written in it (then removed)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what}: {folder} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".cbbench-write-check-"):
            pass
    except OSError as e:
        raise ValueError(f"{what}: cannot write to {folder} ({e.strerror or type(e).__name__})") from None
    return folder


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_feasible(lengths: Iterable[tuple[int, int]], args: EngineArgs, *, label: str = "") -> None:
    """ValueError when some request, given as (prompt_len, output_len), could never run under the engine arguments
    `args` (KV blocks, max_model_len, or a prompt larger than the budget with chunked prefill off), read from the
    configs they built; num_gpu_blocks not given is sized by the engine from memory and is not checked."""
    lengths = list(lengths)
    if not lengths:
        return
    prompt, output = max(lengths, key=lambda x: x[0] + x[1])
    where = f"configuration {label}: " if label else ""
    config = args.config
    sc = config.scheduler
    max_model_len = config.max_model_len
    if max_model_len is not None and max(p for p, _ in lengths) >= max_model_len:
        raise ValueError(
            f"{where}a prompt of {max(p for p, _ in lengths)} tokens leaves no room for output "
            f"under max_model_len={max_model_len}"
        )
    kv_tokens = int(min(prompt + output, max_model_len or math.inf)) - 1
    block_size = sc.block_size
    blocks = sc.num_gpu_blocks if args.num_gpu_blocks_given else None
    if blocks is not None and _cdiv(kv_tokens, block_size) > blocks:
        raise ValueError(
            f"{where}a request of {prompt} + {output} tokens needs {_cdiv(kv_tokens, block_size)} KV "
            f"blocks of {block_size}, more than num_gpu_blocks={blocks}: it could never run"
        )
    budget = sc.max_num_batched_tokens
    if not sc.enable_chunked_prefill and kv_tokens + 1 > budget:
        raise ValueError(
            f"{where}a request of {prompt} + {output} tokens exceeds max_num_batched_tokens={budget} "
            f"with enable_chunked_prefill=False: it could not be prefilled in one step"
        )
