"""Checks that `cbbench perf` makes before anything runs, so that a bad option or an infeasible configuration
anywhere in a sweep fails at once with one line, never after an hour of runs.

- `check_options`: device (cpu, cuda[:N] or a simulated `sim:<gpu>`), thread count, prompt count, repeats / warm-up;
- `check_writable`: the result folder (or the output file's folder) can be written;
- `check_feasible`: every request of the workload can run under one configuration (the same KV and token-budget
  conditions `LLMEngine.add_request` applies, computed without loading a model).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_options(*, device: str, cpu_threads: int | None, num_prompts: int | None, repeats: int, warmup: int) -> None:
    from refengine.sim.sim_device import is_sim_device, known_sim_devices, parse_sim_device

    if is_sim_device(device):
        parse_sim_device(device)  # ValueError naming device and the known GPUs
    elif not _DEVICE.fullmatch(device):
        raise ValueError(
            f"device must be cpu, cuda, cuda:N or a simulated GPU ({', '.join(known_sim_devices())}), got {device!r}"
        )
    if cpu_threads is not None and cpu_threads < 0:
        raise ValueError(f"cpu_threads must be >= 0 (0 = torch's default), got {cpu_threads}")
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    from cbbench.workloads.catalog import MAX_NUM_PROMPTS

    if num_prompts is not None and num_prompts > MAX_NUM_PROMPTS:  # before any workload is built: no memory grows
        raise ValueError(f"num_prompts must be <= {MAX_NUM_PROMPTS} (MAX_NUM_PROMPTS), got {num_prompts}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")


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


def check_feasible(lengths: Iterable[tuple[int, int]], knobs: Mapping[str, Any], *, label: str = "") -> None:
    """ValueError when some request, given as (prompt_len, output_len), could never run under `knobs` (KV blocks,
    max_model_len, or a prompt larger than the budget with chunked prefill off). Knobs left out take
    SchedulerConfig's defaults; num_gpu_blocks left out is sized by the engine from memory and is not checked."""
    from refengine.config import SchedulerConfig

    lengths = list(lengths)
    if not lengths:
        return
    prompt, output = max(lengths, key=lambda x: x[0] + x[1])
    where = f"configuration {label}: " if label else ""
    max_model_len = knobs.get("max_model_len")
    if max_model_len is not None and max(p for p, _ in lengths) >= max_model_len:
        raise ValueError(
            f"{where}a prompt of {max(p for p, _ in lengths)} tokens leaves no room for output "
            f"under max_model_len={max_model_len}"
        )
    kv_tokens = int(min(prompt + output, max_model_len or math.inf)) - 1
    block_size = knobs.get("block_size") or SchedulerConfig.block_size
    blocks = knobs.get("num_gpu_blocks")
    if blocks is not None and _cdiv(kv_tokens, block_size) > blocks:
        raise ValueError(
            f"{where}a request of {prompt} + {output} tokens needs {_cdiv(kv_tokens, block_size)} KV "
            f"blocks of {block_size}, more than num_gpu_blocks={blocks}: it could never run"
        )
    chunked = knobs.get("enable_chunked_prefill", SchedulerConfig.enable_chunked_prefill)
    budget = knobs.get("max_num_batched_tokens") or SchedulerConfig.max_num_batched_tokens
    if not chunked and kv_tokens + 1 > budget:
        raise ValueError(
            f"{where}a request of {prompt} + {output} tokens exceeds max_num_batched_tokens={budget} "
            f"with enable_chunked_prefill=False: it could not be prefilled in one step"
        )
