"""Simulated GPUs: `device="sim:<gpu>"` runs the real scheduler, KV cache manager and output side with the forward
replaced by a cost model that advances a virtual clock (backend.py wires it into LLMEngine)."""
