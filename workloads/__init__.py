"""Named, seeded workloads for `cbbench perf` (imported as `cbbench.workloads`).

Code map: `base.py` (WorkloadRequest, Workload), `registry.py` (get_workload), `sharegpt.py` (the ShareGPT V3
sampler and its truncation-tolerant loader), `synthetic.py` (fixed, random, lognormal, prefix), `local_datasets.py`
(custom JSONL, local Hugging Face datasets), `trace.py` (Azure / Mooncake / plain trace replay), `arrivals.py`
(offline, Poisson, gamma).
"""

from .arrivals import arrival_times
from .base import Tokenizer, Workload, WorkloadRequest
from .registry import WORKLOADS, get_workload, list_workloads, workload_options
from .sharegpt import ShareGPTPairs, load_sharegpt

__all__ = [
    "Tokenizer", "Workload", "WorkloadRequest", "WORKLOADS", "get_workload", "list_workloads", "workload_options",
    "arrival_times", "load_sharegpt", "ShareGPTPairs",
]
