"""EngineArgs: the keyword arguments of LLM / LLMEngine, sorted once into the frozen configs (vLLM's shape).

Making an `EngineArgs` builds the `EngineConfig` (with its `SchedulerConfig`) once, before any model is loaded, so a
bad knob fails first; `create_configs()` hands that config on, and `LLMEngine.from_engine_args` takes the arguments
as they are (a sweep checks every configuration before its first run and carries each one's `EngineArgs` to its
engine, which checks nothing twice). Two scheduler fields depend on the loaded model and the device: `max_model_len` (the model's context
unless given) and `num_gpu_blocks` (sized from memory unless given); the engine fills them in with
`with_resolved`, as vLLM's engine fills in the cache config's block count after profiling.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from refengine.config import SCHEDULER_FIELDS, EngineConfig, SchedulerConfig, resolve_async_scheduling

ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig) if f.name != "scheduler")


@dataclass(frozen=True)
class EngineArgs:
    model: str = "tiny-qwen2"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # EngineConfig fields
    scheduler_kwargs: dict[str, Any] = field(default_factory=dict)  # SchedulerConfig fields the caller set
    # the configs of the fields above, built and checked once, as the arguments are made (create_configs hands it on)
    config: EngineConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Build both configs, checked (ValueError naming the field); the scheduler's max_model_len and (unless given)
        num_gpu_blocks are placeholders until the engine resolves them. async_scheduling left unset is resolved for
        the device here (refengine.config.resolve_async_scheduling: on for CUDA); a value given is kept."""
        config = EngineConfig(
            model=self.model, scheduler=SchedulerConfig(**self.scheduler_kwargs), **self.engine_kwargs
        )
        resolved = resolve_async_scheduling(config.scheduler.async_scheduling, config.device)
        scheduler = dataclasses.replace(config.scheduler, async_scheduling=resolved)
        object.__setattr__(self, "config", dataclasses.replace(config, scheduler=scheduler))

    @classmethod
    def from_kwargs(cls, model: str | os.PathLike[str] = "tiny-qwen2", **kwargs: Any) -> EngineArgs:
        """Sort LLMEngine's keyword arguments and build their configs; an unknown name or a bad value raises
        ValueError. A scheduler knob given as None takes its default (the CLI passes unset options that way)."""
        model = os.fspath(model) if isinstance(model, os.PathLike) else model
        unknown = set(kwargs) - set(ENGINE_FIELDS) - set(SCHEDULER_FIELDS)
        if unknown:
            raise ValueError(f"unknown engine option(s): {sorted(unknown)}")
        sched = {k: v for k, v in kwargs.items() if k in SCHEDULER_FIELDS and k not in ENGINE_FIELDS and v is not None}
        eng = {k: v for k, v in kwargs.items() if k in ENGINE_FIELDS}
        return cls(model, eng, sched)

    def create_configs(self) -> EngineConfig:
        """Both configs, as built and checked when these arguments were made (vLLM's create_engine_config)."""
        return self.config

    @property
    def num_gpu_blocks_given(self) -> bool:
        return "num_gpu_blocks" in self.scheduler_kwargs


def with_resolved(config: EngineConfig, *, max_model_len: int, num_gpu_blocks: int) -> EngineConfig:
    """`config` with the scheduler's model-dependent fields filled in (checked again by __post_init__)."""
    sc = dataclasses.replace(config.scheduler, max_model_len=max_model_len, num_gpu_blocks=num_gpu_blocks)
    return dataclasses.replace(config, scheduler=sc)
