"""What `cbbench perf` is asked to run, typed by concern as GuideLLM groups its own options: `WorkloadOptions` (the
requests), `LoadAxes` (the load sweep), `EngineOptions` (model, dtype, batching modes and the engine-knob grid),
the device (`DeviceSpec`, refengine/sim/sim_device.py), `BackendOptions` (who serves the requests, how a client
talks to a server, and the peers), `RunOptions` (seed, repeats, warm-up, threads, executor) and `OutputOptions`
(files, table, metrics). Each option is declared once, with its default and help, in plan/declared.py; these
objects take their defaults from there, and each is built from what a command was given by its `of` (`PerfOptions.of`
makes them all, for `perf` and `plan` alike). `PerfOptions` holds one of each, and `PerfOptions.record` is the flat
`config` a results JSON records.

These types stand below every backend and import none: a backend name is a string here, checked against the
registry (backends/registry.py: `check_backend`, which the command line runs as it parses and the plan as it is
built), and each backend makes its own typed arguments from the options (backends/backend.py: `BackendArgs`).

Also here: the workload of a load point (its params checked against the workload's own defaults, so an int param
takes no "abc"). grid/build.py turns the options into the run plan.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from cbbench.perf.knobs import EngineKnobs, KnobGrid, knob
from cbbench.perf.metrics import parse_goodput, parse_metric_percentiles
from cbbench.perf.plan.declared import BACKEND, DEVICE, ENGINE, LOAD, OUTPUT, RUN, WORKLOAD, Values
from cbbench.perf.plan.declared import CPU_DEFAULT_REPEATS as CPU_DEFAULT_REPEATS
from cbbench.perf.plan.declared import CPU_DEFAULTS as CPU_DEFAULTS
from cbbench.perf.plan.declared import DEFAULT_CPU_THREADS as DEFAULT_CPU_THREADS
from cbbench.perf.plan.declared import DEFAULT_MODEL as DEFAULT_MODEL
from cbbench.perf.plan.declared import DEFAULT_REPEATS as DEFAULT_REPEATS
from cbbench.perf.plan.declared import GPU_NUM_PROMPTS as GPU_NUM_PROMPTS
from cbbench.perf.plan.declared import PEERS as PEERS
from cbbench.perf.plan.declared import SIM_MODEL as SIM_MODEL
from cbbench.perf.plan.declared import SIM_NUM_PROMPTS as SIM_NUM_PROMPTS
from cbbench.perf.plan.executor import ExecutorChoice, parse_executor
from cbbench.perf.plan.load import LoadPoint, parse_load_lists, resolve_tokenizer, vocab_token_id_range
from cbbench.workloads.local_datasets import TooFewRecords
from refengine.config import BATCHING_MODES
from refengine.sim.sim_device import DeviceSpec
from refengine.sim.sim_memory import sim_dtype

if TYPE_CHECKING:
    from cbbench.workloads.workload import Workload
    from refengine.tokenizer import Tokenizer

# `cbbench --help` imports this module (the commands build their options objects with it), so what loads numpy (the
# workload catalog, the cost model) is imported in the function that first needs it. The defaults that depend on the
# device (CPU_DEFAULTS, ...) are declared with the options (plan/declared.py) and named here as before.

NOT_SIMULATED = ("hf-cb",)  # transformers' continuous batching has no cost-model twin: a simulated plan drops it
DEFAULT_WARMUP = RUN.warmup.default
FORMATS = ("text", "markdown", "json")

T = TypeVar("T")


@dataclass(frozen=True)
class Listed(Generic[T]):
    """A comma-list option: its values, parsed once, and its text as given (what the JSON's config records)."""

    values: tuple[T, ...]
    text: str | None


def split_list(name: str, text: str) -> list[str]:
    vals = [x.strip() for x in str(text).split(",") if x.strip()]
    if not vals:
        raise ValueError(f"{name}: empty list")
    return vals


@dataclass(frozen=True)
class WorkloadOptions:
    """The requests: the workload by name, how many, its file, its caps and its params (`--workload-param`)."""

    name: str = WORKLOAD.workload.default
    num_prompts: int | None = None  # None: CPU_DEFAULTS, GPU_NUM_PROMPTS or SIM_NUM_PROMPTS by device
    dataset_path: str | None = None
    max_prompt_len: int | None = None
    max_output_len: int | None = None
    time_scale: float | None = None  # trace: arrival-time factor
    hf_split: str | None = None  # hf: the split, prompt column, output-length column / length
    hf_column: str | None = None
    hf_output_column: str | None = None
    hf_output_len: int | None = None
    tokenizer: str | None = None  # None: the model's own, else the Qwen BPE (plan/load.py)
    params: tuple[str, ...] = ()  # KEY=VALUE items, as given
    recorded: Mapping[str, object] | None = field(default=None, repr=False)  # --like: the baseline's own params

    def __post_init__(self) -> None:
        from cbbench.workloads.catalog import MAX_NUM_PROMPTS  # (brings in numpy)

        if self.num_prompts is not None and self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.num_prompts is not None and self.num_prompts > MAX_NUM_PROMPTS:  # before a workload grows memory
            raise ValueError(f"num_prompts must be <= {MAX_NUM_PROMPTS} (MAX_NUM_PROMPTS), got {self.num_prompts}")

    @classmethod
    def of(cls, values: Values) -> WorkloadOptions:
        """The workload options a command was given."""
        return cls(
            name=values[WORKLOAD.workload],
            num_prompts=values[WORKLOAD.num_prompts],
            dataset_path=values[WORKLOAD.dataset_path],
            max_prompt_len=values[WORKLOAD.max_prompt_len],
            max_output_len=values[WORKLOAD.max_output_len],
            time_scale=values[WORKLOAD.time_scale],
            hf_split=values[WORKLOAD.hf_split],
            hf_column=values[WORKLOAD.hf_column],
            hf_output_column=values[WORKLOAD.hf_output_column],
            hf_output_len=values[WORKLOAD.hf_output_len],
            tokenizer=values[WORKLOAD.tokenizer],
            params=values.every(WORKLOAD.workload_param),
        )

    def flag_params(self) -> dict[str, object]:
        """{workload param: value} of the options that are a workload param under vLLM's flag name."""
        given = {
            "time_scale": self.time_scale,
            "split": self.hf_split,
            "column": self.hf_column,
            "output_column": self.hf_output_column,
            "output_len": self.hf_output_len,
        }
        return {k: v for k, v in given.items() if v is not None}


_RATES, _BURSTS, _CONCURRENCIES = parse_load_lists(
    LOAD.request_rate.default, LOAD.burstiness.default, LOAD.max_concurrency.default
)


@dataclass(frozen=True)
class LoadAxes:
    """The load sweep: one run per point of the request-rate x burstiness x max-concurrency lists."""

    request_rate: Listed[float] = Listed(tuple(_RATES), LOAD.request_rate.default)
    burstiness: Listed[float] = Listed(tuple(_BURSTS), LOAD.burstiness.default)
    max_concurrency: Listed[int | None] = Listed(tuple(_CONCURRENCIES), LOAD.max_concurrency.default)

    @classmethod
    def parse(cls, request_rate: str, burstiness: str, max_concurrency: str | None) -> LoadAxes:
        """The axes of three comma lists, validated as `arrivals.py` validates a load."""
        rates, bursts, concs = parse_load_lists(request_rate, burstiness, max_concurrency)
        return cls(
            Listed(tuple(rates), request_rate), Listed(tuple(bursts), burstiness), Listed(tuple(concs), max_concurrency)
        )

    @classmethod
    def of(cls, values: Values) -> LoadAxes:
        return cls.parse(values[LOAD.request_rate], values[LOAD.burstiness], values[LOAD.max_concurrency])

    @property
    def points(self) -> list[LoadPoint]:
        axes = (self.request_rate.values, self.burstiness.values, self.max_concurrency.values)
        return [LoadPoint(r, b, c) for r, b, c in itertools.product(*axes)]

    @property
    def varying(self) -> set[str]:
        """The names of the axes with more than one value."""
        sizes = {
            "request_rate": len(self.request_rate.values),
            "burstiness": len(self.burstiness.values),
            "max_concurrency": len(self.max_concurrency.values),
        }
        return {name for name, size in sizes.items() if size > 1}


@dataclass(frozen=True)
class EngineOptions:
    """The engine under test: the model and its dtype, and the sweep's batching modes and engine-knob grid."""

    model: str | None = None  # None: DEFAULT_MODEL, or SIM_MODEL on a simulated GPU
    dtype: str | None = None  # None: the device's default
    batching: Listed[str] = Listed(BATCHING_MODES, ENGINE.batching.default)
    knobs: KnobGrid = KnobGrid()

    @classmethod
    def of(cls, values: Values, knobs: KnobGrid) -> EngineOptions:
        """The engine options a command was given, with the grid of its knob options."""
        batching = cls.parse_batching(values[ENGINE.batching])
        return cls(model=values[ENGINE.model], dtype=values[ENGINE.dtype], batching=batching, knobs=knobs)

    @staticmethod
    def parse_batching(text: str) -> Listed[str]:
        return Listed(tuple(str(m) for m in knob("batching").parse_list(text)), text)

    def configurations(self, on_cpu: bool) -> list[EngineKnobs]:
        """Every knob set of the grid (on a CPU, max_num_seqs defaults to CPU_DEFAULTS' unless swept: named after
        the knobs given, in the runs' labels and the JSON's knob sets)."""
        sets = self.knobs.configurations()
        if on_cpu and self.knobs.axis("max_num_seqs") is None:
            default = {"max_num_seqs": CPU_DEFAULTS["max_num_seqs"]}
            return [EngineKnobs.of({**ks.given(), **default}) for ks in sets]
        return sets


# --prefix-cache-isolation: how each run against a server is kept from the prefixes an earlier run cached
# (backends/cache_isolation.py): whatever the server offers, its cache_salt, its reset, or nothing (a warm cache)
PREFIX_CACHE_ISOLATION_MODES = ("auto", "salt", "reset", "off")


@dataclass(frozen=True)
class ClientOptions:
    """How a client talks to a server backend, as given: its address, the prompts as token ids or text, vLLM's
    ignore_eos field, seconds per request, the client processes the requests are sharded over, and how each run is
    kept from an earlier run's cached prefixes. A server backend's own arguments are made from them
    (backends/openai.py: `HttpArgs`); the JSON's config records them whichever backend runs."""

    base_url: str | None = None
    prompt_format: str = BACKEND.prompt_format.default
    ignore_eos: bool = BACKEND.ignore_eos.default
    request_timeout: float = BACKEND.request_timeout.default
    client_workers: int = BACKEND.client_workers.default
    prefix_cache_isolation: str = BACKEND.prefix_cache_isolation.default

    def __post_init__(self) -> None:
        if self.prefix_cache_isolation not in PREFIX_CACHE_ISOLATION_MODES:
            raise ValueError(
                f"prefix_cache_isolation: expected one of {', '.join(PREFIX_CACHE_ISOLATION_MODES)}, got "
                f"{self.prefix_cache_isolation!r}"
            )

    @classmethod
    def of(cls, values: Values) -> ClientOptions:
        return cls(
            values[BACKEND.base_url],
            values[BACKEND.prompt_format],
            values[BACKEND.ignore_eos],
            values[BACKEND.request_timeout],
            values[BACKEND.client_workers],
            values[BACKEND.prefix_cache_isolation],
        )


@dataclass(frozen=True)
class BackendOptions:
    """Who serves the requests (a registered backend of kind engine or server, by name: backends/backend.py), how
    the client talks to a server, and the peers run beside an in-process engine."""

    name: str = BACKEND.backend.default
    client: ClientOptions = ClientOptions()
    peers: Listed[str] = Listed(PEERS, BACKEND.peers.default)

    @classmethod
    def of(cls, values: Values) -> BackendOptions:
        """The backend options a command was given (the name is the registry's to check: backends/registry.py)."""
        return cls(values[BACKEND.backend], ClientOptions.of(values), cls.parse_peers(values[BACKEND.peers]))

    @staticmethod
    def parse_peers(text: str) -> Listed[str]:
        """`--peers`: a comma list, or none (the names are the registry's to check: backends/registry.py)."""
        return Listed(tuple([] if text.strip().lower() == "none" else split_list("peers", text)), text)

    def simulated_peers(self) -> Listed[str]:
        """The peers of a simulated plan: the default list without hf-cb; naming hf-cb is a ValueError."""
        if self.peers.text == BACKEND.peers.default:
            return Listed(tuple(p for p in PEERS if p not in NOT_SIMULATED), self.peers.text)
        bad = [p for p in self.peers.values if p in NOT_SIMULATED]
        if bad:
            raise ValueError(f"peers: {bad[0]} is not simulated on a sim:<gpu> device; use --peers hf-static or none")
        return self.peers


@dataclass(frozen=True)
class RunOptions:
    """How every run goes: the seed (the workload's draw, the engine, the warm-up), repeats, warm-up requests,
    torch threads on a CPU, and the executor that runs the plan."""

    seed: int = RUN.seed.default
    repeats: int | None = DEFAULT_REPEATS  # None: --like's baseline's, else the device's default (grid/build.py)
    warmup: int | None = RUN.warmup.default
    cpu_threads: int | None = None  # None: DEFAULT_CPU_THREADS; 0: torch's default
    executor: ExecutorChoice | None = None  # None: the plan's default (perf/plan/executor.py)

    def __post_init__(self) -> None:
        if self.cpu_threads is not None and self.cpu_threads < 0:
            raise ValueError(f"cpu_threads must be >= 0 (0 = torch's default), got {self.cpu_threads}")
        if self.repeats is not None and self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")

    @staticmethod
    def parse_executor(text: str | None) -> ExecutorChoice | None:
        return parse_executor(text)

    @classmethod
    def of(cls, values: Values) -> RunOptions:
        return cls(
            seed=values[RUN.seed],
            repeats=values[RUN.repeats],
            warmup=values[RUN.warmup],
            cpu_threads=values[RUN.cpu_threads],
            executor=cls.parse_executor(values[RUN.executor]),
        )


@dataclass(frozen=True)
class OutputOptions:
    """Where the results go and what is computed and shown: the files, the label, the table's format, the
    latency percentiles and the goodput SLOs."""

    result_dir: Path = OUTPUT.result_dir.default
    output: Path | None = None  # the CSV (JSON beside it); default RESULT_DIR/<workload>-<time>.csv
    label: str = OUTPUT.label.default  # a name for this run in the CSV's label column (compare / plot show it)
    resume: bool = OUTPUT.resume.default  # complete `output`: skip the runs it already holds
    format: str = OUTPUT.format.default  # the table: text | markdown | json
    steady_state: bool = OUTPUT.steady_state.default  # the table adds the steady-state figures (perf/steady_state.py)
    quiet: bool = OUTPUT.quiet.default
    metric_percentiles: Listed[float] = Listed(
        tuple(parse_metric_percentiles(OUTPUT.metric_percentiles.default)), OUTPUT.metric_percentiles.default
    )
    goodput_items: tuple[str, ...] = ()  # NAME:MS items, as given
    goodput: Mapping[str, float] = field(default_factory=dict)  # parsed from `goodput_items`
    command: str = ""  # the command line, recorded in every row

    def __post_init__(self) -> None:
        if self.resume and self.output is None:
            raise ValueError("resume: name the file to complete with --output")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")

    @classmethod
    def of(cls, values: Values, command: str) -> OutputOptions:
        """The output options a command was given; `command`: its command line, recorded in every row."""
        goodput = values.every(OUTPUT.goodput)
        return cls(
            result_dir=values[OUTPUT.result_dir],
            output=values[OUTPUT.output],
            label=values[OUTPUT.label],
            resume=values[OUTPUT.resume],
            format=values[OUTPUT.format],
            steady_state=values[OUTPUT.steady_state],
            quiet=values[OUTPUT.quiet],
            metric_percentiles=cls.parse_percentiles(values[OUTPUT.metric_percentiles]),
            goodput_items=goodput,
            goodput=cls.parse_goodput(goodput),
            command=command,
        )

    @staticmethod
    def parse_percentiles(text: str) -> Listed[float]:
        return Listed(tuple(parse_metric_percentiles(text)), text)

    @staticmethod
    def parse_goodput(items: Sequence[str]) -> dict[str, float]:
        return parse_goodput([g for item in items for g in item.replace(",", " ").split()])


@dataclass(frozen=True)
class PerfOptions:
    """Every option of one `cbbench perf` (or `cbbench plan`) invocation, one object per concern."""

    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    load: LoadAxes = field(default_factory=LoadAxes)
    engine: EngineOptions = field(default_factory=EngineOptions)
    device: DeviceSpec = field(default_factory=lambda: DeviceSpec.parse(DEVICE.device.default))
    backend: BackendOptions = field(default_factory=BackendOptions)
    run: RunOptions = field(default_factory=RunOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    like: Path | None = None  # rerun exactly this results CSV's configurations (plan/like.py)

    @classmethod
    def of(cls, values: Values, knobs: KnobGrid, command: str, backend: BackendOptions | None = None) -> PerfOptions:
        """The options of one invocation, from what its command was given (an option it does not take reads as
        declared), each group checking its own values in the order the options are documented to fail; `backend`:
        the backend options already made and checked (`perf` checks its backend against the registry first)."""
        return cls(
            backend=backend if backend is not None else BackendOptions.of(values),
            output=OutputOptions.of(values, command),
            engine=EngineOptions.of(values, knobs),
            device=DeviceSpec.checked(values[DEVICE.device]),
            run=RunOptions.of(values),
            workload=WorkloadOptions.of(values),
            load=LoadAxes.of(values),
            like=values[RUN.like],
        )

    def record(self) -> dict[str, object]:
        """The options as the results JSON's `config` records them: one flat key per command-line option."""
        w, e, b, r, out = self.workload, self.engine, self.backend, self.run, self.output
        client = b.client
        return {
            "workload": w.name,
            "model": e.model,
            "device": self.device.name,
            "dtype": e.dtype,
            "num_prompts": w.num_prompts,
            "seed": r.seed,
            "dataset_path": w.dataset_path,
            "max_prompt_len": w.max_prompt_len,
            "max_output_len": w.max_output_len,
            "time_scale": w.time_scale,
            "hf_split": w.hf_split,
            "hf_column": w.hf_column,
            "hf_output_column": w.hf_output_column,
            "hf_output_len": w.hf_output_len,
            "request_rate": self.load.request_rate.text,
            "burstiness": self.load.burstiness.text,
            "max_concurrency": self.load.max_concurrency.text,
            "backend": b.name,
            "base_url": client.base_url,
            "tokenizer": w.tokenizer,
            "prompt_format": client.prompt_format,
            "ignore_eos": client.ignore_eos,
            "request_timeout": client.request_timeout,
            "client_workers": client.client_workers,
            "prefix_cache_isolation": client.prefix_cache_isolation,
            "batching": e.batching.text,
            "repeats": r.repeats,
            "warmup": r.warmup,
            "peers": b.peers.text,
            "metric_percentiles": out.metric_percentiles.text,
            "goodput": list(out.goodput_items),
            "result_dir": str(out.result_dir),
            "workload_params": list(w.params),
            "cpu_threads": r.cpu_threads,
            "quiet": out.quiet,
            "format": out.format,
            "knobs": e.knobs.record(exclude=("batching",)),
            "output": str(out.output) if out.output is not None else None,
            "label": out.label,
            "resume": out.resume,
            "like": str(self.like) if self.like is not None else None,
            "command": out.command,
            "executor": r.executor.spelled if r.executor is not None else None,
        }


def sim_label(device: DeviceSpec, dtype: str | None) -> str:
    """ "simulated H200 (cost model <version>, bfloat16)", as `engine.device_label` reads."""
    from refengine.sim.cost_model import COST_MODEL_VERSION  # (brings in numpy)

    return f"{device.label} (cost model {COST_MODEL_VERSION}, {sim_dtype(dtype)})"


def _value(text: str) -> object:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _typed_param(key: str, value: object, accepted: Mapping[str, object]) -> object:
    """A workload param must have its default's type (an int param takes no "abc")."""
    default = accepted.get(key)
    if value is None or default is None or isinstance(default, (bool, str, tuple, list)):
        return value
    if isinstance(default, int) and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise ValueError(f"workload-param {key}: expected an integer, got {value!r}")
    if isinstance(default, float) and not isinstance(value, (int, float)):
        raise ValueError(f"workload-param {key}: expected a number, got {value!r}")
    assert isinstance(value, (int, float)), "checked above"  # narrows the type
    return int(value) if isinstance(default, int) else float(value)


# the workload param -> the option that sets it
_PARAM_FLAGS = {
    "time_scale": "time_scale",
    "split": "hf_split",
    "column": "hf_column",
    "output_column": "hf_output_column",
    "output_len": "hf_output_len",
}


def workload_kwargs(w: WorkloadOptions, model: str | None, on_cpu: bool) -> dict[str, object]:
    """get_workload's keyword arguments for `w` (ValueError naming the option for one the workload does not take)."""
    from cbbench.workloads.catalog import list_workloads, workload_options  # (brings in numpy)
    from cbbench.workloads.synthetic import DEFAULT_TOKEN_ID_RANGE  # (brings in numpy)

    if w.name not in list_workloads():
        raise ValueError(f"workload: unknown name {w.name!r}; known: {', '.join(list_workloads())}")
    accepted = workload_options(w.name)
    if w.recorded is not None:  # --like: the baseline's own params, as recorded
        return dict(w.recorded)
    kw: dict[str, object] = {}
    for item in w.params:
        for part in item.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"workload-param: expected KEY=VALUE, got {part!r}")
            kw[key.strip()] = _typed_param(key.strip(), _value(value), accepted)
    caps: dict[str, object] = {
        "max_prompt_len": w.max_prompt_len,
        "max_output_len": w.max_output_len,
        "dataset_path": w.dataset_path,
    }
    for param, given in w.flag_params().items():
        flag = _PARAM_FLAGS[param]
        if flag.startswith("hf_") and w.name != "hf":
            raise ValueError(f"--{flag.replace('_', '-')} does not apply to workload {w.name!r}")
        caps[param] = given
    if "token_id_range" in accepted and "token_id_range" not in kw:  # ids the model's vocabulary holds
        fitted = vocab_token_id_range(model, DEFAULT_TOKEN_ID_RANGE)
        if fitted is not None:
            kw["token_id_range"] = fitted
    for k, v in caps.items():
        if v is not None:
            if k not in accepted:
                raise ValueError(f"--{_PARAM_FLAGS.get(k, k).replace('_', '-')} does not apply to workload {w.name!r}")
            kw[k] = v
        elif on_cpu and k in CPU_DEFAULTS and k in accepted:
            kw.setdefault(k, CPU_DEFAULTS[k])
    return kw


def default_num_prompts(device: DeviceSpec) -> int:
    if device.is_cpu:
        return CPU_DEFAULTS["num_prompts"]
    return SIM_NUM_PROMPTS if device.simulated else GPU_NUM_PROMPTS


def build_workload(o: PerfOptions, load: LoadPoint | None = None, tokenizer: Tokenizer | None = None) -> Workload:
    """The workload of `o` at `load` (default: the first load point)."""
    from cbbench.workloads.catalog import get_workload  # (brings in numpy)

    load = load or o.load.points[0]
    w = o.workload
    if not tokenizer:
        assert o.engine.model is not None, "build_plan fills in the model first"  # narrows the type
        tokenizer = resolve_tokenizer(o.engine.model, w.tokenizer)
    num_prompts = w.num_prompts if w.num_prompts is not None else default_num_prompts(o.device)

    def make(n: int) -> Workload:
        return get_workload(
            w.name,
            tokenizer=tokenizer,
            num_prompts=n,
            seed=o.run.seed,
            request_rate=load.request_rate,
            burstiness=load.burstiness,
            max_concurrency=load.max_concurrency,
            **workload_kwargs(w, o.engine.model, o.device.is_cpu),
        )

    try:
        return make(num_prompts)
    except TooFewRecords as e:  # a small file of the user's just works: all of it, said once (an explicit count
        if w.num_prompts is not None or e.available < 1:  # it cannot meet is still refused)
            raise
        print(
            f"note: {w.dataset_path} holds {e.available} records, fewer than the default {num_prompts}: "
            f"using all {e.available} (--num-prompts sets how many)",
            file=sys.stderr,
        )
        return make(e.available)


def knob_label(knobs: Mapping[str, object], varying: set[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in knobs.items() if k in varying) or "-"
