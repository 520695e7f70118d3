"""The workload registry: `get_workload(name, *, tokenizer, num_prompts, seed, **params)`.

Every workload is a sampler (see `sharegpt.py`, `synthetic.py`) plus an arrival process (`arrivals.py`) drawn from
its own seeded stream. The returned `Workload.params` hold every input (defaults filled in) and the sampler's
provenance counts, so `get_workload(w.name, tokenizer=..., **w.params)` rebuilds the same requests.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

from .arrivals import arrival_times
from .local_datasets import sample_custom, sample_hf
from .multiturn import sample_multiturn, sample_sharegpt_multiturn
from .sharegpt import sample_sharegpt
from .synthetic import sample_fixed, sample_lognormal, sample_prefix, sample_random
from .trace import sample_trace
from .workload import Tokenizer, Workload, WorkloadRequest

Sampler = Callable[..., tuple[list[WorkloadRequest], dict[str, Any]]]

WORKLOADS: dict[str, Sampler] = {
    "sharegpt": sample_sharegpt,
    "fixed": sample_fixed,
    "random": sample_random,
    "lognormal": sample_lognormal,
    "prefix": sample_prefix,
    "custom": sample_custom,
    "hf": sample_hf,
    "trace": sample_trace,
    "multiturn": sample_multiturn,
    "sharegpt-multiturn": sample_sharegpt_multiturn,
}

# The most requests one workload may hold. Every request is materialised (token ids and all) before the run, so an
# absurd --num-prompts must be refused at once rather than grow memory for minutes; 1M ShareGPT-sized prompts is
# already ~2 GB of token ids, far beyond any run this harness measures.
MAX_NUM_PROMPTS = 1_000_000

# params that a sampler writes for the record but does not take back as input
_PROVENANCE = {"dataset", "num_dataset_records", "dataset_truncated", "num_conversations", "num_tokenized"}


def list_workloads() -> list[str]:
    """The names `get_workload` takes, in the order --help lists them."""
    return list(WORKLOADS)


def workload_options(name: str) -> dict[str, Any]:
    """The tunable params of a workload and their defaults (for CLI help)."""
    sampler = _sampler(name)
    return {
        p.name: p.default
        for p in inspect.signature(sampler).parameters.values()
        if p.name not in ("tokenizer", "num_prompts", "seed")
    }


def _sampler(name: str) -> Sampler:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"workload: unknown name {name!r}; known: {', '.join(WORKLOADS)}") from None


def _conversation_id(request: WorkloadRequest, name: str) -> int:
    # a sampler marked `conversations` sets conversation_id on every turn; one that does not is a sampler bug
    if request.conversation_id is None:
        raise ValueError(f"conversation_id: workload {name!r} samples conversations but a request has none")
    return request.conversation_id


def get_workload(
    name: str,
    *,
    tokenizer: Tokenizer | None = None,
    num_prompts: int,
    seed: int = 0,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    **params: Any,
) -> Workload:
    """Build the named workload: `num_prompts` requests, reproducible for `seed`.

    `request_rate` (requests/s, inf = all at t = 0) and `burstiness` shape the arrivals (see `arrivals.py`);
    `max_concurrency` (requests in flight at most, as `vllm bench serve`'s; None = no cap) is part of the load,
    saved in `params` only when set (so the rows of uncapped runs keep their configuration key);
    `params` go to the sampler (an unknown one raises ValueError naming it).
    """
    sampler = _sampler(name)
    request_rate, burstiness = float(request_rate), float(burstiness)  # "inf" as read back from a result JSON
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int):
        raise ValueError(f"num_prompts must be an integer, got {num_prompts!r}")
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if num_prompts > MAX_NUM_PROMPTS:
        raise ValueError(f"num_prompts must be <= {MAX_NUM_PROMPTS} (MAX_NUM_PROMPTS), got {num_prompts}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if max_concurrency is not None and not (isinstance(max_concurrency, int) and max_concurrency >= 1):
        raise ValueError(f"max_concurrency must be an integer >= 1 (or None), got {max_concurrency!r}")
    accepted = set(inspect.signature(sampler).parameters)
    params = {k: v for k, v in params.items() if not (k in _PROVENANCE and k not in accepted)}
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a parameter of workload {name!r} "
            f"(known: {', '.join(sorted(accepted - {'tokenizer', 'num_prompts', 'seed'}))})"
        )
    if "tokenizer" in accepted:
        params["tokenizer"] = tokenizer
    own_arrivals = getattr(sampler, "replays_arrivals", False)
    if own_arrivals and (math.isfinite(request_rate) or burstiness != 1.0):
        raise ValueError(f"request_rate: workload {name!r} replays its own timestamps (scale them with time_scale)")
    requests, used = sampler(num_prompts=num_prompts, seed=seed, **params)
    if own_arrivals:
        times = [r.arrival_time for r in requests]
    elif getattr(sampler, "conversations", False):  # one arrival per conversation, shared by its turns
        starts = arrival_times(num_prompts, request_rate, burstiness, seed)
        times = [starts[_conversation_id(r, name)] for r in requests]
    else:
        times = arrival_times(len(requests), request_rate, burstiness, seed)
    requests = [dataclasses.replace(r, arrival_time=t) for r, t in zip(requests, times)]
    full = {
        "num_prompts": num_prompts,
        "seed": seed,
        "request_rate": request_rate,
        "burstiness": burstiness,
        **({"max_concurrency": max_concurrency} if max_concurrency is not None else {}),
        **used,
    }
    return Workload(name=name, params=full, requests=requests)
