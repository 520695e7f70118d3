"""Frozen configs and the enums of their choices. Keyword arguments of LLM / LLMEngine / Scheduler and the CLI's
options map one to one onto these fields; a bad value fails in __post_init__ with a message that names the field.
`EngineArgs` (refengine/engine/engine_args.py) sorts an engine's keyword arguments into them."""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field, fields

from refengine.checks import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    INT64_MAX,
    INT64_MIN,
    check_bool,
    check_choice,
    check_gpu_memory_utilization,
    check_int,
    check_real,
)


# StrEnums: the API and the command line keep taking (and printing) the plain strings, and a member still equals
# its string, while the scheduler dispatches on members.
class BatchingMode(enum.StrEnum):
    CONTINUOUS = "continuous"  # iteration-level: requests join and leave at every step
    SEQUENCE = "sequence"  # TGI-like: a step is all prefill or all decode; admission reserves the whole length
    STATIC = "static"  # a batch enters and leaves together
    NONE = "none"  # one request at a time


class SchedulingPolicy(enum.StrEnum):  # (vLLM's name)
    FCFS = "fcfs"
    PRIORITY = "priority"


class PreemptionMode(enum.StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


BATCHING_MODES = tuple(m.value for m in BatchingMode)
PREEMPTION_MODES = tuple(m.value for m in PreemptionMode)
POLICIES = tuple(p.value for p in SchedulingPolicy)
ATTENTION_BACKENDS = ("torch", "triton")  # here, not in attention.py, so that the CLI reads it without torch
# The dtype names a model accepts, each to torch's name for it (loader.resolve_dtype maps them to torch dtypes)
DTYPE_NAMES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
}


def dtype_name(dtype: str | None, device: str) -> str:
    """resolve_dtype's answer by name, without torch: None / "auto" -> float32 on the CPU, bfloat16 on CUDA."""
    if dtype is None or dtype == "auto":
        return "bfloat16" if device.split(":")[0] == "cuda" else "float32"
    if not isinstance(dtype, str) or dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)} or 'auto', got {dtype!r}")
    return DTYPE_NAMES[dtype]


# A bound on slots that no real deployment reaches (vLLM's defaults are 256-1024); beyond it a typo such as 10**6
# would only size per-slot buffers for nothing.
MAX_NUM_SEQS = 1 << 16


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
    # the three below are given as strings and held as their enum members (PreemptionMode, SchedulingPolicy,
    # BatchingMode), which are strings too
    preemption_mode: str = "recompute"
    policy: str = "fcfs"
    batching: str = "continuous"
    # beyond vLLM: a waiting request of strictly more urgent priority may preempt the least urgent running one
    priority_preemption: bool = False
    max_model_len: int = 1 << 30
    # vLLM's AsyncScheduler: step N+1 is scheduled while step N runs, its in-flight tokens held as placeholders.
    # None: the engine decides (`resolve_async_scheduling`: on for CUDA, where the host work it hides is real, off
    # elsewhere); a Scheduler made alone reads None as off
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        for name, lo, hi in (
            ("max_num_batched_tokens", 1, None),
            ("max_num_seqs", 1, MAX_NUM_SEQS),
            ("block_size", 1, None),
            ("num_gpu_blocks", 1, None),
            ("num_cpu_blocks", 0, None),
            ("long_prefill_token_threshold", 0, None),
            ("max_model_len", 2, None),
        ):
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo, hi))  # (numpy ints -> int)
        for name, choices in (
            ("preemption_mode", PreemptionMode),
            ("policy", SchedulingPolicy),
            ("batching", BatchingMode),
        ):
            value = getattr(self, name)
            check_choice(name, value, tuple(m.value for m in choices))
            object.__setattr__(self, name, choices(value))
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "priority_preemption"):
            check_bool(name, getattr(self, name))
        if self.async_scheduling is not None:
            check_bool("async_scheduling", self.async_scheduling)
        if self.priority_preemption and self.policy is not SchedulingPolicy.PRIORITY:
            raise ValueError("priority_preemption needs policy='priority'")

    @classmethod
    def of(cls, config: SchedulerConfig | None, knobs: dict[str, object]) -> SchedulerConfig:
        """The config of `Scheduler(config)` or `Scheduler(**knobs)`: the SchedulerConfig given, or one made of its
        fields by keyword; ValueError for both at once, an unknown field, or a config of another type."""
        if config is not None and knobs:
            raise ValueError("give the scheduler either a SchedulerConfig or its fields by keyword, not both")
        if config is None:
            unknown = set(knobs) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown scheduler option(s): {sorted(unknown)}")
            return cls(**knobs)  # type: ignore[arg-type]
        if not isinstance(config, cls):
            raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        return config


SCHEDULER_FIELDS = tuple(f.name for f in fields(SchedulerConfig))


def resolve_async_scheduling(async_scheduling: bool | None, device: object) -> bool:
    """An explicit value as it is; None (the default) -> True on a CUDA device, False elsewhere (the CPU, whose
    forward takes the host thread anyway, and a simulated GPU, whose cost model keeps modelling what it is told).
    `device`: a name ("cuda", "cuda:1", "sim:h200", ...) or a torch.device."""
    if async_scheduling is not None:
        return async_scheduling
    return str(device).split(":")[0] == "cuda"


@dataclass(frozen=True)
class EngineConfig:
    """LLMEngine's own knobs, and the scheduler's config in `scheduler`; device availability, the model's context
    and memory are checked by the engine, which knows them."""

    model: str = "tiny-qwen2"
    device: str = "cpu"
    dtype: str | None = None  # float32 on CPU, bfloat16 on CUDA
    seed: int = 0
    attention_backend: str | None = None  # torch on CPU, triton on CUDA
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    kv_cache_memory_gb: float | None = None  # sizes num_gpu_blocks when that is not given
    # on CUDA without num_gpu_blocks / kv_cache_memory_gb: the share of the device this engine may use, weights,
    # activations and KV cache together (vLLM's knob; refengine/kv_cache/kv_sizing.py)
    gpu_memory_utilization: float = field(
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        metadata={"help": "share of the GPU's memory for this engine (weights + activations + KV cache), in (0, 1]"},
    )
    # step_stats and finished_requests keep only the newest stats_log_size entries (0: none; None: all, as the perf
    # suite asks), so that a long-lived engine does not grow without bound
    stats_log_size: int | None = 10_000
    enforce_eager: bool = False  # True: never replay CUDA graphs for decode steps (graphs are CUDA-only anyway)
    # vLLM's knob: the weights and KV heads split over this many GPUs. refengine's own forward runs on one device,
    # so only a simulated GPU takes more than 1 (refengine/sim/)
    tensor_parallel_size: int = field(
        default=1, metadata={"help": "GPUs the model is split over (tensor parallel; > 1 on a simulated GPU only)"}
    )
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        # A torch.device or torch.dtype can only exist once torch is imported, so the check never imports it: the
        # CLI validates knobs in a moment, before torch loads.
        torch = sys.modules.get("torch")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a preset name or a folder path, got {self.model!r}")
        if not isinstance(self.device, (str, torch.device) if torch else str):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.dtype is not None and not isinstance(self.dtype, (str, torch.dtype) if torch else str):
            raise ValueError(f"dtype must be a name such as 'float32' or 'bfloat16', got {self.dtype!r}")
        object.__setattr__(self, "seed", check_int("seed", self.seed, INT64_MIN, INT64_MAX))
        if self.attention_backend is not None:
            check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        if self.max_model_len is not None:
            object.__setattr__(self, "max_model_len", check_int("max_model_len", self.max_model_len, 2))
        if self.kv_cache_memory_gb is not None:
            check_real("kv_cache_memory_gb", self.kv_cache_memory_gb, 0.0, min_open=True)
        check_gpu_memory_utilization(self.gpu_memory_utilization)
        if self.stats_log_size is not None:
            check_int("stats_log_size", self.stats_log_size, 0)
        check_bool("enforce_eager", self.enforce_eager)
        object.__setattr__(
            self, "tensor_parallel_size", check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        )
        if not isinstance(self.scheduler, SchedulerConfig):
            raise ValueError(f"scheduler must be a SchedulerConfig, got {type(self.scheduler).__name__}")
