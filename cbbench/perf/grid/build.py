"""`build_plan`: the `PerfOptions` of `cbbench perf` turned, once, into a validated `RunPlan`: the specs in the order
they run (plan/spec.py), the backends that run them, and where the results go. `RunPlan.describe` is what `--dry-run`
prints.

Everything is checked before the first run: each option's own value as the command line parses it into the typed
options (plan/options.py), then here every knob combination as a `SchedulerConfig`, every request against every
configuration (`check_feasible`), and the output folder is proved writable, so a bad value fails at once with one
line. `--like BASELINE.csv` takes the workload
and the configurations from a results file (`plan/like.py`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cbbench.perf.backends.backend import warmup_lengths
from cbbench.perf.backends.registry import Backend, check_backend
from cbbench.perf.knobs import EngineKnobs
from cbbench.perf.plan.declared import (
    CPU_DEFAULT_REPEATS,
    DEFAULT_MODEL,
    DEFAULT_REPEATS,
    OUTPUT,
    PEERS,
    RUN,
    SIM_MODEL,
)
from cbbench.perf.plan.executor import ExecutorChoice, check_executor
from cbbench.perf.plan.like import apply_like
from cbbench.perf.plan.load import LoadPoint, resolve_tokenizer
from cbbench.perf.plan.options import NOT_SIMULATED, PerfOptions, build_workload, knob_label, sim_label
from cbbench.perf.plan.preflight import check_feasible, check_output_name, check_writable
from cbbench.perf.plan.spec import Entry, RunSettings, RunSpec, interleaved
from cbbench.perf.results.columns import STORED_PERCENTILES
from cbbench.workloads.workload import Workload
from refengine.config import BATCHING_MODES, SchedulerConfig, dtype_name
from refengine.engine.engine_args import EngineArgs
from refengine.sim.cost_model import COST_MODEL_VERSION
from refengine.sim.sim_memory import sim_dtype


@dataclass
class RunPlan:
    """The runs of one invocation, in order, and where their results go."""

    settings: RunSettings
    specs: list[RunSpec]
    backends: dict[str, Backend]  # name -> the backend that runs its specs
    workload: Workload  # the first load point's: the table's and the JSON's
    csv_path: Path  # the JSON goes beside it
    config: dict[str, object]  # the JSON's `config`: every option, and what the plan resolved
    percentiles: Sequence[float]  # the latency percentiles every row stores
    goodput: Mapping[str, float] | None
    label: str = OUTPUT.label.default
    command: str = ""
    resume: bool = OUTPUT.resume.default
    quiet: bool = OUTPUT.quiet.default
    format: str = OUTPUT.format.default  # the table: text | markdown | json (report/show.py)
    steady_state: bool = OUTPUT.steady_state.default  # the table adds the steady-state figures
    executor: ExecutorChoice | None = None  # --executor (perf/plan/executor.py; None: the plan's default)

    @property
    def server(self) -> str | None:
        """The name of the server backend the plan's runs go to; None when they run in this process."""
        return next((name for name, b in self.backends.items() if b.kind == "server"), None)

    @property
    def run_options(self) -> dict[str, object]:
        """What shaped the runs without defining their configuration (a row's `run_options`)."""
        opts: dict[str, object] = {"warmup": self.settings.warmup, "cpu_threads": self.settings.cpu_threads}
        if self.settings.device.simulated:  # its numbers are this cost model's (the device column names the GPU)
            opts["cost_model"] = COST_MODEL_VERSION
        return opts

    def describe(self) -> str:
        """The plan as `--dry-run` prints it: the workload, then one line per run."""
        lines = [
            f"workload {self.workload.name}: {len(self.workload)} requests; {len(self.specs)} run(s); "
            f"results to {self.csv_path}"
        ]
        lines += [f"  {spec.describe()}" for spec in self.specs]
        return "\n".join(lines)


class _Sweep(NamedTuple):
    """What the options ask to run, validated: the runs of one load point and what the JSON's config records."""

    entries: list[Entry]
    knob_sets: list[EngineKnobs]
    modes: list[str]
    peers: list[str]
    loads: list[LoadPoint]
    load_varying: set[str]
    percentiles: list[float]
    # the in-process engine's arguments of each (batching mode, knob set): made, and so checked, once (none for a
    # server, whose knobs are its own)
    engine_args: dict[tuple[str, EngineKnobs], EngineArgs]


def build_plan(o: PerfOptions) -> RunPlan:
    """The plan of `o` (ValueError naming the option for anything that could not run)."""
    check_backend(o.backend)
    like_entries = None
    if o.like is not None:
        o, like_entries = apply_like(o)
    o = _resolved(o)
    settings = _settings(o)
    sw = _sweep(o, like_entries)
    backends = {
        name: Backend.create(name, settings, o.backend) for name in dict.fromkeys(e.backend for e in sw.entries)
    }
    in_process = Backend.get(o.backend.name).kind == "engine"
    isolation = o.backend.client.prefix_cache_isolation
    if in_process and isolation != "auto":  # (its default asks nothing of an in-process run)
        raise ValueError(
            f"prefix_cache_isolation: {isolation} applies to a server backend (--backend openai or openai-chat); "
            f"--backend {o.backend.name} and its peers build a fresh engine for every run, whose cache starts empty"
        )
    if in_process and o.device.is_cuda:
        import torch  # (only a CUDA plan loads torch: planning a CPU or simulated run does not)

        if not torch.cuda.is_available():
            raise ValueError(f"device {o.device.name!r}: CUDA is not available here")
    settings.tokenizer = resolve_tokenizer(settings.model, o.workload.tokenizer)
    workloads = {load: build_workload(o, load, settings.tokenizer) for load in sw.loads}
    workload = workloads[sw.loads[0]]
    if in_process:  # the whole sweep, before the first run
        _check_sweep_feasible(sw, workload, settings)
    settings.dtype_name = sim_dtype(o.engine.dtype) if o.device.simulated else dtype_name(o.engine.dtype, o.device.name)
    varying = frozenset(
        k for ks in sw.knob_sets for k in ks.given() if len({str(x.given().get(k)) for x in sw.knob_sets}) > 1
    )
    repeats = settings.repeats
    specs = [
        RunSpec(
            e.backend,
            e.batching,
            e.knobs,
            load,
            rep,
            workloads[load],
            load.label(sw.load_varying),
            varying,
            repeats,
            e.unset_in_id,
            sw.engine_args.get((e.batching, e.knobs)) if e.backend == o.backend.name else None,
        )
        for rep, (load, e) in interleaved([(load, e) for load in sw.loads for e in sw.entries], repeats)
    ]
    out = o.output
    csv_path = (
        Path(out.output)
        if out.output is not None
        else _fresh(Path(out.result_dir), f"{workload.name}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    )
    plan = RunPlan(
        settings,
        specs,
        backends,
        workload,
        csv_path,
        _plan_config(o, sw, settings.dtype_name),
        percentiles=sw.percentiles,
        goodput=out.goodput,
        label=out.label,
        command=out.command,
        resume=out.resume,
        quiet=out.quiet,
        format=out.format,
        steady_state=out.steady_state,
        executor=o.run.executor,
    )
    check_executor(o.run.executor, o.device, plan.server)  # pool or Ray for runs it cannot take: refused before any run
    return plan


def _resolved(o: PerfOptions) -> PerfOptions:
    """`o` with the defaults that depend on the device filled in: the model, the simulated peers, the repeats and
    the warm-up (left unset by --like for the baseline's)."""
    sim = o.device.simulated
    engine = dataclasses.replace(o.engine, model=o.engine.model or (SIM_MODEL if sim else DEFAULT_MODEL))
    backend = dataclasses.replace(o.backend, peers=o.backend.simulated_peers()) if sim else o.backend
    run = dataclasses.replace(
        o.run,
        repeats=_default_repeats(o) if o.run.repeats is None else o.run.repeats,
        warmup=RUN.warmup.default if o.run.warmup is None else o.run.warmup,
    )
    return dataclasses.replace(o, engine=engine, backend=backend, run=run)


def _default_repeats(o: PerfOptions) -> int:
    """CPU_DEFAULT_REPEATS for the CPU default run (in-process, its own prompt count: sized so that 4 repeats fit
    about 3 minutes), else DEFAULT_REPEATS."""
    in_process = Backend.get(o.backend.name).kind == "engine"
    if o.device.is_cpu and in_process and o.workload.num_prompts is None:
        return CPU_DEFAULT_REPEATS
    return DEFAULT_REPEATS


def _settings(o: PerfOptions) -> RunSettings:
    """What every run of the plan shares (the model, the device, the client's and the engine's settings)."""
    assert o.engine.model is not None and o.run.warmup is not None and o.run.repeats is not None, (
        "_resolved fills them in"
    )
    return RunSettings(
        o.engine.model,
        o.device,
        o.engine.dtype,
        o.run.seed,
        o.run.warmup,
        o.run.cpu_threads,
        repeats=o.run.repeats,
        base_url=o.backend.client.base_url,
        engine_knobs=o.engine.knobs,
    )


def _check_sweep_feasible(sw: _Sweep, workload: Workload, settings: RunSettings) -> None:
    """Every request (and warm-up request) must fit every mode and knob set of the sweep: ValueError otherwise."""
    lengths = [(len(r.prompt_token_ids), r.output_len) for r in workload.requests]
    lengths += warmup_lengths(settings.warmup, settings.seed)
    for (mode, ks), args in sw.engine_args.items():
        given = ks.given()
        check_feasible(lengths, args, label=f"{mode} {knob_label(given, set(given))}".strip())


def _plan_config(o: PerfOptions, sw: _Sweep, dtype_resolved: str) -> dict[str, object]:
    """The run's config, as the JSON file records it: the options, the sweep, and on a simulated GPU what it is."""
    config = o.record()
    config.update(
        knob_sets=[ks.given() for ks in sw.knob_sets],
        dtype_resolved=dtype_resolved,
        batching_modes=sw.modes,
        peers=sw.peers,
    )
    if o.device.simulated:  # what the reports name: the simulated GPU and the cost model's version
        config.update(
            simulated=sim_label(o.device, o.engine.dtype),
            cost_model=COST_MODEL_VERSION,
            not_simulated=[p for p in PEERS if p not in sw.peers and p in NOT_SIMULATED],
        )
    return config


def _sweep(o: PerfOptions, like_entries: list[Entry] | None) -> _Sweep:
    """The options' runs, validated: the output can be written, every configuration makes valid configs."""
    out = o.output
    if out.output is not None:
        check_output_name(Path(out.output))
    check_writable(
        out.output.parent if out.output is not None else out.result_dir,
        "output" if out.output is not None else "result-dir",
    )
    percentiles = sorted(set(STORED_PERCENTILES) | set(out.metric_percentiles.values))  # a gate checks any stored
    loads, load_varying = o.load.points, o.load.varying
    modes, peers = list(o.engine.batching.values), list(o.backend.peers.values)
    if like_entries is not None:
        knob_sets = [e.knobs for e in like_entries if e.backend == "refengine"] or [EngineKnobs()]
        modes = sorted({e.batching for e in like_entries if e.backend == "refengine"}, key=BATCHING_MODES.index)
        engine_args = _engine_args(o, modes, knob_sets)
        entries = list(like_entries)
    elif Backend.get(o.backend.name).kind == "engine":
        knob_sets = o.engine.configurations(on_cpu=o.device.is_cpu)
        engine_args = _engine_args(o, modes, knob_sets)
        if peers and any(p.max_concurrency for p in loads):
            raise ValueError("max_concurrency: the Hugging Face peers do not take it; add --peers none")
        entries = [Entry(o.backend.name, m, ks) for ks in knob_sets for m in modes] + _peer_entries(peers, knob_sets)
    else:  # the server's knobs, modes and peers are its own: one run per load point
        knob_sets, modes, peers, entries = [EngineKnobs()], [""], [], [Entry(o.backend.name, "", EngineKnobs())]
        engine_args = {}
    return _Sweep(entries, knob_sets, modes, peers, loads, load_varying, percentiles, engine_args)


def _engine_args(
    o: PerfOptions, modes: Sequence[str], knob_sets: Sequence[EngineKnobs]
) -> dict[tuple[str, EngineKnobs], EngineArgs]:
    """Every configuration's engine arguments, before anything runs: a bad knob value fails here with the engine's
    own ValueError (the first configuration in run order that has one), and each run's engine is made of its
    arguments as they are."""
    assert o.engine.model is not None, "_resolved fills it in"
    return {
        (mode, ks): ks.engine_args(
            model=o.engine.model, device=o.device.name, dtype=o.engine.dtype, seed=o.run.seed, batching=mode
        )
        for mode, ks in itertools.product(modes, knob_sets)
    }


def _peer_entries(peers: list[str], knob_sets: list[EngineKnobs]) -> list[Entry]:
    """The peers' runs: one per distinct max_num_seqs of the sweep (hf-cb also takes the first token budget)."""
    seqs = sorted({ks.max_num_seqs or SchedulerConfig.max_num_seqs for ks in knob_sets})
    mnbt = knob_sets[0].max_num_batched_tokens
    entries = []
    for s in seqs:
        for p in peers:
            mode = "static" if p == "hf-static" else "continuous"
            if p == "hf-cb":  # its id names the token budget even when unset, as results files already hold it
                unset = ("max_num_batched_tokens",) if mnbt is None else ()
                entries.append(Entry(p, mode, EngineKnobs(max_num_seqs=s, max_num_batched_tokens=mnbt), unset))
            else:
                entries.append(Entry(p, mode, EngineKnobs(max_num_seqs=s)))
    return entries


def _fresh(folder: Path, stem: str) -> Path:
    """folder/stem.csv, or stem-2.csv, ... when two runs start within the same second."""
    path, n = folder / f"{stem}.csv", 1
    while path.exists() or path.with_suffix(".json").exists():
        n += 1
        path = folder / f"{stem}-{n}.csv"
    return path
