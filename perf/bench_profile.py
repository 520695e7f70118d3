"""Where a step's CPU time goes, refengine's continuous batching beside transformers' (`cbbench bench-profile`).

Both engines run the same ShareGPT workload through the perf runners (`runner.run_refengine`, `peers.run_hf_cb`:
same weights, prompts, output lengths, concurrency, dtype and torch threads) while a `PhaseClock` charges the CPU
time of the thread that runs the steps to named phases. Phases nest and are exclusive: time inside the attention
module is not also counted in "model other", and what no phase claims is the remainder of the enclosing one.

The clock is `time.thread_time()` (CPU time of the stepping thread), not wall time: on a shared, loaded CPU the
wall time also counts waiting for a core, which neither engine controls. Both engines are timed the same way
(class-level wraps and global module hooks, installed for the run only), so the per-call overhead of the
instrument (about a microsecond per module call) falls on both alike.

`torch.profiler` gives the op-level view of the same runs (`ops=True`): it records the ops of every thread,
transformers' generation thread included.

The floor (`gemm_floor`): the lm_head and MLP GEMMs of a decode step at M rows, timed alone with the same torch
threads, interleaved with real decode steps of the engine at M running requests (`bench_step.make_decoding_engine`).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

# the phases of a step, in table order; the ones a given engine has no counterpart for stay empty
PHASES = ("schedule", "input prep", "embedding", "attention", "mlp", "norms", "model other", "lm_head",
          "penalties", "seeded noise", "top-k/top-p", "sampling other", "update", "outputs")


class PhaseClock:
    """Exclusive CPU seconds per phase. Phases nest per thread: entering one charges the time since the last mark
    to the phase it interrupts."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.steps = 0  # calls of the method that makes one engine step
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
        return self._local.stack

    def timed(self, fn: Callable, name: str, is_step: bool = False) -> Callable:
        def wrapper(*args, **kwargs):
            self.steps += is_step
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()
        return wrapper


@contextmanager
def _patched(clock: PhaseClock, targets: list[tuple[Any, str, str]]) -> Iterator[None]:
    """Wrap each (owner, attribute) in the clock as `phase` while inside; put them back after. The first target is
    the method that makes one step (its calls count the steps)."""
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in targets]
    try:
        for i, (owner, attr, phase) in enumerate(targets):
            setattr(owner, attr, clock.timed(getattr(owner, attr), phase, is_step=i == 0))
        yield
    finally:
        for owner, attr, fn in saved:
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
    if name.endswith("ForCausalLM"):
        return "model other"  # rope, masks, residual adds: what the layers above leave
    if isinstance(module, torch.nn.Linear) and module.out_features == vocab_size:
        return "lm_head"  # (transformers' lm_head; refengine's is compute_logits, wrapped by _refengine_targets)
    return None


@contextmanager
def _module_hooks(clock: PhaseClock, vocab_size: int) -> Iterator[None]:
    from torch.nn.modules import module as nn_module

    def pre(mod, args):
        phase = _module_phase(mod, vocab_size)
        if phase is not None:
            clock.enter(phase)

    def post(mod, args, out):
        if _module_phase(mod, vocab_size) is not None:
            clock.exit()

    handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _refengine_targets() -> list[tuple[Any, str, str]]:
    import refengine.model_runner as runner_module
    import refengine.sampler as sampler_module
    from refengine.engine import LLMEngine
    from refengine.model import CausalLM
    from refengine.model_runner import ModelRunner
    from refengine.penalties import PenaltyTables
    from refengine.scheduler import Scheduler

    return [(LLMEngine, "step", "outputs"), (Scheduler, "schedule", "schedule"),
            (Scheduler, "update_from_output", "update"), (ModelRunner, "execute_model", "input prep"),
            (CausalLM, "compute_logits", "lm_head"), (runner_module, "sample", "sampling other"),
            (PenaltyTables, "update_and_gather", "penalties"), (sampler_module, "apply_penalties", "penalties"),
            (sampler_module, "seeded_exponential", "seeded noise"),
            (sampler_module, "_mask_top_k_top_p", "top-k/top-p")]


def _hf_cb_targets() -> list[tuple[Any, str, str]]:
    from transformers.generation.continuous_batching import continuous_api, model_runner, scheduler

    cbp = continuous_api.ContinuousBatchProcessor
    return [(cbp, "_generation_step", "input prep"), (cbp, "prepare_next_batch", "input prep"),
            (scheduler.FIFOScheduler, "schedule_batch", "schedule"), (model_runner.ModelRunner, "_sample", "sampling other"),
            (cbp, "update_batch", "update")]


def _vocab_size(model: str) -> int:
    import json
    from pathlib import Path

    from refengine.loader import PRESETS, config_from_hf

    if model in PRESETS:
        return PRESETS[model].vocab_size
    return config_from_hf(json.loads((Path(model) / "config.json").read_text())).vocab_size


def profile_run(engine: str, workload: Any, *, model: str, max_num_seqs: int, seed: int = 0,
                ops: bool = False) -> dict[str, Any]:
    """Run `workload` through `engine` ("refengine" continuous, or "hf-cb") at `max_num_seqs` in flight; return
    tokens/s, the number of steps and the mean CPU milliseconds per step of each phase (and the top ops)."""
    from .peers import run_hf_cb
    from .runner import run_refengine

    vocab = _vocab_size(model)
    clock = PhaseClock()
    targets = _refengine_targets() if engine == "refengine" else _hf_cb_targets()
    with ExitStack() as stack:
        stack.enter_context(_patched(clock, targets))
        stack.enter_context(_module_hooks(clock, vocab))
        prof = stack.enter_context(torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])) \
            if ops else None
        if engine == "refengine":
            res = run_refengine(workload, model=model, device="cpu", dtype=None, seed=seed, batching="continuous",
                                knobs={"max_num_seqs": max_num_seqs}, warmup=0)
        else:
            res = run_hf_cb(workload, model, device="cpu", dtype=None, max_num_seqs=max_num_seqs,
                            max_num_batched_tokens=None, warmup=0, seed=seed)
    if res.error:
        raise RuntimeError(f"{engine}: {res.error}")
    steps = clock.steps
    out_tokens = sum(r["output_len"] for r in res.records)
    result = {"engine": engine, "max_num_seqs": max_num_seqs, "steps": steps, "duration_s": res.duration,
              "out_tok_s": out_tokens / res.duration, "cpu_s": sum(clock.spent.values()),
              "phase_ms": {p: 1e3 * clock.spent.get(p, 0.0) / max(steps, 1) for p in PHASES}}
    if prof is not None:
        result["ops"] = [(e.key, e.self_cpu_time_total / 1e3 / max(steps, 1), e.count / max(steps, 1))
                         for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]]
    return result
