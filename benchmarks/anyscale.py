"""Ratio-level validation: Anyscale's continuous-batching benchmark replayed on a simulated A100,
`python -m benchmarks.anyscale [--num-prompts N] [--caps 32,128,512,1536]`.

The published setup (Anyscale, "How continuous batching enables 23x throughput in LLM inference", 2023): OPT-13B on
one A100, 1000 prompts of 512 tokens, output lengths drawn from an exponential distribution of mean 128 and capped
at 32 / 128 / 512 / 1536 tokens, static batches of 16 / 12 / 8 / 4 for those caps (the largest that fit), all
requests present at the start, throughput = (prompt + output tokens) / duration. It reported continuous batching
at 8x and vLLM at 23x the throughput of naive Hugging Face static batching.

Here, per cap, on `sim:a100` with the `opt-13b` shape in bf16:
- `continuous`: refengine with vLLM's offline (`LLM` class) defaults on an A100: 8192 batched tokens, 256 sequences;
- `static`: refengine's static batching at max_num_seqs = the static batch (a batch forms when the last one ends;
  a finished row stops computing);
- `hf-static`: HF `generate` at the same batch (perf/sim/hf_static.py: padded prefill, every row computed until
  the batch's longest output ends), the benchmark's own baseline.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

from cbbench.perf.sim.hf_static import simulate_hf_static_on

MODEL, DEVICE, DTYPE = "opt-13b", "sim:a100", "bfloat16"
PROMPT_LEN = 512
MEAN_OUTPUT_LEN = 128
STATIC_BATCH = {32: 16, 128: 12, 512: 8, 1536: 4}  # output cap -> the benchmark's static batch size
# vLLM's EngineArgs defaults for the offline LLM class on an A100 (it takes the smaller of its two default sets)
CONTINUOUS_MAX_NUM_BATCHED_TOKENS = 8192
CONTINUOUS_MAX_NUM_SEQS = 256
PUBLISHED = "continuous batching 8x, vLLM 23x over naive HF static batching"


# the first token id of the distinct prompts: above every preset's special ids, below every vocabulary
_PROMPT_ID_BASE = 1000


def distinct_prompt(index: int, isl: int, vocab_size: int) -> list[int]:
    """Request `index`'s prompt: `isl` ids that no other index shares at position 0, so no two prompts share a
    cached prefix even if prefix caching were on."""
    span = vocab_size - _PROMPT_ID_BASE
    return [_PROMPT_ID_BASE + (index + 7 * j) % span for j in range(isl)]


@dataclass(frozen=True)
class CapRow:
    cap: int
    batch: int
    continuous_tok_s: float  # (prompt + output tokens) / simulated seconds
    static_tok_s: float
    hf_static_tok_s: float
    wall_s: float

    @property
    def continuous_over_static(self) -> float:
        return self.continuous_tok_s / self.static_tok_s

    @property
    def continuous_over_hf_static(self) -> float:
        return self.continuous_tok_s / self.hf_static_tok_s


def output_lengths(num_prompts: int, cap: int, seed: int = 0) -> list[int]:
    """Exponential of mean MEAN_OUTPUT_LEN, rounded, at least 1, capped; the same draw for every cap."""
    rng = random.Random(seed)
    return [min(cap, max(1, round(rng.expovariate(1 / MEAN_OUTPUT_LEN)))) for _ in range(num_prompts)]


def engine_throughput(outputs: list[int], **engine_kwargs: object) -> float:
    """(prompt + output tokens) / simulated seconds for all requests present at t = 0 on a fresh simulated engine."""
    from benchmarks.engine_replay import replay
    from refengine import LLMEngine

    engine = LLMEngine(MODEL, device=DEVICE, dtype=DTYPE, stats_log_size=0, **engine_kwargs)
    vocab = engine.model_config.vocab_size
    metrics = replay(engine, [(distinct_prompt(i, PROMPT_LEN, vocab), o, 0.0) for i, o in enumerate(outputs)])
    duration = max(m["finish_time"] for m in metrics) - min(m["arrival_time"] for m in metrics)
    return float(sum(m["prompt_len"] + m["output_len"] for m in metrics) / duration)


def run_cap(cap: int, num_prompts: int = 1000, seed: int = 0) -> CapRow:
    start = time.perf_counter()
    outputs = output_lengths(num_prompts, cap, seed)
    batch = STATIC_BATCH[cap]
    cont = engine_throughput(
        outputs,
        batching="continuous",
        max_num_batched_tokens=CONTINUOUS_MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=CONTINUOUS_MAX_NUM_SEQS,
    )
    static = engine_throughput(outputs, batching="static", max_num_seqs=batch)
    hf = simulate_hf_static_on(DEVICE, MODEL, [(PROMPT_LEN, o, 0.0) for o in outputs], batch, DTYPE)
    hf_tok_s = (PROMPT_LEN * num_prompts + sum(outputs)) / hf.duration_s
    return CapRow(cap, batch, cont, static, hf_tok_s, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--caps", default=",".join(map(str, STATIC_BATCH)))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    caps = [c.strip() for c in args.caps.split(",")]
    bad = [c for c in caps if not c.isdigit() or int(c) not in STATIC_BATCH]
    problem = (
        f"--caps: {', '.join(bad)} not among the benchmark's caps {list(STATIC_BATCH)}"
        if bad
        else f"--num-prompts: must be >= 1, got {args.num_prompts}"
        if args.num_prompts < 1
        else None
    )
    if problem:  # bad input: one line on stderr, exit 2
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    print(
        f"simulated A100, opt-13b bf16, {args.num_prompts} prompts of {PROMPT_LEN} tokens, outputs exp(mean "
        f"{MEAN_OUTPUT_LEN}) capped; throughput = (prompt + output tokens) / simulated s; published: {PUBLISHED}"
    )
    print(
        "| output cap | static batch | continuous tok/s | static tok/s | hf-static tok/s | continuous / static "
        "| continuous / hf-static | wall s |\n|---|---|---|---|---|---|---|---|"
    )
    for cap in map(int, caps):
        r = run_cap(cap, args.num_prompts, args.seed)
        print(
            f"| {r.cap} | {r.batch} | {r.continuous_tok_s:.0f} | {r.static_tok_s:.0f} | {r.hf_static_tok_s:.0f} "
            f"| {r.continuous_over_static:.1f}x | {r.continuous_over_hf_static:.1f}x | {r.wall_s:.0f} |"
        )


if __name__ == "__main__":
    main()
