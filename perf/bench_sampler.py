"""Microbenchmark of the sampler's per-step device work at the model's real vocabulary width (151936).

    OMP_NUM_THREADS=1 python -m perf.bench_sampler [--rows 8] [--repeats 20]

Prints milliseconds per call of `seeded_exponential` (the counter-based noise of seeded rows) and of a whole
`sample()` for seeded, penalised and plain random rows, so that a change to the sampler is measured, not guessed.
It prints numbers and ratios only; nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import time

import torch

from refengine.sampler import SamplingMetadata, sample, seeded_exponential

VOCAB = 151936  # tiny-qwen2's vocabulary, as the engine samples it


def _ms(fn, repeats: int) -> float:
    fn()  # warm-up (caches, allocator)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


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
    seeded_md = SamplingMetadata(all_greedy=False, temperature=t, seeded_idx=rows, seeds=seeds, output_index=k,
                                 any_unseeded=False)
    plain_md = SamplingMetadata(all_greedy=False, temperature=t)
    results = {
        "seeded_exponential": _ms(lambda: seeded_exponential(seeds, k, VOCAB), a.repeats),
        "sample (all seeded)": _ms(lambda: sample(logits.clone(), seeded_md, g), a.repeats),
        "sample (unseeded)": _ms(lambda: sample(logits.clone(), plain_md, g), a.repeats),
    }
    print(f"rows={n} vocab={VOCAB} threads={torch.get_num_threads()}")
    for name, ms in results.items():
        print(f"  {name:<24} {ms:8.2f} ms/call  {ms / n:7.3f} ms/row")


if __name__ == "__main__":
    main()
