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
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn.functional as F

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
        return self._local.stack

    def timed(self, fn: Callable, name: str, is_step: bool = False) -> Callable:
        def wrapper(*args, **kwargs):
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
def _patched(clock: PhaseClock, targets: list[tuple[Any, str, str]]) -> Iterator[None]:
    """Wrap each (owner, attribute) in the clock as `phase` while inside; put them back after. The first target is
    the method that makes one step (its calls count the steps)."""
    # (None: the attribute is inherited, e.g. Scheduler.update_from_output from SchedulerUpdate; delete the wrap)
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
    import refengine.sampler as sampler_module
    from refengine.engine import LLMEngine
    from refengine.model import CausalLM
    from refengine.model_runner import ModelRunner
    from refengine.penalties import PenaltyTables
    from refengine.scheduler import Scheduler

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
        (sampler_module, "_mask_top_k_top_p", "top-k/top-p"),
    ]


def _hf_cb_targets() -> list[tuple[Any, str, str]]:
    from transformers.generation.continuous_batching import continuous_api, model_runner, scheduler

    cbp = continuous_api.ContinuousBatchProcessor
    return [
        (cbp, "_generation_step", "input prep"),
        (cbp, "prepare_next_batch", "input prep"),
        (scheduler.FIFOScheduler, "schedule_batch", "schedule"),
        (model_runner.ModelRunner, "_sample", "sampling other"),
        (cbp, "update_batch", "update"),
    ]


def _vocab_size(model: str) -> int:
    import json
    from pathlib import Path

    from refengine.loader import PRESETS, config_from_hf

    if model in PRESETS:
        return PRESETS[model].vocab_size
    return config_from_hf(json.loads((Path(model) / "config.json").read_text())).vocab_size


def profile_run(
    engine: str, workload: Any, *, model: str, max_num_seqs: int, seed: int = 0, ops: bool = False
) -> dict[str, Any]:
    """Run `workload` through `engine` ("refengine" continuous, or "hf-cb") at `max_num_seqs` in flight; return
    tokens/s, the number of steps and the mean CPU milliseconds per step of each phase (and the top ops)."""
    from cbbench.perf.backends.hf import run_hf_cb
    from cbbench.perf.backends.in_process import run_refengine

    vocab = _vocab_size(model)
    clock = PhaseClock()
    targets = _refengine_targets() if engine == "refengine" else _hf_cb_targets()
    prof = None
    if ops:  # started at the first step (not while the model loads), in whichever thread steps; all threads
        from torch._C._profiler import _ExperimentalConfig

        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            experimental_config=_ExperimentalConfig(profile_all_threads=True),
        )
        clock.on_first_step = prof.start
    with ExitStack() as stack:
        stack.enter_context(_patched(clock, targets))
        stack.enter_context(_module_hooks(clock, vocab))
        if engine == "refengine":
            res = run_refengine(
                workload,
                model=model,
                device="cpu",
                dtype=None,
                seed=seed,
                batching="continuous",
                knobs={"max_num_seqs": max_num_seqs},
                warmup=0,
            )
        else:
            res = run_hf_cb(
                workload,
                model,
                device="cpu",
                dtype=None,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=None,
                warmup=0,
                seed=seed,
            )
        if prof is not None and clock.steps:
            prof.stop()
    if res.error:
        raise RuntimeError(f"{engine}: {res.error}")
    steps = clock.steps
    out_tokens = sum(r.output_len for r in res.records)
    result = {
        "engine": engine,
        "max_num_seqs": max_num_seqs,
        "steps": steps,
        "duration_s": res.duration,
        "out_tokens": out_tokens,
        "out_tok_s": out_tokens / res.duration,
        "cpu_s": sum(clock.spent.values()),
        "phase_ms": {p: 1e3 * clock.spent.get(p, 0.0) / max(steps, 1) for p in PHASES},
    }
    if prof is not None and clock.steps:
        result["ops"] = [
            (e.key, e.self_cpu_time_total / 1e3 / max(steps, 1), e.count / max(steps, 1))
            for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
        ]
    return result


def _gemm_floor_s(model: torch.nn.Module, m: int) -> float:
    """CPU seconds of the decode step's GEMMs alone at M = m rows: every layer's MLP (gate, up, down) and the
    lm_head as the model runner computes it (`compute_logits` into a reused float32 buffer), on random activations
    of the model's dtype."""
    cfg = model.config
    x = torch.randn(m, cfg.hidden_size, dtype=model.lm_head.weight.dtype)
    xi = torch.randn(m, cfg.intermediate_size, dtype=x.dtype)
    logits = _floor_logits_buffer(m, cfg.vocab_size)
    t = time.thread_time()
    for layer in model.model.layers:
        F.linear(x, layer.mlp.gate_proj.weight)
        F.linear(x, layer.mlp.up_proj.weight)
        F.linear(xi, layer.mlp.down_proj.weight)
    model.compute_logits(x, out=logits)
    return time.thread_time() - t


_floor_buffers: dict[tuple[int, int], torch.Tensor] = {}


def _floor_logits_buffer(m: int, vocab: int) -> torch.Tensor:
    """The floor's logits buffer, made once per shape (as the runner's, which outlives its steps)."""
    if (m, vocab) not in _floor_buffers:
        _floor_buffers[(m, vocab)] = torch.empty(m, vocab, dtype=torch.float32)
    return _floor_buffers[(m, vocab)]


def step_vs_floor(num_running: int, iters: int = 20, warmup: int = 3, model: str = "tiny-qwen2") -> dict[str, float]:
    """Median CPU ms of a real decode step at `num_running` (bench_step's engine: short prompts, greedy) and of its
    GEMM floor, measured alternately in this thread, and the ratio of the medians."""
    from cbbench.perf.bench.step import make_decoding_engine

    engine, _ = make_decoding_engine(num_running, iters + warmup, model=model, stub=False)
    lm = engine.model_runner.model
    steps, floors = [], []
    with torch.inference_mode():
        for i in range(warmup + iters):
            t = time.thread_time()
            engine.step()
            step = time.thread_time() - t
            floor = _gemm_floor_s(lm, num_running)
            if i >= warmup:
                steps.append(step)
                floors.append(floor)
    step_ms, floor_ms = 1e3 * statistics.median(steps), 1e3 * statistics.median(floors)
    return {
        "num_running": num_running,
        "step_ms": step_ms,
        "floor_ms": floor_ms,
        "ratio": step_ms / floor_ms,
        "step_ms_min": 1e3 * min(steps),
        "step_ms_max": 1e3 * max(steps),
        "floor_ms_min": 1e3 * min(floors),
        "floor_ms_max": 1e3 * max(floors),
    }


def format_markdown(runs: list[dict[str, Any]], floors: list[dict[str, float]]) -> str:
    """The profile as markdown: one column per (engine, in flight), one row per phase (mean CPU ms per step)."""
    head = [f"{r['engine']} @ {r['max_num_seqs']}" for r in runs]
    lines = ["| CPU ms per step | " + " | ".join(head) + " |", "|---" * (len(runs) + 1) + "|"]
    for p in PHASES:
        lines.append(f"| {p} | " + " | ".join(f"{r['phase_ms'][p]:.2f}" for r in runs) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(r['phase_ms'].values()):.2f}**" for r in runs) + " |")
    lines.append("| steps | " + " | ".join(str(r["steps"]) for r in runs) + " |")
    lines.append("| CPU s in steps | " + " | ".join(f"{r['cpu_s']:.1f}" for r in runs) + " |")
    lines.append("| wall s (loaded machine) | " + " | ".join(f"{r['duration_s']:.1f}" for r in runs) + " |")
    lines.append("| output tok per CPU s | " + " | ".join(f"{r['out_tokens'] / r['cpu_s']:.1f}" for r in runs) + " |")
    if any("ops" in r for r in runs):
        for r in runs:
            lines += [
                "",
                f"Top ops of {r['engine']} @ {r['max_num_seqs']} (torch.profiler, self CPU ms per step "
                "(wall clock), calls per step):",
                "",
            ]
            lines += [f"    {name:<52} {ms:9.2f} ms {calls:7.1f}" for name, ms, calls in r["ops"]]
    if floors:
        lines += [
            "",
            "| decode step at M running | step CPU ms (median) | GEMM floor CPU ms (median) | step / floor |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {f['num_running']} | {f['step_ms']:.1f} ({f['step_ms_min']:.1f}-{f['step_ms_max']:.1f}) | "
            f"{f['floor_ms']:.1f} ({f['floor_ms_min']:.1f}-{f['floor_ms_max']:.1f}) | {f['ratio']:.2f}x |"
            for f in floors
        ]
    return "\n".join(lines)


def bench_profile(
    running: list[int],
    *,
    num_prompts: int = 64,
    max_prompt_len: int = 512,
    max_output_len: int = 256,
    engines: tuple[str, ...] = ("refengine", "hf-cb"),
    model: str = "tiny-qwen2",
    seed: int = 0,
    ops: bool = False,
    floor_iters: int = 20,
) -> str:
    """The whole profile (each concurrency: the engines one after the other, then the step-vs-floor check) as
    markdown. Torch threads are the caller's (one for both engines: the generation thread inherits them)."""
    from cbbench.perf.plan.load import resolve_tokenizer
    from cbbench.workloads import get_workload

    workload = get_workload(
        "sharegpt",
        tokenizer=resolve_tokenizer(model, None),
        num_prompts=num_prompts,
        seed=seed,
        max_prompt_len=max_prompt_len,
        max_output_len=max_output_len,
    )
    runs = [profile_run(e, workload, model=model, max_num_seqs=n, seed=seed, ops=ops) for n in running for e in engines]
    floors = [step_vs_floor(n, iters=floor_iters, model=model) for n in running] if floor_iters else []
    return format_markdown(runs, floors)
