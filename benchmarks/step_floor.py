"""A decode step's time against its floor: what the step must read from memory (every weight once, and every
running sequence's K and V) at the device's measured bandwidth, and its matrix work at the measured matrix rate.

    python -m benchmarks.step_floor [--model llama-3.1-8b] [--device cuda] [--running 256] [--context 400]

The engine (the model's real forward; CUDA graphs where the device has them) holds `running` requests with
`context`-token prompts, all past their prefill; then `iters` decode steps are timed on the engine's clock (the wall
clock on a real device, the cost model's on `sim:<gpu>`), the device synchronised at both ends. The floor, as the
H200 notes (../shared/gpu/README.md, "Floors") compute it:

    bytes = weights (the linears of every layer, and lm_head; the embedding rows a step reads are negligible)
          + KV read (running x mean context x layers x 2 x kv heads x head dim x dtype bytes)
    memory floor  = bytes / HBM bandwidth       (measured: a device-to-device copy of COPY_BYTES, read + write)
    compute floor = 2 x weight parameters x running / matrix rate   (measured: one square GEMM, GEMM_N)
    floor = max(memory floor, compute floor);   printed: step / floor

On `sim:<gpu>` the bandwidth and matrix rate are the simulated GPU's data-sheet figures (nothing to measure); on the
CPU they are measured as on a GPU (the ratio is then about this machine, not a GPU). A benchmark: it prints, it
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from refengine import LLMEngine
    from refengine.models.model_config import ModelConfig

COPY_BYTES = 1 << 30  # the bandwidth copy: 1 GiB read + 1 GiB written, far past any cache (128 MiB on the CPU)
CPU_COPY_BYTES = 1 << 27
GEMM_N = 8192  # the matrix-rate GEMM: N x N x N (2048 on the CPU)
CPU_GEMM_N = 1024
MEASURE_REPEATS = 5  # the best of these (the device's ceiling, not its average under a noisy neighbour)
BLOCK_SIZE = 16
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Ceilings:
    bytes_per_s: float
    flops: float
    source: str  # "measured" or "data sheet (sim:...)"


def weight_params(mc: ModelConfig) -> int:
    """The parameters a decode step reads: q/k/v/o, gate/up/down of every layer, and lm_head."""
    h, d = mc.hidden_size, mc.head_dim
    attn = 2 * h * mc.num_attention_heads * d + 2 * h * mc.num_key_value_heads * d
    return mc.num_hidden_layers * (attn + 3 * h * mc.intermediate_size) + mc.vocab_size * h


def kv_bytes(mc: ModelConfig, running: int, context: float, dtype_bytes: int) -> float:
    """The K and V a decode step reads: every running sequence's whole context, every layer."""
    return running * context * mc.num_hidden_layers * 2 * mc.num_key_value_heads * mc.head_dim * dtype_bytes


def _best_seconds(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    fn()  # (warm-up: allocations, kernel selection)
    best = float("inf")
    for _ in range(MEASURE_REPEATS):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def measure_ceilings(device: str, dtype: str) -> Ceilings:
    """HBM (or DRAM) bandwidth by a copy, and the matrix rate by a GEMM, on `device`; a simulated GPU's from its
    data sheet."""
    if device.startswith("sim:"):
        from refengine.sim.gpus import get_gpu

        gpu = get_gpu(device)
        return Ceilings(gpu.hbm_bytes_per_s, gpu.bf16_flops, f"data sheet ({device})")
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    nbytes = COPY_BYTES if cuda else CPU_COPY_BYTES
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), sync)
    n = GEMM_N if cuda else CPU_GEMM_N
    tdtype = getattr(torch, dtype)
    a = torch.randn(n, n, device=dev).to(tdtype)
    b = torch.randn(n, n, device=dev).to(tdtype)
    gemm_s = _best_seconds(lambda: a @ b, sync)
    return Ceilings(2 * nbytes / copy_s, 2 * n**3 / gemm_s, "measured")


def _decoding_engine(model: str, device: str, running: int, context: int, steps: int) -> LLMEngine:
    """`running` requests of `context`-token prompts, all past their prefill, with room for `steps` more tokens."""
    from refengine import LLMEngine, SamplingParams

    budget = 8192
    steps += -(-running * context // budget) + 2  # (the first requests decode while the last ones prefill)
    per_req = -(-(context + steps + 2) // BLOCK_SIZE)
    engine = LLMEngine(
        model,
        device=device,
        max_num_seqs=running,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=running * per_req + 1,  # (given: no profiling of the device's free memory)
        max_model_len=context + steps + 2 * BLOCK_SIZE,
        max_num_batched_tokens=budget,
        enable_prefix_caching=False,
        stats_log_size=None,
    )
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    for i in range(running):
        engine.add_request(str(i), [(7 * i + 13 * j + 1) % vocab for j in range(context)], params)
    while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()
    return engine


def bench_step_floor(
    model: str, device: str, running: int, context: int, iters: int = 20, warmup: int = 3
) -> dict[str, Any]:
    """One row: the measured decode step and its floors (see the module docstring)."""
    if running < 1 or context < 1 or iters < 1 or warmup < 0:
        raise ValueError("running, context and iters must be >= 1 and warmup >= 0")
    engine = _decoding_engine(model, device, running, context, warmup + iters + 2)
    sync: Callable[[], None] = lambda: None  # noqa: E731
    if device.startswith("cuda"):
        import torch

        sync = torch.cuda.synchronize
    for _ in range(warmup):
        engine.step()
    sync()
    first = len(engine.step_stats)
    start = engine.clock.now()
    for _ in range(iters):
        engine.step()
    sync()
    step_s = (engine.clock.now() - start) / iters
    timed = list(engine.step_stats)[first:]
    known = [s.cuda_graph for s in timed if s.cuda_graph is not None]  # (a simulated GPU's steps do not say)
    graphed = sum(known) / len(known) if known else float("nan")
    mc = engine.model_config
    dtype = str(engine.dtype).removeprefix("torch.")  # (a torch.dtype on a real device, its name on a simulated one)
    dtype_bytes = DTYPE_BYTES[dtype]
    engine.shutdown()
    ceilings = measure_ceilings(device, dtype)
    mean_context = context + warmup + 1 + (iters - 1) / 2  # (each step adds a token to every sequence)
    params = weight_params(mc)
    total_bytes = params * dtype_bytes + kv_bytes(mc, running, mean_context, dtype_bytes)
    memory_s = total_bytes / ceilings.bytes_per_s
    compute_s = 2 * params * running / ceilings.flops
    floor_s = max(memory_s, compute_s)
    return {
        "model": model,
        "device": device,
        "running": running,
        "context": context,
        "step_ms": step_s * 1e3,
        "weights_gb": params * dtype_bytes / 1e9,
        "kv_gb": (total_bytes - params * dtype_bytes) / 1e9,
        "bandwidth_gb_s": ceilings.bytes_per_s / 1e9,
        "tflops": ceilings.flops / 1e12,
        "memory_floor_ms": memory_s * 1e3,
        "compute_floor_ms": compute_s * 1e3,
        "step_over_floor": step_s / floor_s,
        "graphed_steps": graphed,
        "ceilings": ceilings.source,
    }


def _share(x: float) -> str:
    return "-" if x != x else f"{x:.0%}"  # (nan: not known)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'model':>14} {'device':>9} {'running':>7} {'context':>7} {'step ms':>8} {'weights GB':>10} {'KV GB':>6} "
        f"{'GB/s':>7} {'TFLOP/s':>8} {'mem floor':>9} {'mm floor':>8} {'graphed':>7} {'step/floor':>10}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['model']:>14} {r['device']:>9} {r['running']:>7} {r['context']:>7} {r['step_ms']:>8.2f} "
            f"{r['weights_gb']:>10.2f} {r['kv_gb']:>6.2f} {r['bandwidth_gb_s']:>7.0f} {r['tflops']:>8.1f} "
            f"{r['memory_floor_ms']:>9.2f} {r['compute_floor_ms']:>8.2f} {_share(r['graphed_steps']):>7} "
            f"{r['step_over_floor']:>9.2f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_floor", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen2")
    p.add_argument("--device", default="cpu", help="cpu, cuda or sim:<gpu>")
    p.add_argument("--running", default="256", help="comma list of running decode counts")
    p.add_argument("--context", type=int, default=400, help="prompt tokens of every request")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.running.split(",") if x.strip()]
        rows = [bench_step_floor(a.model, a.device, n, a.context, a.iters, a.warmup) for n in sizes]
    except ValueError as e:
        print(f"step_floor: {e}", file=sys.stderr)
        return 2
    print(f"decode step vs its floor ({rows[0]['ceilings']} bandwidth and matrix rate; floor = max of the two)")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
