"""The decoder's layers (vLLM's names): attention over the paged KV cache (metadata and backends), linear and merged
linear projections, RMSNorm with the fused residual add, rotary embedding, SiLU-and-mul."""
