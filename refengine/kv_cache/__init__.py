"""The paged KV cache: the block pool, the per-request block tables over it, and how many blocks an engine gets."""
