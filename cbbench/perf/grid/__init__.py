"""A plan's runs: built from the options into one `RunPlan`, and run serially or in parallel.

- build.py: `build_plan`, the typed options (plan/) turned once into a validated `RunPlan` with its backends;
- grid_worker.py: what a worker process is sent (`GridJob`) and runs (`run_one`), and what it sends back (`Outcome`);
- pool.py: the local process pool (one run per worker at a time; a dead worker's run is retried on a fresh one);
- ray_runner.py: the same on a Ray cluster, one Ray task per run;
- run.py: the runs through the chosen executor (plan/executor.py), as outcomes in finishing order, with progress;
- order.py: the results files put back in plan order once the runs are in, and the table's entries sorted alike.
The capacity planner built on it is perf/capacity.py, and its analysis of the rows results/frontier.py.
"""
