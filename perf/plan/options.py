"""What `cbbench perf` is asked to run: `PerfOptions` (one field per command-line option), the CPU-sized defaults,
and turning the options into the sweep's knob sets and the workload (its params checked against the workload's
own defaults, so an int param takes no "abc"). plan/build.py turns them into the run plan.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbbench.perf.knobs import parse_knobs as _parse_knob_lists
from cbbench.perf.knobs import validate_knobs
from cbbench.perf.plan.load import LoadPoint, parse_load_points, resolve_tokenizer, vocab_token_id_range
from refengine.config import BATCHING_MODES

if TYPE_CHECKING:
    from cbbench.workloads.workload import Workload

PEERS = ("hf-static", "hf-cb")
# CPU-sized defaults: the default run (4 modes + 2 peers, tiny-qwen2, 1 torch thread) takes about two minutes on a
# shared 2-core CPU. max_num_seqs must stay well below num_prompts, or static batching is one batch and shows no cost.
# torch threads on a CPU for in-process `perf` and for `serve` alike, so an in-process vs HTTP comparison measures
# the server, not a thread setting; 1 because OpenMP spin-waits on an oversubscribed CPU cost 10x
DEFAULT_CPU_THREADS = 1
CPU_DEFAULTS = {"num_prompts": 16, "max_num_seqs": 4, "max_prompt_len": 256, "max_output_len": 64}
GPU_NUM_PROMPTS = 500
DEFAULT_MODEL = "tiny-qwen2"
# a simulated GPU runs at the scale the issue's headline result needs: `vllm bench serve`'s 1000 ShareGPT prompts
# on Llama-3.1-8B, no length caps, the engine's (vLLM's) max_num_seqs and token budget
SIM_MODEL = "llama-3.1-8b"
SIM_NUM_PROMPTS = 1000
NOT_SIMULATED = ("hf-cb",)  # transformers' continuous batching has no cost-model twin: a simulated plan drops it


@dataclass
class PerfOptions:
    workload: str = "sharegpt"
    model: str | None = None  # None: DEFAULT_MODEL, or SIM_MODEL on a simulated GPU
    device: str = "cpu"
    dtype: str | None = None
    num_prompts: int | None = None
    seed: int = 0
    dataset_path: str | None = None
    max_prompt_len: int | None = None
    max_output_len: int | None = None
    time_scale: float | None = None  # trace: arrival-time factor
    hf_split: str | None = None  # hf: the split, prompt column, output-length column / length
    hf_column: str | None = None
    hf_output_column: str | None = None
    hf_output_len: int | None = None
    request_rate: float | str = math.inf  # a number or a comma list (a sweep, one run per value)
    burstiness: float | str = 1.0
    max_concurrency: int | str | None = None  # requests in flight at most (comma list; None = no cap)
    backend: str = "refengine"  # refengine (in-process) | openai | openai-chat (`backends.py`)
    base_url: str | None = None
    tokenizer: str | None = None
    prompt_format: str = "ids"  # openai: send token ids or text
    ignore_eos: bool = True  # openai*: send vLLM's ignore_eos field
    request_timeout: float = 6 * 3600  # openai*: seconds per request
    client_workers: int = 1  # openai*: client processes the requests are sharded over
    batching: str = ",".join(BATCHING_MODES)
    repeats: int | None = 1  # None (--like): the baseline's
    warmup: int | None = 8
    peers: str = ",".join(PEERS)
    metric_percentiles: str = "50,90,99"
    goodput: list[str] = field(default_factory=list)
    result_dir: Path = Path("results")
    workload_params: list[str] = field(default_factory=list)
    cpu_threads: int | None = None
    quiet: bool = False
    format: str = "text"  # the table: text | markdown | json
    knobs: dict[str, Any] = field(default_factory=dict)  # name -> comma list (str), bool or None
    output: Path | None = None  # the CSV (JSON beside it); default RESULT_DIR/<workload>-<time>.csv
    label: str = ""  # a name for this run in the CSV's label column (compare / plot show it)
    resume: bool = False  # complete `output`: skip the runs it already holds
    like: Path | None = None  # rerun exactly this results CSV's configurations (`like.py`)
    command: str = ""  # the command line, recorded in every row
    executor: str | None = None  # serial | pool[:N] | ray[:ADDRESS] (perf/grid/executor.py); None: the default
    like_params: dict[str, Any] | None = field(default=None, repr=False)  # set from `like`


def sim_peers(text: str) -> str:
    """The peers of a simulated plan: the default list without hf-cb; naming hf-cb is a ValueError."""
    if text == ",".join(PEERS):
        return ",".join(p for p in PEERS if p not in NOT_SIMULATED) or "none"
    named = [] if text.strip().lower() == "none" else split_list("peers", text)
    bad = [p for p in named if p in NOT_SIMULATED]
    if bad:
        raise ValueError(f"peers: {bad[0]} is not simulated on a sim:<gpu> device; use --peers hf-static or none")
    return text


def sim_label(device: str, dtype: str | None) -> str:
    """ "simulated H200 (cost model <version>, bfloat16)", as `engine.device_label` reads."""
    from refengine.sim.cost_model import COST_MODEL_VERSION
    from refengine.sim.sim_device import parse_sim_device
    from refengine.sim.sim_memory import sim_dtype

    return f"simulated {parse_sim_device(device).name.upper()} (cost model {COST_MODEL_VERSION}, {sim_dtype(dtype)})"


def split_list(name: str, text: str) -> list[str]:
    vals = [x.strip() for x in str(text).split(",") if x.strip()]
    if not vals:
        raise ValueError(f"{name}: empty list")
    return vals


def parse_knobs(raw: dict[str, Any], on_cpu: bool) -> list[dict[str, Any]]:
    """Comma lists -> the cartesian product of knob sets (knobs left None take the engine's defaults)."""
    lists = _parse_knob_lists(raw)
    if on_cpu and "max_num_seqs" not in lists:
        lists["max_num_seqs"] = [CPU_DEFAULTS["max_num_seqs"]]
    names = list(lists)
    return [dict(zip(names, combo)) for combo in itertools.product(*(lists[n] for n in names))] or [{}]


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _typed_param(key: str, value: Any, accepted: dict[str, Any]) -> Any:
    """A workload param must have its default's type (an int param takes no "abc")."""
    default = accepted.get(key)
    if value is None or default is None or isinstance(default, (bool, str, tuple, list)):
        return value
    if isinstance(default, int) and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise ValueError(f"workload-param {key}: expected an integer, got {value!r}")
    if isinstance(default, float) and not isinstance(value, (int, float)):
        raise ValueError(f"workload-param {key}: expected a number, got {value!r}")
    return type(default)(value)


# option -> the workload param it sets
_FLAG_PARAMS = {
    "time_scale": "time_scale",
    "hf_split": "split",
    "hf_column": "column",
    "hf_output_column": "output_column",
    "hf_output_len": "output_len",
}


def workload_kwargs(o: PerfOptions, on_cpu: bool) -> dict[str, Any]:
    from cbbench.workloads.catalog import list_workloads, workload_options

    if o.workload not in list_workloads():
        raise ValueError(f"workload: unknown name {o.workload!r}; known: {', '.join(list_workloads())}")
    accepted = workload_options(o.workload)
    if o.like_params is not None:  # --like: the baseline's own params, as recorded
        return dict(o.like_params)
    kw: dict[str, Any] = {}
    for item in o.workload_params:
        for part in item.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"workload-param: expected KEY=VALUE, got {part!r}")
            kw[key.strip()] = _typed_param(key.strip(), _value(value), accepted)
    caps = {"max_prompt_len": o.max_prompt_len, "max_output_len": o.max_output_len, "dataset_path": o.dataset_path}
    for flag, param in _FLAG_PARAMS.items():  # options that are a workload param under vLLM's flag name
        if getattr(o, flag) is not None:
            if flag.startswith("hf_") and o.workload != "hf":
                raise ValueError(f"--{flag.replace('_', '-')} does not apply to workload {o.workload!r}")
            caps[param] = getattr(o, flag)
    if "token_id_range" in accepted and "token_id_range" not in kw:  # ids the model's vocabulary holds
        from cbbench.workloads.synthetic import DEFAULT_TOKEN_ID_RANGE

        fitted = vocab_token_id_range(o.model, DEFAULT_TOKEN_ID_RANGE)
        if fitted is not None:
            kw["token_id_range"] = fitted
    names = {param: flag for flag, param in _FLAG_PARAMS.items()}
    for k, v in caps.items():
        if v is not None:
            if k not in accepted:
                raise ValueError(f"--{names.get(k, k).replace('_', '-')} does not apply to workload {o.workload!r}")
            kw[k] = v
        elif on_cpu and k in CPU_DEFAULTS and k in accepted:
            kw.setdefault(k, CPU_DEFAULTS[k])
    return kw


def build_workload(o: PerfOptions, on_cpu: bool, load: LoadPoint | None = None, tokenizer: Any = None) -> Workload:
    from cbbench.workloads.catalog import get_workload

    load = load or parse_load_points(o.request_rate, o.burstiness, o.max_concurrency)[0][0]
    from refengine.sim.sim_device import is_sim_device

    num_prompts = (
        o.num_prompts
        if o.num_prompts is not None
        else (
            CPU_DEFAULTS["num_prompts"] if on_cpu else SIM_NUM_PROMPTS if is_sim_device(o.device) else GPU_NUM_PROMPTS
        )
    )
    if not tokenizer:
        assert o.model is not None, "build_plan fills in the model first"  # narrows the type: never a user's error
        tokenizer = resolve_tokenizer(o.model, o.tokenizer)

    def make(n: int) -> Workload:
        return get_workload(
            o.workload,
            tokenizer=tokenizer,
            num_prompts=n,
            seed=o.seed,
            request_rate=load.request_rate,
            burstiness=load.burstiness,
            max_concurrency=load.max_concurrency,
            **workload_kwargs(o, on_cpu),
        )

    from cbbench.workloads.local_datasets import TooFewRecords

    try:
        return make(num_prompts)
    except TooFewRecords as e:  # a small file of the user's just works: all of it, said once (an explicit count
        if o.num_prompts is not None or e.available < 1:  # it cannot meet is still refused)
            raise
        print(
            f"note: {o.dataset_path} holds {e.available} records, fewer than the default {num_prompts}: "
            f"using all {e.available} (--num-prompts sets how many)",
            file=sys.stderr,
        )
        return make(e.available)


def validate_configs(modes: list[str], knob_sets: list[dict[str, Any]]) -> None:
    """Every configuration of the sweep, before anything runs."""
    for mode, ks in itertools.product(modes, knob_sets):
        validate_knobs(ks, batching=mode)


def knob_label(knobs: dict[str, Any], varying: set[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in knobs.items() if k in varying) or "-"
