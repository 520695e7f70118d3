"""`cbbench bench-profile`: where a step's CPU time goes, refengine's continuous batching beside transformers' CB on
the same ShareGPT run, and each decode step against its GEMM floor (perf/bench/profile.py does the measuring)."""

from __future__ import annotations

from typing import Annotated

import typer

from cbbench.perf.cli.app import CliError, Opt, one_line_errors
from cbbench.perf.knobs import list_metavar


@one_line_errors("bench-profile")
def bench_profile(
    running: Annotated[
        str, Opt(help="comma list of requests in flight (max_num_seqs)", metavar=list_metavar("int"))
    ] = "16,64",
    num_prompts: Annotated[int, Opt(help="ShareGPT prompts")] = 64,
    max_prompt_len: Annotated[int, Opt(help="prompt cap, tokens")] = 512,
    max_output_len: Annotated[int, Opt(help="output cap, tokens")] = 256,
    peers: Annotated[bool, Opt("--peers/--no-peers", help="also profile transformers' continuous batching")] = True,
    ops: Annotated[bool, Opt(help="also the top ops of each run (torch.profiler)")] = False,
    floor_iters: Annotated[int, Opt(help="decode steps timed against the GEMM floor per size (0: none)")] = 20,
    model: Annotated[str, Opt()] = "tiny-qwen2",
    cpu_threads: Annotated[int, Opt(help="torch threads, the same for both engines (0 = torch's default)")] = 1,
) -> None:
    """Mean CPU ms per step by phase (schedule, input prep, embedding, attention, MLP, norms, lm_head, sampling,
    update, outputs) for refengine and transformers' CB at each concurrency, as markdown; then decode step / floor."""
    import torch

    from cbbench.perf.bench.profile import bench_profile as run  # (brings in torch, numpy)

    try:
        sizes = [int(x) for x in running.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"running: expected a comma list of integers, got {running!r}") from None
    if not sizes or min(sizes) < 1 or min(num_prompts, max_prompt_len, max_output_len) < 1 or floor_iters < 0:
        raise CliError("running, num-prompts, max-prompt-len and max-output-len must be >= 1, floor-iters >= 0")
    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    engines = ("refengine", "hf-cb") if peers else ("refengine",)
    typer.echo(
        f"bench-profile: {model}, ShareGPT {num_prompts} prompts (prompt <= {max_prompt_len}, output <= "
        f"{max_output_len}), torch threads {torch.get_num_threads()}, CPU time of the stepping thread\n"
    )
    typer.echo(
        run(
            sizes,
            num_prompts=num_prompts,
            max_prompt_len=max_prompt_len,
            max_output_len=max_output_len,
            engines=engines,
            model=model,
            ops=ops,
            floor_iters=floor_iters,
        )
    )
