"""The harness side of the simulated GPUs: `cbbench sim validate` against the measured serving runs the project
holds (data/measured_runs.csv, with their sources), and the hf-static peer on a simulated GPU (hf_static.py). The
drivers that replay other benchmarks on a simulated engine (Anyscale's, the simulation's own speed) are the
project's self-measurement: benchmarks/."""
