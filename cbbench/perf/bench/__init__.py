"""The micro-benchmarks a user runs as commands: `cbbench bench-scheduler` (scheduler_cost.py), `bench-step`
(step.py), `bench-async` (async_overlap.py), `bench-profile` (profile.py, with phase_clock.py and gemm_floor.py)
and `kernels` (kernels.py). The project's measurements of itself are benchmarks/, outside the package."""
