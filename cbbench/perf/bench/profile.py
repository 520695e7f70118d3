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

The phase clock and the engines' timed methods are perf/bench/phase_clock.py's; the floor (the lm_head and MLP
GEMMs of a decode step at M rows, timed alone) is perf/bench/gemm_floor.py's.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig

from cbbench.perf.backends.hf_cb import run_hf_cb
from cbbench.perf.backends.in_process import run_refengine
from cbbench.perf.bench.gemm_floor import step_vs_floor
from cbbench.perf.bench.phase_clock import PHASES, PhaseClock, hf_cb_targets, module_hooks, patched, refengine_targets
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.plan.load import known_vocab_size, resolve_tokenizer
from cbbench.workloads.catalog import get_workload


def _vocab_size(model: str) -> int:

    vocab = known_vocab_size(model)
    if vocab is None:
        raise ValueError(f"model: {model!r} is neither a preset nor a local folder")
    return vocab


def _ops_profiler(clock: PhaseClock) -> Any:
    """torch.profiler over every thread, started at the first step (not while the model loads)."""

    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
    )
    clock.on_first_step = prof.start
    return prof


def _run_engine(engine: str, workload: Any, *, model: str, max_num_seqs: int, seed: int) -> Any:
    """refengine continuous, or transformers' CB, over `workload` on the CPU (no warm-up: the clock skips it)."""

    if engine == "refengine":
        knobs = EngineKnobs(max_num_seqs=max_num_seqs)
        args = knobs.engine_args(model=model, device="cpu", dtype=None, seed=seed, batching="continuous")
        return run_refengine(workload, engine_args=args, knobs=knobs, warmup=0)
    return run_hf_cb(
        workload,
        model,
        device="cpu",
        dtype=None,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=None,
        warmup=0,
        seed=seed,
    )


def profile_run(
    engine: str, workload: Any, *, model: str, max_num_seqs: int, seed: int = 0, ops: bool = False
) -> dict[str, Any]:
    """Run `workload` through `engine` ("refengine" continuous, or "hf-cb") at `max_num_seqs` in flight; return
    tokens/s, the number of steps and the mean CPU milliseconds per step of each phase (and the top ops)."""
    vocab = _vocab_size(model)
    clock = PhaseClock()
    targets = refengine_targets() if engine == "refengine" else hf_cb_targets()
    prof = _ops_profiler(clock) if ops else None
    with ExitStack() as stack:
        stack.enter_context(patched(clock, targets))
        stack.enter_context(module_hooks(clock, vocab))
        res = _run_engine(engine, workload, model=model, max_num_seqs=max_num_seqs, seed=seed)
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
