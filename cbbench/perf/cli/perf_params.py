"""The options of `cbbench perf`, one type alias each, so that the command's signature reads one line per option.

Typer reads each option, its help and its type from the annotation. The engine knobs are added to it by
knobs.engine_knob_options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from cbbench.perf.cli.app import Opt
from cbbench.perf.knobs import list_metavar
from cbbench.perf.plan.options import CPU_DEFAULTS

Workload = Annotated[
    str,
    Opt(
        help="sharegpt | fixed | random | lognormal | prefix | custom | hf | trace | "
        "multiturn | sharegpt-multiturn (docs/workloads.md)"
    ),
]
Model = Annotated[
    Optional[str],
    Opt(help="a preset name or a local Hugging Face folder (default: tiny-qwen2; llama-3.1-8b on sim:<gpu>)"),
]
Device = Annotated[
    str,
    Opt(
        help="in-process device (cpu, cuda[:N], or a simulated GPU sim:h100 / sim:h200 / "
        "sim:a100); for --backend openai* it only picks the workload defaults"
    ),
]
Dtype = Annotated[Optional[str], Opt(help="default: float32 on CPU, bfloat16 on CUDA and sim:<gpu>")]
NumPrompts = Annotated[
    Optional[int], Opt(help=f"default: {CPU_DEFAULTS['num_prompts']} on CPU, 500 on GPU, 1000 on sim:<gpu>")
]
Seed = Annotated[int, Opt()]
DatasetPath = Annotated[
    Optional[str],
    Opt(
        help="the workload's file, never fetched: sharegpt / "
        "sharegpt-multiturn a ShareGPT_V3 JSON (default: the bundled "
        "file), custom a JSONL of prompts, hf a local datasets folder "
        "or parquet / arrow / jsonl / csv file, trace an Azure, "
        "Mooncake or plain trace"
    ),
]
TimeScale = Annotated[Optional[float], Opt(help="--workload trace: arrival-time factor (2 = half speed, 0.5 = double)")]
HfSplit = Annotated[Optional[str], Opt(help="--workload hf: the split of a datasets folder")]
HfColumn = Annotated[
    Optional[str],
    Opt(help="--workload hf: the prompt column (default: the first of prompt, text, question, instruction, input)"),
]
HfOutputColumn = Annotated[Optional[str], Opt(help="--workload hf: a column holding each request's output length")]
HfOutputLen = Annotated[Optional[int], Opt(help="--workload hf: the output length of every request (default 256)")]
MaxPromptLen = Annotated[
    Optional[int], Opt(help=f"sharegpt prompt cap (CPU default {CPU_DEFAULTS['max_prompt_len']}, GPU none)")
]
MaxOutputLen = Annotated[
    Optional[int], Opt(help=f"sharegpt output cap (CPU default {CPU_DEFAULTS['max_output_len']}, GPU none)")
]
RequestRate = Annotated[
    str, Opt(help="requests/s; inf = all at t0 (offline); comma list: one run each", metavar=list_metavar("float"))
]
Burstiness = Annotated[
    str, Opt(help="gamma shape of inter-arrival times; 1 = Poisson; comma list", metavar=list_metavar("float"))
]
MaxConcurrency = Annotated[
    Optional[str],
    Opt(
        help="requests in flight at most, as vllm bench serve's (comma list; default no cap)",
        metavar=list_metavar("int"),
    ),
]
Backend = Annotated[
    str,
    Opt(help="refengine (in-process) | openai (/v1/completions) | openai-chat | openai-embeddings (/v1/embeddings)"),
]
BaseUrl = Annotated[Optional[str], Opt(help="the server for --backend openai*, e.g. http://127.0.0.1:8000")]
Tokenizer = Annotated[
    Optional[str],
    Opt(
        help="for the workloads: a preset, a local folder or tokenizer.json, "
        "or qwen (default: the model's own if a preset/folder, else the "
        "Qwen BPE); a hub id needs its files in a local folder"
    ),
]
PromptFormat = Annotated[str, Opt(help="--backend openai: send prompts as token ids or text")]
RequestTimeout = Annotated[float, Opt(help="--backend openai*: seconds a request may take (vLLM's 6 h)")]
ClientWorkers = Annotated[
    int, Opt(help="--backend openai*: client processes the requests are sharded over (one clock; records merged)")
]
IgnoreEos = Annotated[
    bool,
    Opt(
        "--ignore-eos/--no-ignore-eos",
        help="--backend openai*: send vLLM's ignore_eos (off for servers that refuse unknown fields)",
    ),
]
PrefixCacheIsolation = Annotated[
    str,
    Opt(
        help="--backend openai*: keep each run from the prefixes earlier runs cached: auto (the server's cache_salt "
        "and/or reset, whichever it offers), salt, reset, or off (a warm cache)"
    ),
]
Batching = Annotated[str, Opt(help="comma list of continuous,sequence,static,none", metavar=list_metavar("str"))]
Repeats = Annotated[
    Optional[int],
    Opt(
        help="runs per configuration, interleaved; the table shows the median and each ratio's interval (default 4 "
        "for the CPU default run, the fewest with a 95% interval; else 1)"
    ),
]
Warmup = Annotated[int, Opt(help="short synthetic requests of staggered lengths run first, not measured")]
Peers = Annotated[str, Opt(help="comma list of hf-static,hf-cb, or none", metavar=list_metavar("str"))]
MetricPercentiles = Annotated[
    str,
    Opt(
        help="latency percentiles to compute; p50, p75, p90, p95, p99 and "
        "p99.9 always are, others go to the CSV's extra column",
        metavar=list_metavar("float"),
    ),
]
Goodput = Annotated[Optional[list[str]], Opt(help="SLOs NAME:MS, e.g. --goodput ttft:500 tpot:50", metavar="<name:ms>")]
ResultDir = Annotated[Path, Opt()]
WorkloadParam = Annotated[
    Optional[list[str]], Opt(help="KEY=VALUE for the workload, e.g. input_len=1024", metavar="<key=value>")
]
CpuThreads = Annotated[
    Optional[int], Opt(help="torch threads on CPU (default 1: stable on shared CPUs; 0 = torch's default)")
]
Quiet = Annotated[bool, Opt(help="no progress bar")]
Format = Annotated[str, Opt("--format", help="the table: text | markdown | json (the files are the same)")]
SteadyState = Annotated[
    bool,
    Opt(
        "--steady-state",
        help="add to the table the figures over the window where the requests in flight stayed >= 0.95 x their "
        "maximum (the CSV has them always)",
    ),
]
Output = Annotated[
    Optional[Path],
    Opt(
        help="the CSV to write, the JSON beside it (default: RESULT_DIR/"
        "WORKLOAD-TIME.csv); each run is written as it finishes"
    ),
]
Label = Annotated[str, Opt(help="a name for these runs (the CSV's label column; compare and plot show it)")]
Resume = Annotated[bool, Opt(help="complete --output: skip the runs it already holds")]
Like = Annotated[
    Optional[Path],
    Opt(
        help="rerun exactly the configurations of this results CSV (a "
        "baseline): its workload, engines, modes, knobs and repeats"
    ),
]
DryRun = Annotated[bool, Opt("--dry-run", help="print the plan, one line per run, and stop: nothing runs")]
Executor = Annotated[
    Optional[str],
    Opt(
        help="serial | pool[:N] (N local processes, simulated runs only) | ray[:ADDRESS] (a Ray task per run; "
        "pip install 'cbbench\\[ray]'); default: pool on sim:<gpu>, else serial",
        metavar="<executor>",
    ),
]
