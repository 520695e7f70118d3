"""`cbbench perf`: validate the options, build the workload, run every (batching mode x knob set) and the peers,
writing the CSV (one row per run) and the JSON (records, steps, workload, environment) as each run finishes
(`writer.py`), then print the table. `--like BASELINE.csv` takes the plan from a results file (`like.py`).

Validation happens before anything runs: every knob combination is built as a `SchedulerConfig` and checked
against the workload (`plan.py`), and the output folder is proved writable, so a bad value fails at once. The
options and the workload they describe are perf_options.py's.
"""

from __future__ import annotations

import datetime as _dt
import itertools
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from refengine.config import BATCHING_MODES

from cbbench.perf.plan.load import BACKENDS, LoadPoint, parse_load_points, resolve_tokenizer
from cbbench.perf.knobs import knob
from cbbench.perf.plan.options import PEERS, PerfOptions, build_workload, knob_label, parse_knobs, split_list, validate_configs
from cbbench.perf.plan.checks import check_feasible, check_options, check_writable
from cbbench.perf.backends.in_process import RunResult, run_refengine, warmup_lengths


def run_perf(o: PerfOptions, console: Console) -> list[dict[str, Any]]:
    """The whole `cbbench perf` job; returns the CSV rows."""
    import torch

    from cbbench.perf.metrics import parse_goodput, parse_metric_percentiles
    from cbbench.perf.results.schema import STORED_PERCENTILES, environment_info, make_row
    from cbbench.perf.results.writer import ResultWriter, plan_id

    from cbbench.perf.results.like import apply_like

    like_entries = apply_like(o) if o.like is not None else None
    o.repeats = 1 if o.repeats is None else o.repeats
    o.warmup = 8 if o.warmup is None else o.warmup
    on_cpu = o.device == "cpu"
    if o.backend not in BACKENDS:
        raise ValueError(f"backend: unknown {o.backend!r}; expected one of {', '.join(BACKENDS)}")
    if o.resume and o.output is None:
        raise ValueError("resume: name the file to complete with --output")
    in_process = o.backend == "refengine"
    modes = knob("batching").parse_list(o.batching)
    peers = [] if o.peers.strip().lower() == "none" else split_list("peers", o.peers)
    bad = [p for p in peers if p not in PEERS]
    if bad:
        raise ValueError(f"peers: unknown peer {bad[0]!r}; expected a comma list of {', '.join(PEERS)}, or none")
    check_options(device=o.device, cpu_threads=o.cpu_threads, num_prompts=o.num_prompts, repeats=o.repeats,
                  warmup=o.warmup)
    check_writable(o.output.parent if o.output is not None else o.result_dir,
                   "output" if o.output is not None else "result-dir")
    percentiles = parse_metric_percentiles(o.metric_percentiles)
    stored = sorted(set(STORED_PERCENTILES) | set(percentiles))  # a gate can check any stored percentile
    goodput = parse_goodput([g for item in o.goodput for g in item.replace(",", " ").split()])
    loads, load_varying = parse_load_points(o.request_rate, o.burstiness, o.max_concurrency)
    if like_entries is not None:
        knob_sets = [ks for eng, _, ks in like_entries if eng == "refengine"] or [{}]
        modes = sorted({m for eng, m, _ in like_entries if eng == "refengine"}, key=BATCHING_MODES.index)
        validate_configs(modes, knob_sets)
    elif in_process:
        knob_sets = parse_knobs(o.knobs, on_cpu)
        validate_configs(modes, knob_sets)
        if peers and any(p.max_concurrency for p in loads):
            raise ValueError("max_concurrency: the Hugging Face peers do not take it; add --peers none")
    else:  # the server's knobs, modes and peers are its own: one run per load point
        from cbbench.perf.backends.openai import failure_notes, http_target

        target, knob_sets, modes, peers = http_target(o.backend, o.base_url, o.model, o.prompt_format,
                                                       o.knobs, o.ignore_eos, o.request_timeout), [{}], [""], []
    if in_process and o.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {o.device!r}: CUDA is not available here")
    if on_cpu and o.cpu_threads != 0:
        torch.set_num_threads(o.cpu_threads or 1)  # OpenMP spin-waits on an oversubscribed CPU cost 10x
    tokenizer = resolve_tokenizer(o.model, o.tokenizer)
    workloads = {load: build_workload(o, on_cpu, load, tokenizer) for load in loads}
    workload = workloads[loads[0]]
    if in_process:  # the whole sweep, before the first run
        lengths = [(len(r.prompt_token_ids), r.output_len) for r in workload.requests] \
            + warmup_lengths(o.warmup, o.seed)
        for mode, ks in itertools.product(modes, knob_sets):
            check_feasible(lengths, ks, label=f"{mode} {knob_label(ks, set(ks))}".strip())
    from refengine.loader import resolve_dtype

    dtype_name = str(resolve_dtype(o.dtype, o.device)).removeprefix("torch.")
    varying = {k for ks in knob_sets for k in ks if len({str(x.get(k)) for x in knob_sets}) > 1}

    def label_of(r: RunResult, load: LoadPoint) -> str:
        return " ".join(x for x in (knob_label(r.knobs, varying), load.label(load_varying)) if x and x != "-") or "-"

    if like_entries is not None:
        plan: list[tuple[str, str, dict[str, Any]]] = list(like_entries)
    else:
        plan = [(o.backend, m, ks) for ks in knob_sets for m in modes]
        seqs = sorted({ks.get("max_num_seqs", 256) for ks in knob_sets})
        mnbt = knob_sets[0].get("max_num_batched_tokens")
        plan += [(p, "static" if p == "hf-static" else "continuous",
                  {"max_num_seqs": s, **({"max_num_batched_tokens": mnbt} if p == "hf-cb" else {})})
                 for s in seqs for p in peers]
    plan = [(load, *item) for load in loads for item in plan]

    env = environment_info(o.device)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    csv_path = Path(o.output) if o.output is not None else _fresh(Path(o.result_dir), f"{workload.name}-{stamp}")
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(o).items() if k != "like_params"}
    config.update(knob_sets=knob_sets, dtype_resolved=dtype_name, batching_modes=modes, peers=peers)
    writer = ResultWriter(csv_path, config=config, environment=env, workload=workload, resume=o.resume)
    run_options = {"warmup": o.warmup, "cpu_threads": o.cpu_threads}
    entries: list[Any] = []
    notes: list[str] = []
    todo = [(rep, item) for rep in range(o.repeats) for item in plan
            if not writer.done(plan_id(item[1], item[2], item[3], item[0].label(load_varying), rep))]
    if o.resume and writer.num_done:
        console.print(f"resume: {writer.num_done} run(s) already in {csv_path}; {len(todo)} to go", markup=False)
    finished = 0
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, disable=o.quiet, transient=False) as bar:
            task = bar.add_task("perf", total=len(todo) * len(workload))
            for rep, (load, engine, mode, ks) in todo:
                workload = workloads[load]
                bar.update(task, description=f"{engine} {mode} {knob_label(ks, varying)} "
                                             f"{load.label(load_varying)} (repeat {rep})")

                def advance(n: int) -> None:
                    bar.advance(task, n)
                before = bar.tasks[0].completed
                r = _run_one(o, engine, mode, ks, load, workload, advance, tokenizer,
                             target if not in_process else None)
                bar.update(task, completed=before + len(workload))
                key = (r.engine, r.batching, label_of(r, load))
                if r.error:
                    entries.append((key, None, r.error))
                    continue
                m = r.metrics(metric_percentiles=stored, goodput=goodput)
                if in_process:
                    cfg, device = {**r.knobs, "dtype": dtype_name}, o.device
                else:  # device, dtype and knobs are the server's: left empty; where it was reached goes into `extra`
                    cfg, device = {"base_url": target.base_url, "prompt_format": target.prompt_format,
                                   "ignore_eos": target.ignore_eos}, ""
                    notes += failure_notes(key, r.records)
                pid = plan_id(engine, mode, ks, load.label(load_varying), rep)
                row = make_row(metrics=m, engine=r.engine, workload=workload, batching=r.batching, config=cfg,
                               repeat=rep, model=o.model, device=device, git_sha=env["git_sha"], label=o.label,
                               command=o.command, run_options={**run_options, "plan_id": pid})
                writer.add(row, f"{r.engine}/{r.batching}/{label_of(r, load)}/repeat{rep}", r.records, r.steps)
                finished += 1
                entries.append((key, row, None))
    except KeyboardInterrupt:
        writer.flush()  # also creates the pair when nothing had finished yet
        raise KeyboardInterrupt(f"{writer.num_done} run(s) kept in {csv_path}; add --output {csv_path} --resume "
                                f"to finish") from None
    if not writer.rows:
        writer.flush()
    from cbbench.perf.report.table import print_perf_table

    print_perf_table(console, entries, workload, goodput=goodput)
    for line in notes:
        console.print(line, markup=False, highlight=False)
    console.print(f"wrote {csv_path} and {writer.json_path}", markup=False)
    return writer.rows


def _fresh(folder: Path, stem: str) -> Path:
    """folder/stem.csv, or stem-2.csv, ... when two runs start within the same second."""
    path, n = folder / f"{stem}.csv", 1
    while path.exists() or path.with_suffix(".json").exists():
        n += 1
        path = folder / f"{stem}-{n}.csv"
    return path


def _run_one(o: PerfOptions, engine: str, mode: str, ks: dict[str, Any], load: LoadPoint, workload: Any,
             advance: Any, tokenizer: Any, target: Any) -> RunResult:
    common = {"device": o.device, "dtype": o.dtype, "seed": o.seed, "warmup": o.warmup, "progress": advance}
    if engine == "refengine":
        return run_refengine(workload, model=o.model, batching=mode, knobs=ks, max_concurrency=load.max_concurrency,
                             **common)
    if engine in BACKENDS:
        from cbbench.perf.backends.openai import run_http

        return run_http(workload, target, tokenizer=tokenizer, max_concurrency=load.max_concurrency,
                        warmup=o.warmup, seed=o.seed, progress=advance)
    if engine == "hf-static":
        from cbbench.perf.backends.hf import run_hf_static

        return run_hf_static(workload, o.model, max_num_seqs=ks["max_num_seqs"], **common)
    from cbbench.perf.backends.hf import run_hf_cb

    return run_hf_cb(workload, o.model, max_num_seqs=ks["max_num_seqs"],
                     max_num_batched_tokens=ks.get("max_num_batched_tokens"), **common)
