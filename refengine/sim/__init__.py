"""Simulated GPUs: a per-step cost model built on kernel latencies measured on real GPUs."""
