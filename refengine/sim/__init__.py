"""Simulated GPUs: `device="sim:<gpu>"` runs the real scheduler, KV cache manager and output side with the forward
replaced by a per-step cost model built on kernel latencies measured on real GPUs, advancing a virtual clock
(device.py's SimDevice is the engine's Device there, refengine/worker/device.py; cost_model.py, kernel_tables.py and
gpus.py hold the model and its data)."""
