"""`cbbench perf --like BASELINE.csv`: rerun exactly the configurations of a results CSV.

Each row of a results CSV holds its whole configuration: the workload (name and params, so the same seeded sample is
drawn), model, device, dtype, engine, batching mode and every engine knob as the engine resolved it, plus the
repeat index and `run_options` (warm-up, threads). `load_like` turns those rows back into a plan: one entry per
distinct configuration, in the file's order, run as many times as the baseline has repeats of it. The new rows
then have the same `config_key` as the baseline's, so `compare` matches every one of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from cbbench.perf.json_values import JSONObject, JSONValue
from cbbench.perf.knobs import EngineKnobs, KnobValue, knob, knob_names
from cbbench.perf.plan.declared import RUN
from cbbench.perf.plan.options import LoadAxes, PerfOptions
from cbbench.perf.plan.spec import Entry
from cbbench.perf.results.columns import CONFIG_KEY_COLUMNS, KEY_NAMES
from cbbench.perf.results.files import read_csv
from cbbench.perf.results.schema import config_key
from refengine.sim.sim_device import DeviceSpec

_LOAD_PARAMS = ("num_prompts", "seed", "request_rate", "burstiness", "max_concurrency")
IN_PROCESS_ENGINES = ("refengine", "hf-static", "hf-cb")


@dataclass
class LikePlan:
    workload: str
    workload_params: JSONObject  # get_workload's keyword arguments, num_prompts / seed / load included
    model: str
    device: str
    dtype: str | None
    entries: list[tuple[str, str, EngineKnobs]]  # (engine, batching, knobs), in the baseline's order
    repeats: int
    run_options: JSONObject = field(default_factory=dict)
    command: str = ""


def _cell(v: object) -> object:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return None
    return v


def _knob_value(name: str, v: object) -> KnobValue:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return knob(name).parse(str(v)) if not isinstance(v, bool) else v


def _number(v: JSONValue) -> str | int | float:
    """A JSON value int() or float() may read; TypeError for another, as they would raise."""
    if isinstance(v, (str, int, float)):
        return v
    raise TypeError(f"expected a number, got {type(v).__name__}")


def load_like(path: str | Path) -> LikePlan:
    """The plan that reruns `path`'s configurations (ValueError when it cannot be rerun in one invocation)."""
    df = read_csv(path)
    rows = df.astype(object).where(df.notna(), None).to_dict("records")
    engines = {r["engine"] for r in rows}
    if engines - set(IN_PROCESS_ENGINES):
        raise ValueError(
            f"like: {path} holds runs of {sorted(engines - set(IN_PROCESS_ENGINES))} (an HTTP server); "
            "--like reruns in-process engines only"
        )
    groups = {(r["workload"], r["workload_params"], r["model"], r["device"], r["dtype"]) for r in rows}
    if len(groups) != 1:
        raise ValueError(
            f"like: {path} holds {len(groups)} different workloads / models / devices; --like reruns "
            "one (split the file)"
        )
    workload, wparams, model, device, dtype = groups.pop()
    params = json.loads(wparams) if wparams else {}
    for k in ("request_rate", "burstiness"):
        if isinstance(params.get(k), str):
            params[k] = float(params[k])  # "inf" as the CSV's JSON spells it
    sweepable = set(knob_names(exclude=("batching",))) & set(CONFIG_KEY_COLUMNS)
    if DeviceSpec.parse(str(device or "cpu")).simulated:  # no attention kernel runs: its column reads "sim"
        sweepable.discard("attention_backend")
    entries: dict[tuple[str, ...], tuple[str, str, EngineKnobs]] = {}
    repeats = 1
    for r in rows:
        knobs = {k: _knob_value(k, r[k]) for k in CONFIG_KEY_COLUMNS if k in sweepable and _cell(r[k]) is not None}
        # (a gate's file holds each configuration once per arm: rerun once)
        key = tuple("" if name == "arm" else cell for name, cell in zip(KEY_NAMES, config_key(r)))
        entries.setdefault(key, (r["engine"], r["batching"], EngineKnobs.of(knobs)))
        repeats = max(repeats, int(r["repeat"]) + 1)
    first = rows[0]
    opts = json.loads(first["run_options"]) if _cell(first.get("run_options")) else {}
    opts.pop("plan_id", None)
    return LikePlan(
        workload=workload,
        workload_params=params,
        model=model,
        device=device or "cpu",
        dtype=None if _cell(dtype) is None else str(dtype),
        entries=list(entries.values()),
        repeats=repeats,
        run_options=opts,
        command=str(_cell(first.get("command")) or ""),
    )


def apply_like(o: PerfOptions) -> tuple[PerfOptions, list[Entry]]:
    """`o` with what the baseline named by `o.like` fixes (workload, model, device, dtype, load, and the repeats /
    warm-up / threads left unset), and the baseline's plan entries (engine, batching, knobs)."""
    assert o.like is not None, "only a --like run has a baseline"  # narrows the type
    plan = load_like(o.like)
    params = dict(plan.workload_params)
    num_prompts, seed = int(_number(params.pop("num_prompts"))), int(_number(params.pop("seed", 0)))
    mc = params.pop("max_concurrency", None)
    load = LoadAxes.parse(
        str(params.pop("request_rate", "inf")), str(params.pop("burstiness", 1.0)), str(mc) if mc is not None else None
    )
    run = o.run
    run = dataclasses.replace(
        run,
        seed=seed,
        repeats=plan.repeats if run.repeats is None else run.repeats,
        warmup=int(_number(plan.run_options.get("warmup", RUN.warmup.default))) if run.warmup is None else run.warmup,
        cpu_threads=(
            int(_number(plan.run_options["cpu_threads"]))
            if run.cpu_threads is None and plan.run_options.get("cpu_threads") is not None
            else run.cpu_threads
        ),
    )
    workload = dataclasses.replace(o.workload, name=plan.workload, num_prompts=num_prompts, recorded=params)
    engine = dataclasses.replace(o.engine, model=plan.model, dtype=plan.dtype)
    backend = dataclasses.replace(o.backend, name="refengine")
    o = dataclasses.replace(
        o, workload=workload, load=load, engine=engine, device=DeviceSpec.checked(plan.device), backend=backend, run=run
    )
    return o, [Entry(engine_name, batching, knobs) for engine_name, batching, knobs in plan.entries]
