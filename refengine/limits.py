"""Admission limits: what makes a request impossible to ever run under an engine's configuration, and `cdiv`.

`Processor` checks every request against these before it is queued; a harness planning a run can call
`check_request_fits` on its longest request to refuse a configuration up front, with the engine's own rule.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative a and positive b, in integers."""
    return -(-a // b)


def max_kv_tokens(prompt_len: int, max_tokens: int, max_model_len: int) -> int:
    """Tokens whose KV a request may need over its whole life: the last sampled token never needs KV."""
    return min(prompt_len + max_tokens, max_model_len) - 1


def check_request_fits(
    prompt_len: int,
    max_tokens: int,
    *,
    max_model_len: int,
    block_size: int,
    num_gpu_blocks: int | None,
    enable_chunked_prefill: bool,
    max_num_batched_tokens: int,
) -> None:
    """ValueError (naming the limit) when a request of `prompt_len` prompt tokens and up to `max_tokens` output
    tokens can never run: no room for output in the context, more KV blocks than the cache has (None: the cache is
    sized later, not checked), or, with chunked prefill off, more tokens than one step's budget (a preempted request
    re-prefills its prompt and output in one step)."""
    if prompt_len >= max_model_len:
        raise ValueError(
            f"prompt_token_ids has {prompt_len} tokens; the model's context (max_model_len) is "
            f"{max_model_len}, which leaves no room for output"
        )
    kv_tokens = max_kv_tokens(prompt_len, max_tokens, max_model_len)
    need = cdiv(kv_tokens, block_size)
    if num_gpu_blocks is not None and need > num_gpu_blocks:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) needs {need} KV blocks of "
            f"{block_size} tokens, but the KV cache has only num_gpu_blocks={num_gpu_blocks}: "
            "it can never fit"
        )
    if not enable_chunked_prefill and kv_tokens + 1 > max_num_batched_tokens:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds max_num_batched_tokens="
            f"{max_num_batched_tokens} with enable_chunked_prefill=False: it could not be (re)prefilled "
            "in one step"
        )
