"""Running a plan's runs in parallel, and the capacity planner built on it.

- executor.py: `--executor serial|pool[:N]|ray[:ADDRESS]`, parsed, checked against the plan, the default chosen;
- worker.py: what a worker process is sent (`GridJob`) and runs (`run_one`), and what it sends back (`Outcome`);
- pool.py: the local process pool (one run per worker at a time; a dead worker's run is retried on a fresh one);
- ray_runner.py: the same on a Ray cluster, one Ray task per run;
- order.py: the results files put back in plan order once the runs are in, and the table's entries sorted alike;
- capacity.py / frontier.py: `cbbench plan`'s search space and its analysis (SLOs, best config per GPU, Pareto set).
"""
