"""Synthetic workloads: `fixed`, `random`, `lognormal` and `prefix`.

Prompt token ids are drawn uniformly from `token_id_range` (default [1000, 100000): clear of the special and
low-id tokens of the Qwen / Llama vocabularies, and inside every supported vocabulary), so no tokenizer is needed and
no prompt can hold an EOS or stop token by chance. Each sampler returns (requests with arrival time 0, params).

- `fixed`: every request `input_len` in / `output_len` out (1024 / 256: the low-variance case).
- `random`: input and output lengths uniform on inclusive ranges, default U[100, 1024] for both
  (nano-vllm's 256-request bench.py protocol).
- `lognormal`: lengths log-normal with the given mean and coefficient of variation (cv = std / mean), i.e.
  sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2 / 2; rounded, then clipped to [1, cap], so with a cap the
  realised mean is a little under the nominal one.
- `prefix`: `num_prefixes` shared system prompts of `prefix_len` tokens; request i uses prefix i mod num_prefixes
  followed by its own `suffix_len` unique tokens, so every request after the first of its prefix can hit the
  prefix cache for floor(prefix_len / block_size) blocks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .workload import WorkloadRequest

DEFAULT_TOKEN_ID_RANGE = (1000, 100000)
# what every sampler returns: the requests (arrival time 0) and the params that rebuild them
Sample = tuple[list[WorkloadRequest], dict[str, Any]]
# SeedSequence words that keep the samplers' streams apart from each other and from the arrivals
_STREAM = {"fixed": 0xF1, "random": 0x5A, "lognormal": 0x10, "prefix": 0x9F}


def _rng(kind: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, _STREAM[kind]])


def _check_range(token_id_range: tuple[int, int] | list[int]) -> tuple[int, int]:
    lo, hi = (int(x) for x in token_id_range)
    if not 0 <= lo < hi:
        raise ValueError(f"token_id_range must be [lo, hi) with 0 <= lo < hi, got {token_id_range}")
    return lo, hi


def _check_positive(**values: int | None) -> None:
    for name, v in values.items():
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")


def _ids(rng: np.random.Generator, n: int, id_range: tuple[int, int]) -> list[int]:
    ids: list[int] = rng.integers(id_range[0], id_range[1], size=n).tolist()
    return ids


def sample_fixed(
    *,
    num_prompts: int,
    seed: int,
    input_len: int = 1024,
    output_len: int = 256,
    token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
    dataset_entries: int | None = None,
) -> Sample:
    """`num_prompts` requests of `input_len` random ids in, `output_len` out. `dataset_entries`: draw each
    request's prompt uniformly, with replacement, from that many distinct prompts (aiperf's --num-dataset-entries,
    default 100 there), so repeated prompts meet the server's prefix cache; None: every prompt distinct."""
    _check_positive(input_len=input_len, output_len=output_len, dataset_entries=dataset_entries)
    id_range = _check_range(token_id_range)
    rng = _rng("fixed", seed)
    params: dict[str, Any] = {"input_len": input_len, "output_len": output_len, "token_id_range": list(id_range)}
    if dataset_entries is None:
        reqs = [WorkloadRequest(_ids(rng, input_len, id_range), output_len) for _ in range(num_prompts)]
        return reqs, params
    pool = [_ids(rng, input_len, id_range) for _ in range(dataset_entries)]
    picks = rng.integers(0, dataset_entries, size=num_prompts).tolist()
    return [WorkloadRequest(list(pool[i]), output_len) for i in picks], {**params, "dataset_entries": dataset_entries}


def sample_random(
    *,
    num_prompts: int,
    seed: int,
    input_len_min: int = 100,
    input_len_max: int = 1024,
    output_len_min: int = 100,
    output_len_max: int = 1024,
    token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
) -> Sample:
    _check_positive(input_len_min=input_len_min, output_len_min=output_len_min)
    if input_len_max < input_len_min:
        raise ValueError(f"input_len_max ({input_len_max}) must be >= input_len_min ({input_len_min})")
    if output_len_max < output_len_min:
        raise ValueError(f"output_len_max ({output_len_max}) must be >= output_len_min ({output_len_min})")
    id_range = _check_range(token_id_range)
    rng = _rng("random", seed)
    in_lens = rng.integers(input_len_min, input_len_max + 1, size=num_prompts).tolist()
    out_lens = rng.integers(output_len_min, output_len_max + 1, size=num_prompts).tolist()
    reqs = [WorkloadRequest(_ids(rng, i, id_range), o) for i, o in zip(in_lens, out_lens)]
    params = {
        "input_len_min": input_len_min,
        "input_len_max": input_len_max,
        "output_len_min": output_len_min,
        "output_len_max": output_len_max,
        "token_id_range": list(id_range),
    }
    return reqs, params


def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, cv: float, cap: int | None) -> list[int]:
    """n integer lengths, log-normal with the given mean and coefficient of variation, clipped to [1, cap]."""
    if not mean > 0:
        raise ValueError(f"mean length must be > 0, got {mean}")
    if not cv >= 0:
        raise ValueError(f"coefficient of variation must be >= 0, got {cv}")
    sigma2 = math.log1p(cv * cv)
    x = rng.lognormal(mean=math.log(mean) - sigma2 / 2, sigma=math.sqrt(sigma2), size=n)
    lengths: list[int] = np.clip(np.rint(x), 1, cap if cap is not None else np.inf).astype(np.int64).tolist()
    return lengths


def sample_lognormal(
    *,
    num_prompts: int,
    seed: int,
    input_mean: float = 256.0,
    input_cv: float = 1.0,
    output_mean: float = 256.0,
    output_cv: float = 1.0,
    max_input_len: int | None = 1024,
    max_output_len: int | None = 1024,
    token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
) -> Sample:
    _check_positive(max_input_len=max_input_len, max_output_len=max_output_len)
    id_range = _check_range(token_id_range)
    rng = _rng("lognormal", seed)
    in_lens = lognormal_lengths(rng, num_prompts, input_mean, input_cv, max_input_len)
    out_lens = lognormal_lengths(rng, num_prompts, output_mean, output_cv, max_output_len)
    reqs = [WorkloadRequest(_ids(rng, i, id_range), o) for i, o in zip(in_lens, out_lens)]
    params = {
        "input_mean": input_mean,
        "input_cv": input_cv,
        "output_mean": output_mean,
        "output_cv": output_cv,
        "max_input_len": max_input_len,
        "max_output_len": max_output_len,
        "token_id_range": list(id_range),
    }
    return reqs, params


def sample_prefix(
    *,
    num_prompts: int,
    seed: int,
    num_prefixes: int = 4,
    prefix_len: int = 512,
    suffix_len: int = 128,
    output_len: int = 128,
    token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE,
) -> Sample:
    _check_positive(num_prefixes=num_prefixes, prefix_len=prefix_len, suffix_len=suffix_len, output_len=output_len)
    id_range = _check_range(token_id_range)
    rng = _rng("prefix", seed)
    prefixes = [_ids(rng, prefix_len, id_range) for _ in range(num_prefixes)]
    reqs = [
        WorkloadRequest(prefixes[i % num_prefixes] + _ids(rng, suffix_len, id_range), output_len)
        for i in range(num_prompts)
    ]
    params = {
        "num_prefixes": num_prefixes,
        "prefix_len": prefix_len,
        "suffix_len": suffix_len,
        "output_len": output_len,
        "token_id_range": list(id_range),
    }
    return reqs, params
