"""`cbbench sim validate`: the simulator against every measured serving run the project holds (perf/sim/).

Each validated row is a `cbbench perf` command line, run in this process or in a worker; `make_sim_app` is handed
what runs one (main.py's `run_command_line`), so that the commands here never import the command line they are part
of.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from cbbench.perf.cli.app import OneLineErrorsTyper, _Group, one_line_errors

if TYPE_CHECKING:
    from cbbench.perf.sim.validate import RunCommand

Opt = typer.Option


def make_sim_app(run_command: RunCommand) -> typer.Typer:
    """The `cbbench sim` commands; `run_command` runs a row's command line (a module's function, so that a worker
    process finds it by name)."""
    sim_app = OneLineErrorsTyper(
        cls=_Group,
        help="Simulated GPUs: validate the simulator against measured vLLM serving runs.",
        no_args_is_help=True,
    )

    @sim_app.command("validate")
    @one_line_errors("sim validate")
    def validate(
        where: Annotated[
            Optional[str], Opt(help="only rows matching every key=value (model, gpu, tp, dtype, isl, osl), comma list")
        ] = None,
        limit: Annotated[
            Optional[int], Opt(min=1, help="at most this many rows (after --where), in file order")
        ] = None,
        rounds: Annotated[int, Opt(min=1, help="measured requests per run = rounds x concurrency")] = 20,
        long_rounds: Annotated[int, Opt(min=1, help="rounds of runs with 4096+ output tokens per request")] = 2,
        workers: Annotated[int, Opt(min=1, help="rows simulated at once, one process each")] = max(
            os.cpu_count() or 1, 1
        ),
        output: Annotated[Path, Opt(help="per-row results CSV, written as rows finish")] = Path(
            "results/sim-validation.csv"
        ),
        resume: Annotated[
            bool, Opt(help="reuse the rows --output already holds (same cost model, rounds and protocol)")
        ] = False,
        markdown: Annotated[Optional[Path], Opt(help="write the full tables (docs/sim-validation.md's) here")] = None,
        prompts: Annotated[
            str,
            Opt(help="aiperf rows' prompts: recipe (drawn from their recipe's pool), distinct (all new), or a count"),
        ] = "recipe",
        server: Annotated[
            str, Opt(help="aiperf rows' server flags: generator (aiconfigurator's, for a benchmark) or vllm (defaults)")
        ] = "generator",
    ) -> None:
        """Replay every measured serving run (perf/sim/data/measured_runs.csv) through `cbbench perf --device
        sim:<gpu>`; print the median errors of TTFT, TPOT and throughput, beside the peer simulators'."""
        from cbbench.perf.sim.run_validation import run_validation  # (brings in numpy)

        run_validation(
            where=where,
            limit=limit,
            rounds=rounds,
            long_rounds=long_rounds,
            workers=workers,
            output=output,
            resume=resume,
            markdown=markdown,
            console=Console(soft_wrap=True),
            run_command=run_command,
            prompts=prompts,
            server=server,
        )

    return sim_app
