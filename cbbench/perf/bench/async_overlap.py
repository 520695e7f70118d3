"""Overlap gain of async scheduling (`cbbench bench-async`): one workload through LLMEngine with
async_scheduling off and on, in the same process, alternating repeats, and the throughput ratio on / off.

With async scheduling the forward of step N runs in a worker thread while the main thread schedules step N+1 and
processes step N-1's output (update_from_output, stop strings, detokenisation, RequestOutputs). Torch releases the
GIL inside its kernels, so on the CPU the host work overlaps the forward as it would overlap a GPU's: the gain is
bounded by the host share of a step. Both modes must produce the same tokens; the benchmark checks that.

`device_ms`: the forward is bench-step's stub model plus a sleep of that many milliseconds, a stand-in for device
time that needs no host CPU (as a GPU's forward): what async scheduling hides on a GPU, here measurable on a CPU.
(The stub's tokens depend on how many steps sampled, so token equality is checked with the real model only.)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from cbbench.perf.bench.step import StubModel
from refengine import LLMEngine, SamplingParams
from refengine.models.presets import load_model_config

_TOKEN_IDS = (100, 100_000)  # ordinary BPE ids, clear of the special tokens


@dataclass
class AsyncBenchRow:
    async_scheduling: bool
    seconds: list[float]
    output_tokens: int

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / statistics.median(self.seconds)


def _prompts(num_requests: int, prompt_len: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(*_TOKEN_IDS, (prompt_len,), generator=g).tolist() for _ in range(num_requests)]


def _run_once(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, tag: str) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    start = time.perf_counter()
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.outputs[0].token_ids)
    return time.perf_counter() - start, [tokens[rid] for rid in ids]


def _sleeping_stub(model: str, device_ms: float) -> StubModel:

    stub = StubModel(load_model_config(model).hidden_size)
    forward = stub.forward

    def slept(*args: Any, **kwargs: Any) -> torch.Tensor:
        time.sleep(device_ms / 1e3)  # releases the GIL, as a wait on a device would
        return forward(*args, **kwargs)

    stub.forward = slept  # type: ignore[method-assign]  # an instance attribute shadowing the method, on purpose
    return stub


def bench_async(
    num_requests: int = 32,
    prompt_len: int = 64,
    max_tokens: int = 64,
    repeats: int = 3,
    model: str = "tiny-qwen2",
    device: str = "cpu",
    seed: int = 0,
    device_ms: float | None = None,
    **knobs: Any,
) -> list[AsyncBenchRow]:
    """[sync row, async row]; raises AssertionError if the two modes' tokens differ (real model)."""
    prompts = _prompts(num_requests, prompt_len, seed)
    # KV for the whole workload at once, not the CPU default of 1 GiB (16384 block objects for the scheduler)
    bs = knobs.get("block_size", 16)
    knobs.setdefault("num_gpu_blocks", num_requests * -(-(prompt_len + max_tokens) // bs) + 8)
    stubs = {
        mode: {"model_impl": _sleeping_stub(model, device_ms)} if device_ms is not None else {}
        for mode in (False, True)
    }
    engines = {
        mode: LLMEngine(model, device=device, async_scheduling=mode, **knobs, **stubs[mode]) for mode in (False, True)
    }
    for mode, engine in engines.items():  # warm-up: first-use kernel selection, allocator growth
        _run_once(engine, prompts[: max(1, num_requests // 4)], 4, f"warm{int(mode)}")
    rows = {mode: AsyncBenchRow(mode, [], 0) for mode in engines}
    reference = None
    for r in range(repeats):
        for mode in (False, True) if r % 2 == 0 else (True, False):  # alternate, so drift hits both alike
            secs, tokens = _run_once(engines[mode], prompts, max_tokens, f"r{r}")
            rows[mode].seconds.append(secs)
            rows[mode].output_tokens = sum(map(len, tokens))
            if reference is None:
                reference = tokens
            assert device_ms is not None or tokens == reference, "async scheduling changed the generated tokens"
    for engine in engines.values():
        engine.shutdown()
    return [rows[False], rows[True]]


def format_table(rows: list[AsyncBenchRow]) -> str:
    lines = [f"{'async_scheduling':>16}  {'median s':>9}  {'min s':>7}  {'max s':>7}  {'output tok/s':>12}"]
    for row in rows:
        lines.append(
            f"{str(row.async_scheduling):>16}  {statistics.median(row.seconds):9.3f}  "
            f"{min(row.seconds):7.3f}  {max(row.seconds):7.3f}  {row.tok_per_s:12.1f}"
        )
    sync, asyn = rows
    lines.append(f"async / sync throughput: {asyn.tok_per_s / sync.tok_per_s:.3f}x")
    return "\n".join(lines)
