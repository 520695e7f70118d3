"""Microbenchmark of the sampler's per-step device work at the model's real vocabulary width (151936).

    OMP_NUM_THREADS=1 python -m benchmarks.sampler_cost [--rows 8] [--repeats 20]

Prints milliseconds per call of `seeded_exponential` (the counter-based noise of seeded rows) beside its int64
reference (the definition, which is what the sampler ran before the int32 path) and their ratio, measured
interleaved in one run so that a busy machine slows both alike; then whole `sample()` calls for seeded, unseeded
and penalised rows. It prints numbers and ratios only; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from refengine.sample.penalties import PenaltyTables
from refengine.sample.sampler import SamplingMetadata, sample, seeded_exponential, seeded_exponential_reference
from refengine.sampling_params import SamplingParams

VOCAB = 151936  # tiny-qwen2's vocabulary, as the engine samples it


def _ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (caches, allocator)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


def _interleaved_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each function once per round, round after round: the load of a shared machine falls on all of them."""
    total = dict.fromkeys(fns, 0.0)
    for f in fns.values():
        f()
    for _ in range(repeats):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f()
            total[name] += time.perf_counter() - t0
    return {name: t / repeats * 1e3 for name, t in total.items()}


def _penalised_md(n: int) -> SamplingMetadata:
    """All-greedy rows with a repetition and a frequency penalty, 256 prompt + 64 output tokens each."""
    tables = PenaltyTables(n, VOCAB, torch.device("cpu"))
    sp = SamplingParams(temperature=0.0, repetition_penalty=1.2, frequency_penalty=0.5)
    token_ids = np.random.default_rng(0).integers(0, VOCAB, (n, 320)).astype(np.int32)
    for r in range(n):
        tables.set_row(r, sp)
    rows = np.arange(n)
    step = tables.step_arrays(rows, token_ids, np.full(n, 320), np.full(n, 256))
    assert step is not None  # None only when no row holds a penalty; every row here does (narrows the type)
    fields: dict[str, Any] = tables.update_and_gather(step, [torch.from_numpy(a.astype(np.int64)) for a in step.arrays])
    return SamplingMetadata(all_greedy=True, **fields)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    n = a.rows
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, VOCAB, generator=g)
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 3
    k = torch.arange(n, dtype=torch.int64)
    rows = torch.arange(n)
    t = torch.ones(n)
    seeded_md = SamplingMetadata(
        all_greedy=False, temperature=t, seeded_idx=rows, seeds=seeds, output_index=k, any_unseeded=False
    )
    plain_md = SamplingMetadata(all_greedy=False, temperature=t)
    pen_md = _penalised_md(n)
    pair = _interleaved_ms(
        {
            "seeded_exponential": lambda: seeded_exponential(seeds, k, VOCAB),
            "seeded_exponential_reference": lambda: seeded_exponential_reference(seeds, k, VOCAB),
        },
        a.repeats,
    )
    results = {
        **pair,
        "sample (all seeded)": _ms(lambda: sample(logits.clone(), seeded_md, g), a.repeats),
        "sample (unseeded)": _ms(lambda: sample(logits.clone(), plain_md, g), a.repeats),
        "sample (greedy)": _ms(lambda: sample(logits.clone(), SamplingMetadata(all_greedy=True), g), a.repeats),
        "sample (greedy, penalised)": _ms(lambda: sample(logits.clone(), pen_md, g), a.repeats),
    }
    print(f"rows={n} vocab={VOCAB} threads={torch.get_num_threads()}")
    for name, ms in results.items():
        print(f"  {name:<30} {ms:8.2f} ms/call  {ms / n:7.3f} ms/row")
    ratio = pair["seeded_exponential_reference"] / pair["seeded_exponential"]
    print(
        f"  seeded noise: {ratio:.1f}x faster than the int64 reference (same values: refengine/tests/test_sampler.py)"
    )


if __name__ == "__main__":
    main()
