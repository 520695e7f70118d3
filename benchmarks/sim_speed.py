"""How fast the simulation runs: `python -m benchmarks.sim_speed [--num-prompts N] [--model M] [--device sim:G]`.

Replays the ShareGPT workload (token-id prompts, exact output lengths, all arriving at 0) through a fresh simulated
engine per batching mode and prints, per mode: engine steps, wall seconds, steps per wall second, simulated seconds
and the simulated / wall ratio, and the simulated output throughput.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.engine_replay import ReplayRequest
from refengine.config import BATCHING_MODES
from refengine.tokenizer import Tokenizer


def sharegpt_requests(tokenizer: Tokenizer, num_prompts: int, seed: int) -> list[tuple[list[int], int, float]]:
    from cbbench.workloads.catalog import get_workload

    wl = get_workload("sharegpt", tokenizer=tokenizer, num_prompts=num_prompts, seed=seed)
    return [(r.prompt_token_ids, r.output_len, r.arrival_time) for r in wl.requests]


def run_mode(model: str, device: str, batching: str, reqs: Sequence[ReplayRequest]) -> dict[str, Any]:
    from benchmarks.engine_replay import replay
    from refengine import LLMEngine

    engine = LLMEngine(model, device=device, batching=batching, stats_log_size=0)
    start = time.perf_counter()
    metrics = replay(engine, reqs)
    wall = time.perf_counter() - start
    sim_s = max(m["finish_time"] for m in metrics) - min(m["arrival_time"] for m in metrics)
    steps = engine.model_runner.num_steps
    out_tokens = sum(m["output_len"] for m in metrics)
    return {
        "batching": batching,
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "sim_s": sim_s,
        "sim_per_wall": sim_s / wall,
        "sim_output_tok_per_s": out_tokens / sim_s,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="sim:h200")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default=",".join(BATCHING_MODES))
    args = ap.parse_args(argv)
    from refengine.sim.sim_models import sim_model

    reqs = sharegpt_requests(sim_model(args.model)[2], args.num_prompts, args.seed)
    total = time.perf_counter()
    print(f"{'batching':<11}{'steps':>8}{'wall s':>9}{'steps/s':>10}{'sim s':>10}{'sim/wall':>10}{'sim out tok/s':>15}")
    for mode in args.modes.split(","):
        r = run_mode(args.model, args.device, mode, reqs)
        print(
            f"{mode:<11}{r['steps']:>8}{r['wall_s']:>9.2f}{r['steps_per_s']:>10.0f}{r['sim_s']:>10.2f}"
            f"{r['sim_per_wall']:>10.2f}{r['sim_output_tok_per_s']:>15.0f}"
        )
    print(f"total wall {time.perf_counter() - total:.1f} s ({args.num_prompts} prompts, {args.model}, {args.device})")


if __name__ == "__main__":
    main()
