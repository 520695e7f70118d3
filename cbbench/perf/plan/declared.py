"""Every option `cbbench perf` shares with `plan` and `gate`, declared once: its type, its default and its help, in
the group it belongs to (`WORKLOAD`, `LOAD`, `ENGINE`, `DEVICE`, `BACKEND`, `RUN`, `OUTPUT`).

The engine knobs are not here: they are generated from the engine's configs (perf/knobs.py). A command lists the
declarations it takes, in its --help order (cli/main.py's `PERF_OPTIONS`, cli/plan_cmd.py's, cli/gate_cmd.py's);
cli/params.py makes a typer parameter of each and hands the command what it was given as one typed `Values`; the
typed options (plan/options.py) take their defaults from here and are built from those values (`PerfOptions.of`). A
command's own variant of an option (plan's default device, the gate's default batching) is the declaration with what
differs (`Option.but`); a command's own options (plan's SLO, the gate's arms) are a group in its module.

Also here: the defaults that depend on the device (`CPU_DEFAULTS`, ...), which the options' help names. No typer
here: a declaration is plain data, and plan/options.py (below every backend) reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, cast

from cbbench.perf.knobs import list_metavar
from refengine.config import BATCHING_MODES

T = TypeVar("T")

# CPU-sized defaults: the default run (4 modes + 2 peers, tiny-qwen2, 1 torch thread) stays short on a shared
# 2-core CPU. max_num_seqs must stay well below num_prompts, or static batching is one batch and shows no cost.
CPU_DEFAULTS = {"num_prompts": 8, "max_num_seqs": 4, "max_prompt_len": 256, "max_output_len": 64}
# torch threads on a CPU for in-process `perf` and for `serve` alike, so an in-process vs HTTP comparison measures
# the server, not a thread setting; 1 because OpenMP spin-waits cost most on an oversubscribed CPU
DEFAULT_CPU_THREADS = 1
# The CPU default run's repeats: the fewest with which each ratio has a 95 % interval (stats.repeats_for_interval).
# With 8 prompts a repeat of the 6 configurations costs ~40 CPU s here, so the README's main command gives its
# intervals in about 3 minutes on a quiet machine (docs/measurements.md); 16 prompts took ~62 s a repeat. A run the
# user sizes (--num-prompts), a server's and a GPU's keep DEFAULT_REPEATS: one run, its ratios marked as such.
CPU_DEFAULT_REPEATS = 4
DEFAULT_REPEATS = 1
GPU_NUM_PROMPTS = 500
DEFAULT_MODEL = "tiny-qwen2"
# a simulated GPU runs at the scale of vLLM's headline serving benchmark: `vllm bench serve`'s 1000 ShareGPT prompts
# on Llama-3.1-8B, no length caps, the engine's (vLLM's) max_num_seqs and token budget
SIM_MODEL = "llama-3.1-8b"
SIM_NUM_PROMPTS = 1000
PEERS = ("hf-static", "hf-cb")

_KEEP: Any = object()  # `Option.but`: this field as declared


@dataclass(frozen=True)
class Option(Generic[T]):
    """One option as the command line reads it: `kind` is the annotation typer reads (str for a comma list: the
    typed options parse it), `flags` its spelling where not `--name` (a flag without its --no- form, or named
    otherwise), and `with_like` marks an option of how to run or where to write, not of what runs: `perf --like`
    lets it be given. Its name and group are the attribute and the class it is declared on."""

    kind: Any  # (an annotation: int, int | None, list[str] | None, ...)
    default: T
    help: str | None = None
    metavar: str | None = None
    flags: tuple[str, ...] = ()
    with_like: bool = False
    name: str = ""
    group: str = ""

    def __set_name__(self, owner: type[Group], name: str) -> None:
        if self.name:  # (a declaration named again elsewhere, `class X: w = RUN.warmup`, stays what it is)
            return
        object.__setattr__(self, "name", name)  # (frozen: set once, as the class that declares it is made)
        object.__setattr__(self, "group", owner.title)

    @property
    def key(self) -> tuple[str, str]:
        """What names the option in a command's `Values`: its group and name (the gate's own `--repeats` is not
        perf's)."""
        return self.group, self.name

    @property
    def flag(self) -> str:
        """The option as typed on the command line: `--max-prompt-len`."""
        return self.flags[0].split("/")[0] if self.flags else "--" + self.name.replace("_", "-")

    def but(self, *, default: T = _KEEP, help: str | None = _KEEP) -> Option[T]:
        """A command's own variant of this option: the declaration with another default or help. What a variant
        restates as declared is refused, so that each default and help is written once."""
        variant = dataclasses.replace(
            self, default=self.default if default is _KEEP else default, help=self.help if help is _KEEP else help
        )
        restated = [k for k, v in (("default", default), ("help", help)) if v is not _KEEP and v == getattr(self, k)]
        if restated or variant == self:
            raise ValueError(f"{self.flag}: a variant restates the declared {restated[0] if restated else 'option'}")
        return variant


def option(
    kind: type[T],
    default: T,
    help: str | None = None,
    *,
    metavar: str | None = None,
    flags: tuple[str, ...] = (),
    with_like: bool = False,
) -> Option[T]:
    """An option of `kind` with a default."""
    return Option(kind, default, help, metavar, flags, with_like)


def optional(
    kind: type[T], help: str | None = None, *, metavar: str | None = None, with_like: bool = False
) -> Option[T | None]:
    """An option of `kind` that may be left out (None: not given; what it then means, its help says)."""
    return Option(kind | None, None, help, metavar, with_like=with_like)


def repeated(help: str, metavar: str, *, with_like: bool = False) -> Option[list[str] | None]:
    """An option given once per value (`--goodput ttft:500 --goodput tpot:50`)."""
    return Option(list[str] | None, None, help, metavar, with_like=with_like)


class Group:
    """Options that belong together, declared as class attributes (a command lists those it takes in its own
    order); `title` names the group."""

    title: ClassVar[str]

    def __iter__(self) -> Iterator[Option[Any]]:
        return iter([v for v in vars(type(self)).values() if isinstance(v, Option)])


class Values:
    """What a command was given: the value of each option it takes, looked up by its declaration (`values[RUN.warmup]`,
    typed as declared); an option the command does not take reads as its declared default."""

    def __init__(self, given: Mapping[tuple[str, str], object]) -> None:
        self._given = dict(given)

    def __getitem__(self, option: Option[T]) -> T:
        return cast(T, self._given[option.key]) if option.key in self._given else option.default

    def every(self, option: Option[list[str] | None]) -> tuple[str, ...]:
        """The values of an option given once per value (none given: none)."""
        given: list[str] | None = self[option]
        return tuple(given or ())

    def with_value(self, option: Option[T], value: T) -> Values:
        """These values with `option` given as `value`."""
        return Values({**self._given, option.key: value})


class _Workload(Group):
    """The requests (`WorkloadOptions`)."""

    title = "workload"
    workload = option(
        str,
        "sharegpt",
        "sharegpt | fixed | random | lognormal | prefix | custom | hf | trace | multiturn | sharegpt-multiturn "
        "(docs/workloads.md)",
    )
    num_prompts = optional(
        int, f"default: {CPU_DEFAULTS['num_prompts']} on CPU, {GPU_NUM_PROMPTS} on GPU, {SIM_NUM_PROMPTS} on sim:<gpu>"
    )
    dataset_path = optional(
        str,
        "the workload's file, never fetched: sharegpt / sharegpt-multiturn a ShareGPT_V3 JSON (default: the bundled "
        "file), custom a JSONL of prompts, hf a local datasets folder or parquet / arrow / jsonl / csv file, trace an "
        "Azure, Mooncake or plain trace",
    )
    time_scale = optional(float, "--workload trace: arrival-time factor (2 = half speed, 0.5 = double)")
    hf_split = optional(str, "--workload hf: the split of a datasets folder")
    hf_column = optional(
        str, "--workload hf: the prompt column (default: the first of prompt, text, question, instruction, input)"
    )
    hf_output_column = optional(str, "--workload hf: a column holding each request's output length")
    hf_output_len = optional(int, "--workload hf: the output length of every request (default 256)")
    max_prompt_len = optional(int, f"sharegpt prompt cap (CPU default {CPU_DEFAULTS['max_prompt_len']}, GPU none)")
    max_output_len = optional(int, f"sharegpt output cap (CPU default {CPU_DEFAULTS['max_output_len']}, GPU none)")
    tokenizer = optional(
        str,
        "for the workloads: a preset, a local folder or tokenizer.json, or qwen (default: the model's own if a "
        "preset/folder, else the Qwen BPE); a hub id needs its files in a local folder",
    )
    workload_param = repeated("KEY=VALUE for the workload, e.g. input_len=1024", "<key=value>")


class _Load(Group):
    """The load sweep (`LoadAxes`): one run per point of the three comma lists."""

    title = "load"
    request_rate = option(
        str, "inf", "requests/s; inf = all at t0 (offline); comma list: one run each", metavar=list_metavar("float")
    )
    burstiness = option(
        str, "1", "gamma shape of inter-arrival times; 1 = Poisson; comma list", metavar=list_metavar("float")
    )
    max_concurrency = optional(
        str,
        "requests in flight at most, as vllm bench serve's (comma list; default no cap)",
        metavar=list_metavar("int"),
    )


class _Engine(Group):
    """The engine under test (`EngineOptions`); its knobs are the configs' own fields (perf/knobs.py)."""

    title = "engine"
    model = optional(
        str, f"a preset name or a local Hugging Face folder (default: {DEFAULT_MODEL}; {SIM_MODEL} on sim:<gpu>)"
    )
    dtype = optional(str, "default: float32 on CPU, bfloat16 on CUDA and sim:<gpu>")
    batching = option(
        str, ",".join(BATCHING_MODES), f"comma list of {','.join(BATCHING_MODES)}", metavar=list_metavar("str")
    )


class _Device(Group):
    """Where the engine runs (`DeviceSpec`, refengine/sim/sim_device.py)."""

    title = "device"
    device = option(
        str,
        "cpu",
        "in-process device (cpu, cuda[:N], or a simulated GPU sim:h100 / sim:h200 / sim:a100); for --backend openai* "
        "it only picks the workload defaults",
    )


class _Backend(Group):
    """Who serves the requests and how a client talks to a server (`BackendOptions`, `ClientOptions`)."""

    title = "backend"
    backend = option(
        str,
        "refengine",
        "refengine (in-process) | openai (/v1/completions) | openai-chat | openai-embeddings (/v1/embeddings)",
    )
    base_url = optional(str, "the server for --backend openai*, e.g. http://127.0.0.1:8000")
    prompt_format = option(str, "ids", "--backend openai: send prompts as token ids or text")
    request_timeout = option(float, 6 * 3600, "--backend openai*: seconds a request may take (vLLM's 6 h)")
    client_workers = option(
        int, 1, "--backend openai*: client processes the requests are sharded over (one clock; records merged)"
    )
    ignore_eos = option(
        bool,
        True,
        "--backend openai*: send vLLM's ignore_eos (off for servers that refuse unknown fields)",
        flags=("--ignore-eos/--no-ignore-eos",),
    )
    prefix_cache_isolation = option(
        str,
        "auto",
        "--backend openai*: keep each run from the prefixes earlier runs cached: auto (the server's cache_salt "
        "and/or reset, whichever it offers), salt, reset, or off (a warm cache)",
        with_like=True,
    )
    peers = option(str, ",".join(PEERS), f"comma list of {','.join(PEERS)}, or none", metavar=list_metavar("str"))


class _Run(Group):
    """How every run goes and how the command runs them (`RunOptions`, `PerfOptions.like`)."""

    title = "run"
    seed = option(int, 0)
    repeats = optional(
        int,
        f"runs per configuration, interleaved; the table shows the median and each ratio's interval (default "
        f"{CPU_DEFAULT_REPEATS} for the CPU default run, the fewest with a 95% interval; else {DEFAULT_REPEATS})",
        with_like=True,
    )
    warmup = option(int, 8, "short synthetic requests of staggered lengths run first, not measured", with_like=True)
    cpu_threads = optional(
        int,
        f"torch threads on CPU (default {DEFAULT_CPU_THREADS}: stable on shared CPUs; 0 = torch's default)",
        with_like=True,
    )
    like = optional(
        Path,
        "rerun exactly the configurations of this results CSV (a baseline): its workload, engines, modes, knobs and "
        "repeats",
        with_like=True,
    )
    dry_run = option(
        bool, False, "print the plan, one line per run, and stop: nothing runs", flags=("--dry-run",), with_like=True
    )
    executor = optional(
        str,
        "serial | pool[:N] (N local processes, simulated runs only) | ray[:ADDRESS] (a Ray task per run; pip install "
        "'cbbench\\[ray]'); default: pool on sim:<gpu>, else serial",
        metavar="<executor>",
        with_like=True,
    )


class _Output(Group):
    """Where the results go and what is computed and shown (`OutputOptions`)."""

    title = "output"
    metric_percentiles = option(
        str,
        "50,90,99",
        "latency percentiles to compute; p50, p75, p90, p95, p99 and p99.9 always are, others go to the CSV's extra "
        "column",
        metavar=list_metavar("float"),
        with_like=True,
    )
    goodput = repeated("SLOs NAME:MS, e.g. --goodput ttft:500 tpot:50", "<name:ms>", with_like=True)
    result_dir = option(Path, Path("results"), with_like=True)
    quiet = option(bool, False, "no progress bar", with_like=True)
    format = option(
        str, "text", "the table: text | markdown | json (the files are the same)", flags=("--format",), with_like=True
    )
    steady_state = option(
        bool,
        False,
        "add to the table the figures over the window where the requests in flight stayed >= 0.95 x their maximum "
        "(the CSV has them always)",
        flags=("--steady-state",),
        with_like=True,
    )
    output = optional(
        Path,
        "the CSV to write, the JSON beside it (default: RESULT_DIR/WORKLOAD-TIME.csv); each run is written as it "
        "finishes",
        with_like=True,
    )
    label = option(str, "", "a name for these runs (the CSV's label column; compare and plot show it)", with_like=True)
    resume = option(bool, False, "complete --output: skip the runs it already holds", with_like=True)


WORKLOAD = _Workload()
LOAD = _Load()
ENGINE = _Engine()
DEVICE = _Device()
BACKEND = _Backend()
RUN = _Run()
OUTPUT = _Output()
GROUPS: tuple[Group, ...] = (WORKLOAD, LOAD, ENGINE, DEVICE, BACKEND, RUN, OUTPUT)
# what perf, plan and gate each take, in this order, in the middle of their --help: the seed, the dataset's options
# and the load (each command lists the rest around it, with its own variants)
SEED_DATASET_AND_LOAD = (
    RUN.seed,
    WORKLOAD.dataset_path,
    WORKLOAD.time_scale,
    WORKLOAD.hf_split,
    WORKLOAD.hf_column,
    WORKLOAD.hf_output_column,
    WORKLOAD.hf_output_len,
    WORKLOAD.max_prompt_len,
    WORKLOAD.max_output_len,
    LOAD.request_rate,
    LOAD.burstiness,
    LOAD.max_concurrency,
)
