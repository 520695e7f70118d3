"""Host time of one whole engine step with the forward pass replaced by a stub (`cbbench bench-step --stub-model`).

What a GPU would hide is taken out (perf/bench/step_engine.py makes the engine and its stub model), so what is timed
is the engine's own host work per decode step at N running requests: schedule + input preparation + sampling +
update_from_output + detokenize + outputs. On an H200 a qwen2.5-0.5B decode step at 256 requests runs a few ms of
device time, so host work above about 1.5 ms per step would leave the GPU idle (the host-time target).

Device stand-in time. On this CPU the stub's tensors and the sampler's kernels would still execute on the host
thread (an argmax over 256 x 2048 floats alone is ~1 ms here, and its 2 MB of logits evict the host's caches);
on a GPU they are a few asynchronous kernel launches and the host never touches the logits. So while timed, the
stub also stands in for the sampler's kernels (`StubModel.sample`: the ids it made the argmax of; every request is
greedy with nothing masked, so that is exactly what `refengine.worker.model_runner.sample` returns) and its logits are a
placeholder. The table shows "device us", the CPU time inside the model's forward / compute_logits and the
sampler (the stub's, or with --real-model the real ones), and "host us" = CPU time of the step - device: the
engine's own host work, which the target is read against. (This thread's CPU time, not wall time: on a shared
machine the wall time also counts waiting for a core. The real sampler's few kernel launches, some 10-20 us of
host time on a GPU, are not counted.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import torch

from cbbench.perf.bench.step_engine import STUB_VOCAB, StubModel, make_decoding_engine

if TYPE_CHECKING:
    from refengine import LLMEngine
    from refengine.sample.sampler import SamplingMetadata

_P = ParamSpec("_P")
_R = TypeVar("_R")

TARGET_US = 1500.0  # host time per decode step at 256 running requests, so an H200 is not left idle


# (object path, method): the parts of a step timed separately with --breakdown; the rest of step() is "outputs"
# (stop strings, detokenisation, the RequestOutputs, step stats)
PHASES = {
    "schedule": ("scheduler", "schedule"),
    "execute_model": ("model_runner", "execute_model"),
    "update_from_output": ("scheduler", "update_from_output"),
}


def _time_phases(engine: LLMEngine) -> dict[str, list[float]]:
    """Wrap the engine's phase methods (instance attributes) to record this thread's CPU microseconds per call."""
    spent: dict[str, list[float]] = {}
    for name, (owner, method) in PHASES.items():
        obj = getattr(engine, owner, None)
        fn = getattr(obj, method, None)
        if fn is None:
            continue
        spent[name] = []

        def timed(*args: Any, _fn: Callable[..., Any] = fn, _out: list[float] = spent[name], **kwargs: Any) -> Any:
            c = time.thread_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                _out.append((time.thread_time() - c) * 1e6)

        setattr(obj, method, timed)
    return spent


class _DeviceClock:
    """This thread's CPU seconds spent inside the work a GPU would run asynchronously: the model's forward and
    compute_logits, and the sampler, which for the stub is its own `sample` (see the module docstring).
    `sample` is the engine's sampler throughout; the timing is on between start() and close()."""

    def __init__(self) -> None:
        from refengine.sample.sampler import sample

        self.spent = 0.0
        self.stub: StubModel | None = None  # (set once the engine is made)
        self._real_sample, self._sample = sample, sample
        self._model: torch.nn.Module | None = None

    def sample(self, logits: torch.Tensor, md: SamplingMetadata, generator: torch.Generator | None) -> torch.Tensor:
        return self._sample(logits, md, generator)

    def start(self, model: torch.nn.Module) -> None:
        self._model = model
        if self.stub is not None:
            self.stub.one_hot = False  # (its `sample` replaces the real sampler)
        self._sample = self._timed(self.stub.sample if self.stub is not None else self._real_sample)
        for name in ("forward", "compute_logits"):  # (instance attributes, shadowing the methods while timed)
            setattr(model, name, self._timed(getattr(model, name)))

    def _timed(self, fn: Callable[_P, _R]) -> Callable[_P, _R]:
        def timed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent += time.thread_time() - t

        return timed

    def close(self) -> None:
        self._sample = self._real_sample
        if self._model is not None:
            for name in ("forward", "compute_logits"):
                delattr(self._model, name)
        if self.stub is not None:
            self.stub.one_hot = True


def _time_steps(
    engine: LLMEngine, clock: _DeviceClock, spent: dict[str, list[float]], iters: int, expected: int, device: str
) -> tuple[list[float], list[float], list[float], dict[str, list[float]]]:
    """Run `iters` timed decode steps: per step, the wall and CPU microseconds, the device stand-in CPU microseconds
    (`clock`), and the CPU microseconds of each phase recorded in `spent` (by _time_phases)."""
    sync: Callable[[], None] = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times: list[float] = []
    cpu: list[float] = []
    device_us: list[float] = []
    per_step: dict[str, list[float]] = {k: [] for k in spent}
    clock.start(engine.model)
    try:
        for _ in range(iters):
            marks = {k: len(v) for k, v in spent.items()}
            sync()
            clock.spent = 0.0
            t, c = time.perf_counter(), time.thread_time()
            outs = engine.step()
            sync()
            times.append((time.perf_counter() - t) * 1e6)
            cpu.append((time.thread_time() - c) * 1e6)
            device_us.append(clock.spent * 1e6)
            for k, v in spent.items():  # a phase may run more than once in a step: its calls are summed
                per_step[k].append(sum(v[marks[k] :]))
            if len(outs) != expected:  # every request decodes every step: nothing finished, nothing preempted
                raise RuntimeError(f"bench-step: a step returned {len(outs)} outputs, expected {expected}")
    finally:
        clock.close()
    return times, cpu, device_us, per_step


def bench_engine_step_us(
    num_running: int,
    iters: int = 100,
    warmup: int = 5,
    *,
    model: str = "tiny-qwen2",
    device: str = "cpu",
    stub: bool = True,
    vocab: int = STUB_VOCAB,
    stop: list[str] | None = None,
    breakdown: bool = False,
    detokenizer: str = "incremental",
    output_kind: str = "delta",
) -> dict[str, Any]:
    """Microseconds per engine.step() (median, p90, min) over `iters` decode steps at `num_running` requests;
    with `breakdown`, also the median CPU microseconds of each of PHASES and of the rest ("outputs")."""
    clock = _DeviceClock()
    engine, _ = make_decoding_engine(
        num_running,
        iters + warmup,
        model=model,
        device=device,
        stub=stub,
        vocab=vocab,
        stop=stop,
        detokenizer=detokenizer,
        output_kind=output_kind,
        clock=clock,
    )
    expected = 0 if output_kind == "final_only" else num_running  # (nothing finishes while timed)
    for _ in range(warmup):
        engine.step()
    spent = _time_phases(engine) if breakdown else {}
    times, cpu, device_us, per_step = _time_steps(engine, clock, spent, iters, expected, device)
    host = [c - d for c, d in zip(cpu, device_us)]
    result: dict[str, Any] = {
        "num_running": num_running,
        "median_us": statistics.median(times),
        "p90_us": sorted(times)[int(0.9 * (len(times) - 1))],
        "min_us": min(times),
        "iters": iters,
        "cpu_median_us": statistics.median(cpu),
        "device_median_us": statistics.median(device_us),
        "host_median_us": statistics.median(host),
    }
    if breakdown:
        rest = [cpu[i] - sum(p[i] for p in per_step.values()) for i in range(iters)]
        result["phases_us"] = {
            **{k: statistics.median(v) for k, v in per_step.items()},
            "outputs": statistics.median(rest),
        }
    return result


def format_breakdown(rows: list[dict[str, Any]]) -> str:
    """One line per N: the median CPU microseconds of each phase (from bench_engine_step_us(breakdown=True))."""
    names = list(rows[0]["phases_us"])
    lines = [f"{'running':>8} " + " ".join(f"{n:>18}" for n in names)]
    for r in rows:
        lines.append(f"{r['num_running']:>8} " + " ".join(f"{r['phases_us'][n]:>18.1f}" for n in names))
    return "\n".join(lines)


def format_table(rows: list[dict[str, float]], target_us: float | None = TARGET_US) -> str:
    """One line per N: median / p90 / min wall microseconds per step, the median of this thread's CPU time per step
    (on a shared, loaded CPU the wall time includes waiting for a core; the CPU time does not), the medians of the
    device stand-in CPU time and of the host CPU time (cpu - device), the host time per request, and against the target."""
    head = (
        f"{'running':>8} {'median us':>10} {'p90 us':>10} {'min us':>10} {'cpu us':>10} {'device us':>10} "
        f"{'host us':>10} {'host us/req':>12}"
    )
    if target_us:
        head += f" {'host/target':>12}"
    lines = [head]
    for r in rows:
        line = (
            f"{r['num_running']:>8} {r['median_us']:>10.1f} {r['p90_us']:>10.1f} {r['min_us']:>10.1f} "
            f"{r['cpu_median_us']:>10.1f} {r['device_median_us']:>10.1f} {r['host_median_us']:>10.1f} "
            f"{r['host_median_us'] / r['num_running']:>12.2f}"
        )
        if target_us:
            line += f" {r['host_median_us'] / target_us:>11.2f}x"
        lines.append(line)
    return "\n".join(lines)
