"""The harness side of the simulated GPUs: the measured serving runs the simulator is validated against
(data/measured_runs.csv, with their sources), and the drivers that replay benchmarks on a simulated engine."""
