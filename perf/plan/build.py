"""`build_plan`: the `PerfOptions` of `cbbench perf` turned, once, into a validated `RunPlan`.

Everything is checked before the first run: the backend and peers by name, the options (`checks.py`), every knob
combination as a `SchedulerConfig`, every request against every configuration (`check_feasible`), and the output
folder is proved writable, so a bad value fails at once with one line. `--like BASELINE.csv` takes the workload
and the configurations from a results file (`results/like.py`).
"""

from __future__ import annotations

import datetime as _dt
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from cbbench.perf.backends.backend import warmup_lengths
from cbbench.perf.backends.registry import Backend
from cbbench.perf.grid.executor import check_executor, parse_executor
from cbbench.perf.knobs import knob
from cbbench.perf.metrics import parse_goodput, parse_metric_percentiles
from cbbench.perf.plan.load import LoadPoint, parse_load_points, resolve_tokenizer
from cbbench.perf.plan.options import (
    DEFAULT_MODEL,
    NOT_SIMULATED,
    PEERS,
    SIM_MODEL,
    PerfOptions,
    build_workload,
    knob_label,
    parse_knobs,
    sim_label,
    sim_peers,
    split_list,
    validate_configs,
)
from cbbench.perf.plan.preflight import check_feasible, check_options, check_output_name, check_writable
from cbbench.perf.plan.spec import RunPlan, RunSettings, RunSpec
from cbbench.perf.results.columns import STORED_PERCENTILES
from refengine.config import BATCHING_MODES
from refengine.sim.cost_model import COST_MODEL_VERSION
from refengine.sim.sim_device import is_sim_device

if TYPE_CHECKING:
    from cbbench.workloads.workload import Workload

Entry = tuple[str, str, dict[str, Any]]  # (backend, batching mode, knobs)


class _Sweep(NamedTuple):
    """What the options ask to run, validated: the runs of one load point and what the JSON's config records."""

    entries: list[Entry]
    knob_sets: list[dict[str, Any]]
    modes: list[str]
    peers: list[str]
    loads: list[LoadPoint]
    load_varying: set[str]
    percentiles: list[float]
    goodput: dict[str, float] | None


def _dtype_name(dtype: str | None, device: str, sim: bool) -> str:
    """The run's dtype by name; planning a CPU or CUDA run does not import torch for it."""
    if sim:
        from refengine.sim.sim_memory import sim_dtype

        return sim_dtype(dtype)
    from refengine.config import dtype_name

    return dtype_name(dtype, device)


def build_plan(o: PerfOptions) -> RunPlan:
    """The plan of `o` (ValueError naming the option for anything that could not run)."""
    from cbbench.perf.results.like import apply_like

    like_entries = apply_like(o) if o.like is not None else None
    sim = is_sim_device(o.device)
    if o.model is None:
        o.model = SIM_MODEL if sim else DEFAULT_MODEL
    if sim:
        o.peers = sim_peers(o.peers)
    o.repeats = 1 if o.repeats is None else o.repeats
    o.warmup = 8 if o.warmup is None else o.warmup
    settings = _settings(o)
    sw = _sweep(o, like_entries)
    backends = {name: Backend.get(name)(settings) for name in dict.fromkeys(e for e, _, _ in sw.entries)}
    in_process = Backend.get(o.backend).kind == "engine"
    if in_process and o.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {o.device!r}: CUDA is not available here")
    settings.tokenizer = resolve_tokenizer(o.model, o.tokenizer)
    workloads = {load: build_workload(o, o.device == "cpu", load, settings.tokenizer) for load in sw.loads}
    workload = workloads[sw.loads[0]]
    if in_process:  # the whole sweep, before the first run
        _check_sweep_feasible(o, sw, workload)
    settings.dtype_name = _dtype_name(o.dtype, o.device, sim)
    varying = frozenset(k for ks in sw.knob_sets for k in ks if len({str(x.get(k)) for x in sw.knob_sets}) > 1)
    specs = [
        RunSpec(name, mode, ks, load, rep, workloads[load], load.label(sw.load_varying), varying, o.repeats)
        for rep in range(o.repeats)
        for load in sw.loads
        for name, mode, ks in sw.entries
    ]
    csv_path = (
        Path(o.output)
        if o.output is not None
        else _fresh(Path(o.result_dir), f"{workload.name}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    )
    plan = RunPlan(
        settings,
        specs,
        backends,
        workload,
        csv_path,
        _plan_config(o, sw, settings.dtype_name, sim),
        percentiles=sw.percentiles,
        goodput=sw.goodput,
        label=o.label,
        command=o.command,
        resume=o.resume,
        quiet=o.quiet,
        format=o.format,
        executor=o.executor,
    )
    check_executor(parse_executor(o.executor), plan)  # pool or Ray for runs it cannot take: refused before any run
    return plan


def _settings(o: PerfOptions) -> RunSettings:
    """What every run of the plan shares (the model, the device, the client's and the engine's settings)."""
    assert o.model is not None and o.warmup is not None, "build_plan fills them in first"  # narrows the types
    return RunSettings(
        o.model,
        o.device,
        o.dtype,
        o.seed,
        o.warmup,
        o.cpu_threads,
        base_url=o.base_url,
        prompt_format=o.prompt_format,
        ignore_eos=o.ignore_eos,
        request_timeout=o.request_timeout,
        client_workers=o.client_workers,
        engine_knobs=dict(o.knobs),
    )


def _check_sweep_feasible(o: PerfOptions, sw: _Sweep, workload: Workload) -> None:
    """Every request (and warm-up request) must fit every mode and knob set of the sweep: ValueError otherwise."""
    assert o.warmup is not None, "build_plan fills it in first"  # narrows the type
    lengths = [(len(r.prompt_token_ids), r.output_len) for r in workload.requests] + warmup_lengths(o.warmup, o.seed)
    for mode, ks in itertools.product(sw.modes, sw.knob_sets):
        check_feasible(lengths, ks, label=f"{mode} {knob_label(ks, set(ks))}".strip())


def _plan_config(o: PerfOptions, sw: _Sweep, dtype_name: str, sim: bool) -> dict[str, Any]:
    """The run's config, as the JSON file records it: the options, the sweep, and on a simulated GPU what it is."""
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(o).items() if k != "like_params"}
    config.update(knob_sets=sw.knob_sets, dtype_resolved=dtype_name, batching_modes=sw.modes, peers=sw.peers)
    if sim:  # what the reports name: the simulated GPU and the cost model's version
        config.update(
            simulated=sim_label(o.device, o.dtype),
            cost_model=COST_MODEL_VERSION,
            not_simulated=[p for p in PEERS if p not in sw.peers and p in NOT_SIMULATED],
        )
    return config


def _sweep(o: PerfOptions, like_entries: list[Entry] | None) -> _Sweep:
    """The options' runs, validated in the order the options are documented to fail."""
    engines = Backend.names("engine", "server")
    if o.backend not in engines:
        raise ValueError(f"backend: unknown {o.backend!r}; expected one of {', '.join(engines)}")
    if o.resume and o.output is None:
        raise ValueError("resume: name the file to complete with --output")
    modes = knob("batching").parse_list(o.batching)
    if o.format not in ("text", "markdown", "json"):
        raise ValueError(f"format must be one of text, markdown, json, got {o.format!r}")
    peers = _peers(o.peers)
    assert o.repeats is not None and o.warmup is not None, "build_plan fills them in first"  # narrows the types
    check_options(
        device=o.device, cpu_threads=o.cpu_threads, num_prompts=o.num_prompts, repeats=o.repeats, warmup=o.warmup
    )
    if o.output is not None:
        check_output_name(Path(o.output))
    check_writable(
        o.output.parent if o.output is not None else o.result_dir, "output" if o.output is not None else "result-dir"
    )
    percentiles = parse_metric_percentiles(o.metric_percentiles)
    stored = sorted(set(STORED_PERCENTILES) | set(percentiles))  # a gate can check any stored percentile
    goodput = parse_goodput([g for item in o.goodput for g in item.replace(",", " ").split()])
    loads, load_varying = parse_load_points(o.request_rate, o.burstiness, o.max_concurrency)
    if like_entries is not None:
        knob_sets = [ks for eng, _, ks in like_entries if eng == "refengine"] or [{}]
        modes = sorted({m for eng, m, _ in like_entries if eng == "refengine"}, key=BATCHING_MODES.index)
        validate_configs(modes, knob_sets)
        entries = list(like_entries)
    elif Backend.get(o.backend).kind == "engine":
        knob_sets = parse_knobs(o.knobs, o.device == "cpu")
        validate_configs(modes, knob_sets)
        if peers and any(p.max_concurrency for p in loads):
            raise ValueError("max_concurrency: the Hugging Face peers do not take it; add --peers none")
        entries = [(o.backend, m, ks) for ks in knob_sets for m in modes] + _peer_entries(peers, knob_sets)
    else:  # the server's knobs, modes and peers are its own: one run per load point
        knob_sets, modes, peers, entries = [{}], [""], [], [(o.backend, "", {})]
    return _Sweep(entries, knob_sets, modes, peers, loads, load_varying, stored, goodput)


def _peers(text: str) -> list[str]:
    peers = [] if text.strip().lower() == "none" else split_list("peers", text)
    known = Backend.names("peer")
    bad = [p for p in peers if p not in known]
    if bad:
        raise ValueError(f"peers: unknown peer {bad[0]!r}; expected a comma list of {', '.join(known)}, or none")
    return peers


def _peer_entries(peers: list[str], knob_sets: list[dict[str, Any]]) -> list[Entry]:
    """The peers' runs: one per distinct max_num_seqs of the sweep (hf-cb also takes the first token budget)."""
    seqs = sorted({ks.get("max_num_seqs", 256) for ks in knob_sets})
    mnbt = knob_sets[0].get("max_num_batched_tokens")
    return [
        (
            p,
            "static" if p == "hf-static" else "continuous",
            {"max_num_seqs": s, **({"max_num_batched_tokens": mnbt} if p == "hf-cb" else {})},
        )
        for s in seqs
        for p in peers
    ]


def _fresh(folder: Path, stem: str) -> Path:
    """folder/stem.csv, or stem-2.csv, ... when two runs start within the same second."""
    path, n = folder / f"{stem}.csv", 1
    while path.exists() or path.with_suffix(".json").exists():
        n += 1
        path = folder / f"{stem}-{n}.csv"
    return path
