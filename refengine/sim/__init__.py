"""Simulated GPUs: `device="sim:<gpu>"` runs the real scheduler, KV cache manager and output side with the forward
replaced by a per-step cost model built on kernel latencies measured on real GPUs, advancing a virtual clock
(backend.py wires it into LLMEngine; cost_model.py, kernel_tables.py and gpus.py hold the model and its data)."""
