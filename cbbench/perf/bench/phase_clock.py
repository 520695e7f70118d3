"""The phase clock of `cbbench bench-profile`: exclusive CPU seconds of the stepping thread per named phase of a step.

Phases nest per thread: entering one charges the time since the last mark to the phase it interrupts, so time
inside the attention module is not also counted in "model other". The clock is `time.thread_time()`: on a shared,
loaded CPU the wall time also counts waiting for a core, which neither engine controls. Both engines are timed the
same way (class-level wraps of their step methods, `patched`, and global module hooks, `module_hooks`, installed
for the run only), so the instrument's cost per module call (about a microsecond) falls on both alike.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.modules import module as nn_module

import refengine.sample.sampler as sampler_module
from refengine.engine.llm_engine import LLMEngine
from refengine.models.decoder import CausalLM
from refengine.sample.penalties import PenaltyTables
from refengine.scheduler.scheduler import Scheduler
from refengine.worker.model_runner import ModelRunner

# the phases of a step, in table order; the ones a given engine has no counterpart for stay empty
PHASES = (
    "schedule",
    "input prep",
    "embedding",
    "attention",
    "mlp",
    "norms",
    "model other",
    "lm_head",
    "penalties",
    "seeded noise",
    "top-k/top-p",
    "sampling other",
    "update",
    "outputs",
)


class PhaseClock:
    """Exclusive CPU seconds per phase. Phases nest per thread: entering one charges the time since the last mark
    to the phase it interrupts."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.steps = 0  # calls of the method that makes one engine step
        self.on_first_step: Callable[[], None] | None = None  # e.g. start torch.profiler after the model is loaded
        self._local = threading.local()

    def enter(self, name: str) -> None:
        now, stack = time.thread_time(), self._stack()
        if stack:
            self.spent[stack[-1]] += now - self._local.mark
        stack.append(name)
        self.calls[name] += 1
        self._local.mark = now

    def exit(self) -> None:
        now, stack = time.thread_time(), self._stack()
        self.spent[stack.pop()] += now - self._local.mark
        self._local.mark = now

    def _stack(self) -> list[str]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        stack: list[str] = self._local.stack  # (threading.local's attributes are untyped)
        return stack

    def timed(self, fn: Callable[..., Any], name: str, is_step: bool = False) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.steps += is_step
            if is_step and self.steps == 1 and self.on_first_step is not None:
                self.on_first_step()
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()

        return wrapper


@contextmanager
def patched(clock: PhaseClock, targets: list[tuple[Any, str, str]]) -> Iterator[None]:
    """Wrap each (owner, attribute) in the clock as `phase` while inside; put them back after. The first target is
    the method that makes one step (its calls count the steps)."""
    # (None: the attribute is inherited from a base class, not set on `owner`; delete the wrap)
    saved = [(owner, attr, owner.__dict__.get(attr)) for owner, attr, _ in targets]
    try:
        for i, (owner, attr, phase) in enumerate(targets):
            setattr(owner, attr, clock.timed(getattr(owner, attr), phase, is_step=i == 0))
        yield
    finally:
        for owner, attr, fn in saved:
            if fn is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, fn)


def _module_phase(module: torch.nn.Module, vocab_size: int) -> str | None:
    """The phase a module's forward belongs to, by kind (refengine's and transformers' modules alike)."""
    name = type(module).__name__
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    if name.endswith("Attention"):
        return "attention"
    if name.endswith("MLP"):
        return "mlp"
    if name.endswith("RMSNorm"):
        return "norms"
    if name.endswith("ForCausalLM") or name == "CausalLM":
        return "model other"  # rope, masks, residual adds: what the layers above leave
    if isinstance(module, torch.nn.Linear) and module.out_features == vocab_size:
        return "lm_head"  # (transformers' lm_head; refengine's is compute_logits, wrapped by refengine_targets)
    return None


@contextmanager
def module_hooks(clock: PhaseClock, vocab_size: int) -> Iterator[None]:

    def pre(mod: torch.nn.Module, args: Any) -> None:
        phase = _module_phase(mod, vocab_size)
        if phase is not None:
            clock.enter(phase)

    def post(mod: torch.nn.Module, args: Any, out: Any) -> None:
        if _module_phase(mod, vocab_size) is not None:
            clock.exit()

    handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def refengine_targets() -> list[tuple[Any, str, str]]:

    return [
        (LLMEngine, "step", "outputs"),
        (Scheduler, "schedule", "schedule"),
        (Scheduler, "update_from_output", "update"),
        (ModelRunner, "execute_model", "input prep"),
        (CausalLM, "compute_logits", "lm_head"),
        (sampler_module, "sample", "sampling other"),
        (PenaltyTables, "update_and_gather", "penalties"),
        (sampler_module, "apply_penalties", "penalties"),
        (sampler_module, "seeded_exponential", "seeded noise"),
        (sampler_module, "mask_top_k_top_p", "top-k/top-p"),
    ]


def hf_cb_targets() -> list[tuple[Any, str, str]]:
    from transformers.generation.continuous_batching import continuous_api, model_runner, scheduler

    cbp = continuous_api.ContinuousBatchProcessor
    return [
        (cbp, "_generation_step", "input prep"),
        (cbp, "prepare_next_batch", "input prep"),
        (scheduler.FIFOScheduler, "schedule_batch", "schedule"),
        (model_runner.ModelRunner, "_sample", "sampling other"),
        (cbp, "update_batch", "update"),
    ]
