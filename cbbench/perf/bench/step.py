"""`cbbench bench-step`: host time of one whole engine step with the forward pass replaced by a stub, at N running
decodes, and of a mixed step (N decodes beside one prompt's prefill) against a decode-only one.

The engine being timed (`make_decoding_engine`): an LLMEngine with N requests past their prefill, and the stub model
(`StubModel`) that stands in for its forward pass: its forward returns zeros of the right shape at once and its
compute_logits returns a fixed, pseudo-random argmax pattern, so that the step's own host work is what is left.
What is timed is schedule + input preparation + sampling + update_from_output + detokenize + outputs. On an H200 a
qwen2.5-0.5B decode step at 256 requests runs a few ms of device time, so host work above about 1.5 ms per step
would leave the GPU idle (the host-time target). The engine runs synchronously (async_scheduling=False, whatever
the device's default), so that the step's host work is all on the timed thread.

Logits width. The stub's logits row is STUB_VOCAB wide instead of the model's 151936: on a CPU an argmax over
256 x 151936 floats is ~40M elements of arithmetic (tens of ms here) that a GPU does in microseconds, and it would
swamp the host work being measured. The sampled ids therefore lie in [0, STUB_VOCAB): real Qwen BPE tokens (byte
tokens and common merges), so the detokenizer sees realistic text, including UTF-8 characters split across tokens.

Device stand-in time. On this CPU the stub's tensors and the sampler's kernels would still execute on the host
thread (an argmax over 256 x 2048 floats alone is ~1 ms here, and its 2 MB of logits evict the host's caches);
on a GPU they are a few asynchronous kernel launches and the host never touches the logits. So while timed, the
stub also stands in for the sampler's kernels (`StubModel.sample`: the ids it made the argmax of; every request is
greedy with nothing masked, so that is exactly what `refengine.sample.sampler.sample` returns) and its logits are a
placeholder. The table shows "device us", the CPU time inside the model's forward / compute_logits and the
sampler (the stub's, or with --real-model the real ones), and "host us" = CPU time of the step - device: the
engine's own host work, which the target is read against. (This thread's CPU time, not wall time: on a shared
machine the wall time also counts waiting for a core. The real sampler's few kernel launches, some 10-20 us of
host time on a GPU, are not counted.)

Mixed steps (`bench_mixed_step_us`, `--mixed-prompt-len P`): decode-only and mixed steps alternate in one engine
(fair on a noisy machine): before each mixed step one request of a P-token prompt and max_tokens=1 is added, so
the step schedules the N decodes and that whole prefill, and the request finishes in it (the next decode step
also forgets it). The ratio mixed / decode-only host time is what padding a mixed step to a CUDA-graph bucket,
and everything else a prefill adds on the host, costs against the decode-only step.

    python -m cbbench.perf.bench.step [--running 64,256] [--mixed-prompt-len 128] [--device cpu|cuda] [--iters N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import torch

from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.engine.llm_engine import LLMEngine
from refengine.models.presets import load_model_config
from refengine.sample.sampler import sample
from refengine.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from refengine.request import Request
    from refengine.sample.sampler import SamplingMetadata

_P = ParamSpec("_P")
_R = TypeVar("_R")

PROMPT_LEN = 32
STUB_VOCAB = 2048  # see the module docstring: real BPE ids, narrow enough that the argmax is not the benchmark
_PATTERN_LEN = 997  # a prime, so request r at step k (id = pattern[(7 r + k) % len]) never repeats in lockstep
_MAX_MODEL_LEN = 4096


class StubModel(torch.nn.Module):
    """Stands in for CausalLM: forward -> zeros [T, hidden]; compute_logits -> one-hot rows of a fixed pattern."""

    def __init__(self, hidden_size: int, vocab: int = STUB_VOCAB, seed: int = 0) -> None:
        super().__init__()
        self.hidden_size, self.vocab = hidden_size, vocab
        gen = torch.Generator().manual_seed(seed)
        # mostly merges (ids >= 256), with some raw byte tokens, which split multi-byte UTF-8 characters
        self.pattern = torch.randint(0, vocab, (_PATTERN_LEN,), generator=gen)
        self.num_calls = 0  # compute_logits calls: one per step that samples
        self.one_hot = True  # compute_logits makes real one-hot logits; False: a placeholder (with `sample`)
        self.last_ids: torch.Tensor | None = None  # [n] the argmax of the last logits

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Any, attn_metadata: Any
    ) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], self.hidden_size, device=input_ids.device)  # [T, hidden]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        n = hidden.shape[0]
        rows = torch.arange(n)
        ids = self.pattern[(7 * rows + self.num_calls) % _PATTERN_LEN]
        self.num_calls += 1
        self.last_ids = ids = ids.to(hidden.device)
        if not self.one_hot:
            return hidden[:, :1]  # [n, 1] placeholder: `sample` knows the answer
        logits = torch.zeros(n, self.vocab, device=hidden.device)  # [n, vocab] float32
        logits[rows.to(hidden.device), ids] = 1.0
        return logits

    def sample(self, logits: torch.Tensor, md: SamplingMetadata, generator: torch.Generator | None) -> torch.Tensor:
        """Stands in for refengine.worker.model_runner.sample on the stub's logits: the greedy argmax, known already."""
        if not md.all_greedy or md.banned_rows is not None:
            raise RuntimeError("StubModel.sample stands in for greedy sampling with nothing masked only")
        if self.last_ids is None:  # the engine samples only after compute_logits: never None here
            raise RuntimeError("StubModel.sample called before compute_logits")
        return self.last_ids


class FullRedecodeDetokenizer:
    """What the engine did before its detokenizer became incremental, for `--detokenizer full-redecode`'s
    before/after comparison: every step decodes the whole output again (O(output length) per step), then keeps
    the new text past what it had (less a trailing U+FFFD: a character still split)."""

    # __new__ returns the detokenizer itself (an instance of a subclass of refengine's, made here), not an instance
    # of this class: mypy requires a subclass of cls from __new__
    def __new__(cls, tokenizer: Any, request: Request) -> IncrementalDetokenizer:  # type: ignore[misc]

        class _Full(IncrementalDetokenizer):
            def update(self) -> str | None:
                if self.stopped_by is not None or self.tokenizer is None:
                    return None
                text = self.tokenizer.decode(self.request.output_token_ids)
                text = text[:-1] if text.endswith("\ufffd") else text
                self._num_decoded = self.request.num_output_tokens
                new_text = text[self.num_chars :]
                return self._append(new_text, check_stops=True) if new_text else None

        return _Full(tokenizer, request)


DETOKENIZERS = ("incremental", "full-redecode")
OUTPUT_KINDS = ("delta", "cumulative", "final_only")  # SamplingParams.output_kind, by RequestOutputKind's names


def make_decoding_engine(
    num_running: int,
    max_steps: int,
    *,
    model: str = "tiny-qwen2",
    device: str = "cpu",
    stub: bool = True,
    vocab: int = STUB_VOCAB,
    stop: list[str] | None = None,
    detokenizer: str = "incremental",
    output_kind: str = "delta",
    clock: _DeviceClock | None = None,
    mixed_prompt_len: int = 0,
) -> tuple[LLMEngine, StubModel | None]:
    """An LLMEngine with `num_running` requests past their prefill, each with room for `max_steps` more decode
    steps, and (`stub`) the stub model in place of the real one; returns (engine, stub model or None). `clock`
    becomes the engine's sampler, so that it can time it (and stand in for it with the stub's).
    `mixed_prompt_len` > 0: room for one more request of that prompt length (bench_mixed_step_us adds them)."""

    if detokenizer not in DETOKENIZERS:
        raise ValueError(f"detokenizer must be one of {DETOKENIZERS}, got {detokenizer!r}")
    if output_kind not in OUTPUT_KINDS:
        raise ValueError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}")
    block_size = 16
    per_req = -(-(PROMPT_LEN + max_steps + 4) // block_size)
    stub_model = StubModel(load_model_config(model).hidden_size, vocab) if stub else None
    extra = -(-(mixed_prompt_len + 2) // block_size) if mixed_prompt_len else 0
    engine = LLMEngine(
        model,
        device=device,
        max_num_seqs=num_running + (1 if mixed_prompt_len else 0),
        block_size=block_size,
        num_gpu_blocks=num_running * per_req + extra + 1,
        max_model_len=_MAX_MODEL_LEN,
        max_num_batched_tokens=max(8192, num_running * PROMPT_LEN, num_running + mixed_prompt_len),
        enable_prefix_caching=False,
        async_scheduling=False,  # (the step's host work on this thread, whatever the device's default)
        model_impl=stub_model,  # (None: refengine's own, as for the other seams)
        sampler=clock.sample if clock is not None else None,
        detokenizer_factory=FullRedecodeDetokenizer if detokenizer == "full-redecode" else None,
    )
    if clock is not None:
        clock.stub = stub_model
    params = SamplingParams(
        max_tokens=max_steps + 2,
        temperature=0.0,
        ignore_eos=True,
        stop=stop,
        output_kind=RequestOutputKind[output_kind.upper()],
    )
    for i in range(num_running):
        engine.add_request(f"r{i}", [1000 + i] + [100 + (i + j) % 5000 for j in range(PROMPT_LEN - 1)], params)
    engine.step()  # the whole batch prefills in one step and samples its first token
    running = len(engine.scheduler.running)
    if running != num_running:
        raise RuntimeError(f"bench-step: expected {num_running} running requests after prefill, got {running}")
    return engine, stub_model


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
    clock.start(cast("torch.nn.Module", engine.model))  # (None only after shutdown)
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


def _one_step(engine: LLMEngine, clock: _DeviceClock, sync: Callable[[], None]) -> tuple[float, int]:
    """One engine step: (host CPU microseconds = this thread's CPU time - the device stand-in's, outputs)."""
    sync()
    clock.spent = 0.0
    c = time.thread_time()
    outs = engine.step()
    sync()
    return (time.thread_time() - c - clock.spent) * 1e6, len(outs)


def bench_mixed_step_us(
    num_running: int,
    prompt_len: int,
    iters: int = 50,
    warmup: int = 3,
    *,
    model: str = "tiny-qwen2",
    device: str = "cpu",
    stub: bool = True,
) -> dict[str, Any]:
    """Median host microseconds of a decode-only step at `num_running` and of a mixed step (the same decodes beside
    one `prompt_len`-token prefill), alternating (see the module docstring), and their ratio."""

    if num_running < 1 or prompt_len < 2 or iters < 1 or warmup < 0:
        raise ValueError("num_running must be >= 1, prompt_len >= 2, iters >= 1 and warmup >= 0")
    clock = _DeviceClock()
    engine, _ = make_decoding_engine(
        num_running,
        2 * (iters + warmup),
        model=model,
        device=device,
        stub=stub,
        clock=clock,
        mixed_prompt_len=prompt_len,
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    sync: Callable[[], None] = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    decode_us: list[float] = []
    mixed_us: list[float] = []
    clock.start(cast("torch.nn.Module", engine.model))  # (None only after shutdown)
    try:
        for i in range(warmup + iters):
            host, n = _one_step(engine, clock, sync)
            if n != num_running:  # (every request decodes; the last mixed step's request has left)
                raise RuntimeError(f"bench-step: a decode step returned {n} outputs, expected {num_running}")
            if i >= warmup:
                decode_us.append(host)
            engine.add_request(f"mixed-{i}", [2000 + (i * 31 + j) % 5000 for j in range(prompt_len)], params)
            host, n = _one_step(engine, clock, sync)
            if n != num_running + 1:
                raise RuntimeError(f"bench-step: a mixed step returned {n} outputs, expected {num_running + 1}")
            if i >= warmup:
                mixed_us.append(host)
    finally:
        clock.close()
    decode, mixed = statistics.median(decode_us), statistics.median(mixed_us)
    return {
        "num_running": num_running,
        "prompt_len": prompt_len,
        "decode_host_us": decode,
        "mixed_host_us": mixed,
        "ratio": mixed / decode,
    }


def format_mixed_table(rows: list[dict[str, Any]]) -> str:
    """One line per N: the median host microseconds of a decode-only and of a mixed step, and mixed / decode."""
    lines = [f"{'running':>8} {'prompt':>7} {'decode host us':>15} {'mixed host us':>14} {'mixed/decode':>13}"]
    for r in rows:
        lines.append(
            f"{r['num_running']:>8} {r['prompt_len']:>7} {r['decode_host_us']:>15.1f} {r['mixed_host_us']:>14.1f} "
            f"{r['ratio']:>12.2f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cbbench.perf.bench.step`: the mixed / decode-only host-time table (stub model unless --real-model)."""
    p = argparse.ArgumentParser(prog="python -m cbbench.perf.bench.step", description=main.__doc__)
    p.add_argument("--running", default="64,256", help="comma list of running decode counts")
    p.add_argument("--mixed-prompt-len", type=int, default=128, help="prompt tokens prefilled beside the decodes")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--model", default="tiny-qwen2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--real-model", action="store_true", help="the model's real forward instead of the stub")
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.running.split(",") if x.strip()]
        rows = [
            bench_mixed_step_us(
                n, a.mixed_prompt_len, a.iters, a.warmup, model=a.model, device=a.device, stub=not a.real_model
            )
            for n in sizes
        ]
    except ValueError as e:
        print(f"bench step: {e}", file=sys.stderr)
        return 2
    forward = "real" if a.real_model else "stub"
    print(f"host us per step, {forward} model {a.model} on {a.device}, decode-only vs mixed, {a.iters} of each")
    print(format_mixed_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
