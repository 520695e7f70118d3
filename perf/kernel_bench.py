"""Kept for importers outside perf/ (conformance/test_kernels.py): the kernel benchmark is `bench/kernels.py`."""

from cbbench.perf.bench.kernels import BenchShape, attention_bytes, run_kernel_bench

__all__ = ["BenchShape", "attention_bytes", "run_kernel_bench"]
