"""The decoder's layers: attention over the paged KV cache (metadata and backends)."""
