"""`cbbench plan`: the capacity planner's command line (the work is perf/grid/capacity.py's).

It takes `cbbench perf`'s workload options under the same names (declared once, in perf_params.py), the SLO, the
search lists (any engine knob may be a comma list; max_num_seqs, max_num_batched_tokens and tensor_parallel_size
have the planner's defaults) and the executor, and turns them into the `PerfOptions` the planner fills in.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from cbbench.perf.cli import perf_params as options
from cbbench.perf.cli.app import CliError, Opt, command_line, err, explicit_params, one_line_errors
from cbbench.perf.exceptions import NoResultError
from cbbench.perf.knobs import engine_knob_options
from cbbench.perf.plan.options import PerfOptions

_SEARCH_HELP = {
    "max_num_seqs": "most requests in a batch; plan default: 64,128,256,512",
    "max_num_batched_tokens": "token budget per step; plan default: 2048,8192,16384",
    "tensor_parallel_size": "GPUs the model is split over; plan default: 1,2,4,8 (the sizes the device takes)",
}
SloMs = Annotated[Optional[float], Opt(help="the p99 bound in milliseconds a configuration must meet")]
PlanBatching = Annotated[str, Opt(help="comma list of continuous,sequence,static,none", metavar="<str,...>")]
PlanDevice = Annotated[str, Opt(help="a simulated GPU sim:h100 / sim:h200 / sim:a100 (a real device runs serially)")]
_FIELDS = {f.name for f in dataclasses.fields(PerfOptions)}


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
    knobs: Optional[dict[str, Any]] = None,
) -> None:
    """Capacity planning: search the knobs for the best config per GPU under a TTFT / TPOT p99 SLO; CSV + JSON."""
    from cbbench.perf.grid.capacity import run_capacity_plan
    from cbbench.perf.grid.frontier import Slo

    params = dict(locals())
    slo = Slo(slo_ttft_p99_ms, slo_tpot_p99_ms)
    extra = list(ctx.args)  # `--workload-param a=1 b=2`, as perf takes them
    bad = next((x for x in extra if "=" not in x), None)
    if bad is not None:
        raise CliError(f"unexpected argument {bad!r}")
    opts = PerfOptions(
        **{k: v for k, v in params.items() if k in _FIELDS and k not in ("knobs", "dry_run")},
        workload_params=list(workload_param or []) + extra,
        knobs=dict(knobs or {}),
        command=command_line(ctx),
    )
    try:
        run_capacity_plan(opts, slo, set(explicit_params(ctx)), Console(), dry_run=dry_run)
    except NoResultError as e:  # a run that measured nothing fails the command; the plan of the rest is printed
        err.print(f"cbbench plan: error: {e}", markup=False)
        raise typer.Exit(1) from None
