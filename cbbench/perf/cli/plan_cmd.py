"""`cbbench plan`: the capacity planner's command line (the work is perf/capacity.py's).

It takes `cbbench perf`'s workload options under the same names (declared once, in perf_params.py), the SLO, the
search lists (any engine knob may be a comma list; max_num_seqs, max_num_batched_tokens and tensor_parallel_size
have the planner's defaults) and the executor, and parses them once into the typed `PerfOptions` the planner fills
in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from cbbench.perf.cli import perf_params as options
from cbbench.perf.cli.app import CliError, Opt, command_line, err, explicit_params, one_line_errors
from cbbench.perf.exceptions import NoResultError
from cbbench.perf.knobs import NO_GRID, KnobGrid, engine_knob_options
from cbbench.perf.plan.options import EngineOptions, LoadAxes, OutputOptions, PerfOptions, RunOptions, WorkloadOptions
from cbbench.perf.results.frontier import Slo
from refengine.sim.sim_device import DeviceSpec

_SEARCH_HELP = {
    "max_num_seqs": "most requests in a batch; plan default: 64,128,256,512",
    "max_num_batched_tokens": "token budget per step; plan default: 2048,8192,16384",
    "tensor_parallel_size": "GPUs the model is split over; plan default: 1,2,4,8 (the sizes the device takes)",
}
SloMs = Annotated[Optional[float], Opt(help="the p99 bound in milliseconds a configuration must meet")]
PlanBatching = Annotated[str, Opt(help="comma list of continuous,sequence,static,none", metavar="<str,...>")]
PlanDevice = Annotated[str, Opt(help="a simulated GPU sim:h100 / sim:h200 / sim:a100 (a real device runs serially)")]


@one_line_errors("plan")
@engine_knob_options(sweep=True, exclude=("batching",), help=_SEARCH_HELP)
def plan(
    ctx: typer.Context,
    workload: options.Workload = "sharegpt",
    model: options.Model = None,
    device: PlanDevice = "sim:h200",
    dtype: options.Dtype = None,
    num_prompts: options.NumPrompts = None,
    seed: options.Seed = 0,
    dataset_path: options.DatasetPath = None,
    time_scale: options.TimeScale = None,
    hf_split: options.HfSplit = None,
    hf_column: options.HfColumn = None,
    hf_output_column: options.HfOutputColumn = None,
    hf_output_len: options.HfOutputLen = None,
    max_prompt_len: options.MaxPromptLen = None,
    max_output_len: options.MaxOutputLen = None,
    request_rate: options.RequestRate = "inf",
    burstiness: options.Burstiness = "1",
    max_concurrency: options.MaxConcurrency = None,
    tokenizer: options.Tokenizer = None,
    workload_param: options.WorkloadParam = None,
    warmup: options.Warmup = 8,
    slo_ttft_p99_ms: SloMs = None,
    slo_tpot_p99_ms: SloMs = None,
    batching: PlanBatching = "continuous,sequence,static",
    result_dir: options.ResultDir = Path("results"),
    output: options.Output = None,
    label: options.Label = "",
    resume: options.Resume = False,
    executor: options.Executor = None,
    quiet: options.Quiet = False,
    dry_run: options.DryRun = False,
    knobs: KnobGrid = NO_GRID,
) -> None:
    """Capacity planning: search the knobs for the best config per GPU under a TTFT / TPOT p99 SLO; CSV + JSON."""
    from cbbench.perf.capacity import run_capacity_plan  # (the planner loads the engine: not at --help)

    slo = Slo(slo_ttft_p99_ms, slo_tpot_p99_ms)
    extra = list(ctx.args)  # `--workload-param a=1 b=2`, as perf takes them
    bad = next((x for x in extra if "=" not in x), None)
    if bad is not None:
        raise CliError(f"unexpected argument {bad!r}")
    opts = PerfOptions(
        output=OutputOptions(
            result_dir=result_dir, output=output, label=label, resume=resume, quiet=quiet, command=command_line(ctx)
        ),
        engine=EngineOptions(model=model, dtype=dtype, batching=EngineOptions.parse_batching(batching), knobs=knobs),
        device=DeviceSpec.checked(device),
        run=RunOptions(seed=seed, warmup=warmup, executor=RunOptions.parse_executor(executor)),
        workload=WorkloadOptions(
            name=workload,
            num_prompts=num_prompts,
            dataset_path=dataset_path,
            max_prompt_len=max_prompt_len,
            max_output_len=max_output_len,
            time_scale=time_scale,
            hf_split=hf_split,
            hf_column=hf_column,
            hf_output_column=hf_output_column,
            hf_output_len=hf_output_len,
            tokenizer=tokenizer,
            params=tuple(workload_param or []) + tuple(extra),
        ),
        load=LoadAxes.parse(request_rate, burstiness, max_concurrency),
    )
    try:
        run_capacity_plan(opts, slo, set(explicit_params(ctx)), Console(), dry_run=dry_run)
    except NoResultError as e:  # a run that measured nothing fails the command; the plan of the rest is printed
        err.print(f"cbbench plan: error: {e}", markup=False)
        raise typer.Exit(1) from None
