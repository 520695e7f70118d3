"""The run plan of `cbbench perf`: the options, the load points and workloads, the checks, and the typed plan."""
