"""Micro-benchmarks: engine step, scheduler, sampler, async engine, attention kernels, HTTP overhead."""
