"""`cbbench plan`: the capacity planner's command line (the work is perf/capacity.py's).

It takes `cbbench perf`'s workload options under the same names (declared once, in plan/declared.py), the SLO, the
search lists (any engine knob may be a comma list; max_num_seqs, max_num_batched_tokens and tensor_parallel_size
have the planner's defaults) and the executor, and parses them once into the typed `PerfOptions` the planner fills
in (`PerfOptions.of`, as perf does).
"""

from __future__ import annotations

import typer
from rich.console import Console

from cbbench.perf.cli.app import CliError, command_line, err, explicit_params, one_line_errors
from cbbench.perf.cli.params import takes
from cbbench.perf.exceptions import NoResultError
from cbbench.perf.knobs import NO_GRID, KnobGrid, engine_knob_options
from cbbench.perf.plan.declared import (
    DEVICE,
    ENGINE,
    OUTPUT,
    RUN,
    SEED_DATASET_AND_LOAD,
    WORKLOAD,
    Group,
    Values,
    optional,
)
from cbbench.perf.plan.options import PerfOptions
from cbbench.perf.results.frontier import Slo

_SEARCH_HELP = {
    "max_num_seqs": "most requests in a batch; plan default: 64,128,256,512",
    "max_num_batched_tokens": "token budget per step; plan default: 2048,8192,16384",
    "tensor_parallel_size": "GPUs the model is split over; plan default: 1,2,4,8 (the sizes the device takes)",
}
_SLO_HELP = "the p99 bound in milliseconds a configuration must meet"


class _Slo(Group):
    """The SLO a configuration must meet: plan's own options (perf/results/frontier.py's `Slo`)."""

    title = "slo"
    slo_ttft_p99_ms = optional(float, _SLO_HELP)
    slo_tpot_p99_ms = optional(float, _SLO_HELP)


SLO = _Slo()
# plan's options, in --help order: perf's (the device and the batching modes with plan's own defaults) and the SLO
PLAN_OPTIONS = (
    WORKLOAD.workload,
    ENGINE.model,
    DEVICE.device.but(
        default="sim:h200", help="a simulated GPU sim:h100 / sim:h200 / sim:a100 (a real device runs serially)"
    ),
    ENGINE.dtype,
    WORKLOAD.num_prompts,
    *SEED_DATASET_AND_LOAD,
    WORKLOAD.tokenizer,
    WORKLOAD.workload_param,
    RUN.warmup,
    SLO.slo_ttft_p99_ms,
    SLO.slo_tpot_p99_ms,
    ENGINE.batching.but(default="continuous,sequence,static"),
    OUTPUT.result_dir,
    OUTPUT.output,
    OUTPUT.label,
    OUTPUT.resume,
    RUN.executor,
    OUTPUT.quiet,
    RUN.dry_run,
)


@one_line_errors("plan")
@engine_knob_options(sweep=True, exclude=("batching",), help=_SEARCH_HELP)
@takes(PLAN_OPTIONS)
def plan(ctx: typer.Context, *, values: Values, knobs: KnobGrid = NO_GRID) -> None:
    """Capacity planning: search the knobs for the best config per GPU under a TTFT / TPOT p99 SLO; CSV + JSON."""
    from cbbench.perf.capacity import run_capacity_plan  # (the planner loads the engine: not at --help)

    slo = Slo(values[SLO.slo_ttft_p99_ms], values[SLO.slo_tpot_p99_ms])
    extra = list(ctx.args)  # `--workload-param a=1 b=2`, as perf takes them
    bad = next((x for x in extra if "=" not in x), None)
    if bad is not None:
        raise CliError(f"unexpected argument {bad!r}")
    values = values.with_value(WORKLOAD.workload_param, [*values.every(WORKLOAD.workload_param), *extra])
    opts = PerfOptions.of(values, knobs, command_line(ctx))
    try:
        run_capacity_plan(opts, slo, set(explicit_params(ctx)), Console(), dry_run=values[RUN.dry_run])
    except NoResultError as e:  # a run that measured nothing fails the command; the plan of the rest is printed
        err.print(f"cbbench plan: error: {e}", markup=False)
        raise typer.Exit(1) from None
