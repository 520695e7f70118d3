"""What a perf run is: the typed options (options.py), the load points and workloads (load.py), `--executor`
(executor.py), `--like` (like.py), the preflight checks, and one run's spec (spec.py). They stand below the
backends; the plan that holds the backends is grid/build.py's `RunPlan`."""
