"""Attention kernel benchmark: Triton `unified_attention` against the HBM floor and torch SDPA, written to a CSV.

    python -m cbbench.perf.bench.kernels --out results/kernels.csv [--quick] [--allow-cpu]

On a GPU: sweeps decode and mixed (decodes + one prefill chunk) steps at Qwen2.5-7B (28 q / 4 kv heads) and
Llama-3.1-8B (32 / 8) head shapes, bf16, each timed by CUDA-graph replay (`graph_replay_ms`): GRAPH_LAUNCHES calls
captured in one graph, its replays timed with CUDA events, the median of GRAPH_SAMPLES. Timing one call from the
host measured the Python wrapper and the launch of a small kernel, not the kernel (batch 8 read as 6% of HBM,
batch 64 as 67%); inside a graph the launches run back to back. The calls of one graph rotate over as many input
sets as keep ROTATE_BYTES of distinct KV in flight, so a replay reads HBM, not the L2 cache (50 MB on an H200) that
the previous call filled. Decode attention is memory-bound,
so the yardstick is bytes that must cross HBM at least once (K and V of every context, Q in, out) over time,
as a fraction of the HBM bandwidth measured in the same run by a large device-to-device copy. The peer is torch
`scaled_dot_product_attention` on a contiguous cache (no paging). On a CPU it stops with one line, unless
`--allow-cpu` asks for a tiny smoke run under TRITON_INTERPRET (bookkeeping checks, meaningless timings).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import pandas as pd
import torch
import torch.nn.functional as F

HEAD_SHAPES = {"qwen2.5-7b": (28, 4, 128), "llama-3.1-8b": (32, 8, 128)}  # num_heads, num_kv_heads, head_dim
DECODE_BATCHES, DECODE_CONTEXTS = (1, 8, 32, 128), (512, 2048, 8192)
MIXED_BATCHES, MIXED_CONTEXTS, MIXED_PREFILL = (8, 32), (1024, 4096), 512
BLOCK_SIZE = 16
COPY_BYTES = 1 << 31  # 2 GiB: far past any L2, so the copy sees HBM
GRAPH_LAUNCHES = 20  # calls captured in one graph: their launch gaps vanish, one replay amortises the rest
GRAPH_REPLAYS = 10  # replays between two CUDA events: one sample
GRAPH_SAMPLES = 3  # samples; the median is reported
ROTATE_BYTES = 256 << 20  # distinct inputs one graph's calls read: 5x an H200's L2, so each call reads HBM
MAX_INPUT_SETS = 16  # at most this many input sets per shape (small shapes stay launch-bound anyway)


@dataclass(frozen=True)
class BenchShape:
    """One step: `batch` sequences with `context` tokens cached before it. decode: each adds one token;
    mixed: batch - 1 decodes plus one prefill chunk of `prefill_len` tokens on its own context."""

    model: str
    kind: str  # "decode" | "mixed"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    batch: int
    context: int
    prefill_len: int = 0

    def seqs(self) -> list[tuple[int, int]]:
        """(query_len, context_len) per sequence."""
        if self.kind == "decode":
            return [(1, self.context)] * self.batch
        return [(1, self.context)] * (self.batch - 1) + [(self.prefill_len, self.context)]


def attention_bytes(shape: BenchShape, dtype_bytes: int) -> int:
    """Least HBM traffic of the step: K and V of every sequence's whole context, Q read and out written."""
    seqs = shape.seqs()
    kv_positions = sum(n + c for n, c in seqs)
    num_tokens = sum(n for n, _ in seqs)
    kv = kv_positions * shape.num_kv_heads * shape.head_dim * 2 * dtype_bytes
    return kv + num_tokens * shape.num_heads * shape.head_dim * 2 * dtype_bytes


def plan_tokens(shape: BenchShape) -> int:
    """Query tokens of the step."""
    return sum(n for n, _ in shape.seqs())


def make_inputs(shape: BenchShape, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """Paged inputs (blocks in random order, as after churn) for the kernel."""
    seqs = shape.seqs()
    seq_lens = [n + c for n, c in seqs]
    blocks = [-(-s // BLOCK_SIZE) for s in seq_lens]
    ids = torch.randperm(sum(blocks), device=device).to(torch.int32)
    block_table = torch.zeros(len(seqs), max(blocks), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(blocks):
        block_table[i, :n] = ids[start : start + n]
        start += n
    cache = (sum(blocks), BLOCK_SIZE, shape.num_kv_heads, shape.head_dim)
    num_tokens = sum(n for n, _ in seqs)
    qsl = torch.tensor([0] + [n for n, _ in seqs], device=device).cumsum(0).to(torch.int32)
    return dict(
        q=torch.randn(num_tokens, shape.num_heads, shape.head_dim, dtype=dtype, device=device),
        k_cache=torch.randn(cache, dtype=dtype, device=device),
        v_cache=torch.randn(cache, dtype=dtype, device=device),
        query_start_loc=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=block_table,
    )


def sdpa_step(shape: BenchShape, dtype: torch.dtype, device: str) -> Callable[[], object]:
    """The peer: SDPA on contiguous [B, kvH, L, D] caches; decodes batched, the prefill chunk as its own call
    with a bottom-right causal mask (its queries sit at the end of the context)."""

    h, kvh, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    n_dec = shape.batch if shape.kind == "decode" else shape.batch - 1
    L = shape.context + 1
    dq = torch.randn(n_dec, h, 1, d, dtype=dtype, device=device)
    dk, dv = (torch.randn(n_dec, kvh, L, d, dtype=dtype, device=device) for _ in range(2))
    calls: list[Callable[[], torch.Tensor]] = (
        [lambda: F.scaled_dot_product_attention(dq, dk, dv, enable_gqa=True)] if n_dec else []
    )
    if shape.kind == "mixed":
        n, Lp = shape.prefill_len, shape.context + shape.prefill_len
        pq = torch.randn(1, h, n, d, dtype=dtype, device=device)
        pk, pv = (torch.randn(1, kvh, Lp, d, dtype=dtype, device=device) for _ in range(2))
        mask = torch.arange(Lp, device=device)[None, :] <= (shape.context + torch.arange(n, device=device))[:, None]
        calls.append(lambda: F.scaled_dot_product_attention(pq, pk, pv, attn_mask=mask, enable_gqa=True))
    return lambda: [c() for c in calls]


def _timer(device: str) -> Callable[[Callable[[], object]], float]:
    """Milliseconds per call of one long-running call: do_bench on CUDA (the HBM copy), a wall clock on the CPU
    (smoke only)."""
    if device == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100)

    def cpu_time(fn: Callable[[], object]) -> float:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    return cpu_time


def num_input_sets(nbytes: int) -> int:
    """Input sets to rotate over so that one graph's calls read ROTATE_BYTES of distinct memory (at most
    MAX_INPUT_SETS; at least one, and no more than calls in a graph)."""
    return max(1, min(MAX_INPUT_SETS, GRAPH_LAUNCHES, math.ceil(ROTATE_BYTES / max(1, nbytes))))


def graph_replay_ms(calls: Sequence[Callable[[], object]], launches: int = GRAPH_LAUNCHES) -> float:
    """Milliseconds per call: `launches` calls (cycling through `calls`, each on its own inputs) captured in one
    CUDA graph, warmed up outside the capture (compiles, allocations), then GRAPH_SAMPLES times GRAPH_REPLAYS
    replays between two CUDA events; the median sample over the calls it replayed."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    samples: list[float] = []
    for _ in range(GRAPH_SAMPLES):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # (unannotated in torch)
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(GRAPH_REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(float(start.elapsed_time(end)) / (GRAPH_REPLAYS * launches))
    del graph
    return statistics.median(samples)


def measure_bandwidth_gbps(device: str, timer: Callable[[Callable[[], object]], float], nbytes: int) -> float:
    """Device memory bandwidth from a large copy: it reads and writes nbytes each."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def bench_shapes(quick: bool, smoke: bool) -> list[BenchShape]:
    if smoke:  # interpreter: tiny and few
        return [BenchShape("toy", "decode", 4, 2, 64, 2, 48), BenchShape("toy", "mixed", 4, 2, 64, 2, 24, 8)]
    models = list(HEAD_SHAPES)[:1] if quick else list(HEAD_SHAPES)
    dec_b, dec_c = ((8, 64), (2048,)) if quick else (DECODE_BATCHES, DECODE_CONTEXTS)
    mix_b, mix_c = ((8,), (1024,)) if quick else (MIXED_BATCHES, MIXED_CONTEXTS)
    shapes = []
    for m in models:
        h, kvh, d = HEAD_SHAPES[m]
        shapes += [BenchShape(m, "decode", h, kvh, d, b, c) for b in dec_b for c in dec_c]
        shapes += [BenchShape(m, "mixed", h, kvh, d, b, c, MIXED_PREFILL) for b in mix_b for c in mix_c]
    return shapes


def run_kernel_bench(out_csv: str, quick: bool = False, allow_cpu: bool = False) -> pd.DataFrame:
    """Run the sweep, write `out_csv`, return the table. On a CPU, only with allow_cpu (smoke shapes)."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not allow_cpu:
        raise RuntimeError("kernel_bench needs a CUDA GPU (pass allow_cpu / --allow-cpu for an interpreter smoke run)")
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # effective only if kernels is not imported yet
    from cbbench.kernels.triton_unified_attention import plan_unified_attention, unified_attention  # (brings in triton)

    device = "cuda" if on_gpu else "cpu"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    timer = _timer(device)
    hbm_gbps = measure_bandwidth_gbps(device, timer, COPY_BYTES if on_gpu else 1 << 24)
    rows = []
    for shape in bench_shapes(quick, smoke=not on_gpu):
        nbytes = attention_bytes(shape, torch.finfo(dtype).bits // 8)
        sets = num_input_sets(nbytes) if on_gpu else 1
        triton_calls, sdpa_calls = [], []
        for _ in range(sets):
            x = make_inputs(shape, dtype, device)
            out = torch.empty_like(x["q"])
            scale = shape.head_dim**-0.5
            args = (x["q"], x["k_cache"], x["v_cache"], out, x["query_start_loc"], x["seq_lens"], x["block_table"])
            triton_calls.append(functools.partial(unified_attention, *args, scale))
            sdpa_calls.append(sdpa_step(shape, dtype, device))
        plan = plan_unified_attention(x["q"], x["k_cache"], x["block_table"], shape.batch)
        if on_gpu:
            triton_ms, sdpa_ms = graph_replay_ms(triton_calls), graph_replay_ms(sdpa_calls)
        else:
            triton_ms, sdpa_ms = timer(triton_calls[0]), timer(sdpa_calls[0])
        del triton_calls, sdpa_calls, x, out  # (the next shape's inputs need the memory)
        gbps = nbytes / triton_ms / 1e6
        rows.append({
            **asdict(shape), "device": torch.cuda.get_device_name() if on_gpu else "cpu-interpreter",
            "dtype": str(dtype).removeprefix("torch."), "block_size": BLOCK_SIZE, "num_tokens": plan_tokens(shape),
            "num_kv_segments": plan.num_kv_segments, "block_m": plan.block_m, "tile_n": plan.tile_n,
            "timing": "cuda-graph" if on_gpu else "wall", "launches": GRAPH_LAUNCHES if on_gpu else 1,
            "input_sets": sets,
            "triton_ms": triton_ms, "bytes": nbytes, "triton_gbps": gbps, "hbm_gbps": hbm_gbps,
            "frac_of_hbm": gbps / hbm_gbps, "sdpa_ms": sdpa_ms, "sdpa_gbps": nbytes / sdpa_ms / 1e6,
            "speedup_vs_sdpa": sdpa_ms / triton_ms,
        })  # fmt: skip
    df = pd.DataFrame(rows)
    os.makedirs(os.path.dirname(os.path.abspath(out_csv)), exist_ok=True)
    df.to_csv(out_csv, index=False)
    return df


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/kernels.csv", help="CSV to write")
    p.add_argument("--quick", action="store_true", help="a few shapes only")
    p.add_argument("--allow-cpu", action="store_true", help="without CUDA, a tiny smoke run under TRITON_INTERPRET")
    a = p.parse_args(argv)
    if not torch.cuda.is_available() and not a.allow_cpu:
        print("kernel_bench: no CUDA GPU here; nothing measured (--allow-cpu runs a tiny interpreter smoke test)")
        return 2
    df = run_kernel_bench(a.out, quick=a.quick, allow_cpu=a.allow_cpu)
    cols = ["model", "kind", "batch", "context", "num_kv_segments", "triton_ms", "triton_gbps", "frac_of_hbm",
            "sdpa_ms", "speedup_vs_sdpa"]  # fmt: skip
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"wrote {a.out} ({len(df)} rows; HBM copy bandwidth {df['hbm_gbps'].iloc[0]:.0f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
