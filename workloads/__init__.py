"""Named, seeded workloads for `cbbench perf` (imported as `workloads`).

What each module owns: docs/architecture.md (made from the modules' docstrings by ci/codemap.py).
"""

from .arrivals import arrival_times
from .base import Tokenizer, Workload, WorkloadRequest
from .registry import WORKLOADS, get_workload, list_workloads, workload_options
from .sharegpt import ShareGPTPairs, load_sharegpt

__all__ = [
    "Tokenizer",
    "Workload",
    "WorkloadRequest",
    "WORKLOADS",
    "get_workload",
    "list_workloads",
    "workload_options",
    "arrival_times",
    "load_sharegpt",
    "ShareGPTPairs",
]
