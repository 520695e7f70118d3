"""Frozen configs. Keyword arguments of LLM / LLMEngine / Scheduler and the CLI's options map one to one onto
these fields; a bad value fails in __post_init__ with a message that names the field."""
from __future__ import annotations

from dataclasses import dataclass, fields

BATCHING_MODES = ("continuous", "sequence", "static", "none")
PREEMPTION_MODES = ("recompute", "swap")
POLICIES = ("fcfs", "priority")


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    num_gpu_blocks: int = 4096
    num_cpu_blocks: int = 0
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no per-request cap on a step's prefill tokens
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    policy: str = "fcfs"
    batching: str = "continuous"
    # beyond vLLM: a waiting request of strictly more urgent priority may preempt the least urgent running one
    priority_preemption: bool = False
    max_model_len: int = 1 << 30

    def __post_init__(self) -> None:
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("block_size", self.block_size, 1)
        _check_int("num_gpu_blocks", self.num_gpu_blocks, 1)
        _check_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        _check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        _check_int("max_model_len", self.max_model_len, 2)
        _check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("batching", self.batching, BATCHING_MODES)
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "priority_preemption"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.priority_preemption and self.policy != "priority":
            raise ValueError("priority_preemption needs policy='priority'")

    @property
    def reserves_full_length(self) -> bool:
        """Sequence, static and none modes reserve blocks for prompt + max_tokens at admission (no preemption)."""
        return self.batching != "continuous"


SCHEDULER_FIELDS = tuple(f.name for f in fields(SchedulerConfig))
