"""Model shapes the simulation tests share."""

from __future__ import annotations

from refengine.sim.model_shape import ModelShape

LLAMA_31_8B = ModelShape(
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
)
