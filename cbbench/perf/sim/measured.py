"""The measured serving runs the simulator is validated against (data/measured_runs.csv, sources in data/SOURCE.md),
and the benchmark protocol a replay of one follows.

A row is one measured vLLM serving run: a model on `tensor_parallel_size` GPUs, `concurrency` closed-loop clients
sending fixed-length requests (`isl` tokens in, `osl` out, ignore_eos), and what the client measured: mean TTFT and
TPOT over the requests. How many requests were measured, and what preceded them, the rows do not say; `Protocol`
is the assumption, stated once: aiconfigurator's own benchmark recipes, which both run `aiperf profile --concurrency
c` for 20c measured requests after a warm-up. aiperf runs its phases one after another and waits for the warm-up's
requests to come back before the measured phase starts, so the measured phase opens with all c clients sending at
once into an idle server, and every one of its 20c requests counts. The two recipes differ in the prompts: aiperf
draws each request's prompt at random, with replacement, from `--num-dataset-entries` synthetic prompts, and repeated
prompts meet vLLM's prefix cache (on by default):
- `bench_run`: the generator's bench_run.sh (`--num-requests 20c --warmup-request-count 2c`) leaves the dataset at
  aiperf's default, 100 prompts;
- `sflow`: the generator's sflow recipe (aiconfigurator 2026-03-17 on) sets `--num-dataset-entries 20c`, as many
  prompts as requests (so about 1 - 1/e = 63% of the requests' prompts are distinct).
Which recipe a campaign of rows used its rows do not say either; `SFLOW_CAMPAIGNS` is read off the rows themselves
(data/SOURCE.md, "Which recipe"): one discrete choice per campaign, no constant. The server is the one the same
generator writes for a benchmark (`GENERATOR_EXTRA_TOKENS` below; `Protocol.server`); docs/sim-validation.md shows
the other choices replayed.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from refengine.sim.gpus import GPUS

DATA_DIR = Path(__file__).resolve().parent / "data"
AICONFIGURATOR_SOURCE = "aiconfigurator-core"
# the workloads `cbbench perf` replays as the source ran them (fixed lengths; vLLM's random dataset at range ratio 0
# is fixed lengths of random tokens; ShareGPT as vLLM samples it)
REPLAYED_WORKLOADS = ("fixed", "random", "sharegpt")
MEASURED_RUNS = DATA_DIR / "measured_runs.csv"
# vLLM's OpenAI-server defaults (vllm/engine/arg_utils.py, UsageContext.OPENAI_API_SERVER): on GPUs with at least
# 70 GiB other than the A100 (H100, H200) 8192 batched tokens and 1024 sequences, else (A100) 2048 and 256; chunked
# prefill and prefix caching on
SERVER_MAX_NUM_BATCHED_TOKENS = 8192
SERVER_MAX_NUM_SEQS = 1024
SERVER_DEFAULTS = {"a100": (2048, 256)}
# the server aiconfigurator's generator configures for a benchmark (`Protocol(server="generator")`): its vLLM rule
# since 2025-12-04 (src/aiconfigurator/generator/rule_plugin/vllm.rule, kept as rule_plugin/benchmark/vllm.rule
# when the deployment rule changed on 2026-01-30) sets an aggregated worker's --max-num-seqs to the config's batch
# size, which is the benchmark's concurrency c (the silicon rows' batch_size), and --max-num-batched-tokens to
# c + isl + 1500
GENERATOR_EXTRA_TOKENS = 1500
SERVERS = ("vllm", "generator")
PROMPTS = ("recipe", "distinct")
LONG_OUTPUT = 4096  # tokens out per request from which Protocol.long_rounds applies
# the aiconfigurator campaigns (their silicon_sample.csv source file) measured with the sflow recipe; the others with
# bench_run.sh. Why: data/SOURCE.md, "Which recipe"
SFLOW_CAMPAIGNS = ("source_file=2026-04-06.csv", "/Qwen_Qwen3-32B.csv")


@dataclass(frozen=True)
class MeasuredRun:
    id: str
    source: str
    engine_version: str
    model: str
    gpu: str
    tensor_parallel_size: int
    dtype: str
    workload: str
    isl: int | None
    osl: int | None
    concurrency: int | None
    request_rate: float
    num_prompts: int | None
    stat: str
    ttft_ms: float | None
    tpot_ms: float | None
    output_throughput: float | None
    notes: str

    @property
    def aiperf(self) -> bool:
        """Measured by aiconfigurator's recipe (aiperf; see the module docstring), else by `vllm bench serve`."""
        return self.source.startswith(AICONFIGURATOR_SOURCE)

    @property
    def recipe(self) -> str:
        """An aiperf row's recipe, `bench_run` or `sflow` (see the module docstring); "" for a `vllm bench serve`
        row."""
        if not self.aiperf:
            return ""
        return "sflow" if any(c in self.source for c in SFLOW_CAMPAIGNS) else "bench_run"

    @property
    def not_replayable(self) -> str:
        """Why the validation cannot replay this row ("" when it can)."""

        if self.gpu not in GPUS:
            return f"no kernel tables for the {self.gpu}"
        if self.workload not in REPLAYED_WORKLOADS:
            return f"workload {self.workload!r} is replayed by its own driver (benchmarks/anyscale.py), not here"
        if self.ttft_ms is None and self.tpot_ms is None and self.output_throughput is None:
            return "no metric to compare"
        if self.workload in ("fixed", "random") and (self.isl is None or self.osl is None):
            return "no input / output length"
        if self.aiperf and self.concurrency is None:
            return "an aiperf run without its concurrency"
        if not self.aiperf and self.num_prompts is None:
            return "no request count"
        return ""

    @property
    def replayable(self) -> bool:
        return not self.not_replayable

    @property
    def implied_output_throughput(self) -> float | None:
        """Output tokens/s the run's own figures imply (Little's law: c requests in flight, each lasting TTFT +
        (osl - 1) x TPOT): the measured throughput where the source gives none."""
        if self.output_throughput is not None:
            return self.output_throughput
        if None in (self.concurrency, self.osl, self.ttft_ms, self.tpot_ms):
            return None
        assert self.concurrency and self.osl and self.ttft_ms is not None and self.tpot_ms is not None
        e2e_s = (self.ttft_ms + (self.osl - 1) * self.tpot_ms) / 1e3
        return self.concurrency * self.osl / e2e_s


def _int(cell: str, name: str, row: str) -> int | None:
    if not cell.strip():
        return None
    try:
        value = int(float(cell))
    except ValueError:
        raise ValueError(f"{MEASURED_RUNS.name}: row {row}: {name} {cell!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{MEASURED_RUNS.name}: row {row}: {name} must be positive, got {value}")
    return value


def _float(cell: str, name: str, row: str) -> float | None:
    if not cell.strip():
        return None
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"{MEASURED_RUNS.name}: row {row}: {name} {cell!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{MEASURED_RUNS.name}: row {row}: {name} must be positive, got {value}")
    return value


def load_measured_runs(path: Path | None = None) -> list[MeasuredRun]:
    """Every row of the measured-runs CSV, checked (ValueError naming the row and field)."""
    with (path or MEASURED_RUNS).open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        rid = r["id"]
        out.append(
            MeasuredRun(
                id=rid,
                source=r["source"],
                engine_version=r["engine_version"],
                model=r["model"],
                gpu=r["gpu"],
                tensor_parallel_size=_int(r["tensor_parallel_size"], "tensor_parallel_size", rid) or 1,
                dtype=r["dtype"],
                workload=r["workload"],
                isl=_int(r["isl"], "isl", rid),
                osl=_int(r["osl"], "osl", rid),
                concurrency=_int(r["concurrency"], "concurrency", rid),
                request_rate=math.inf if r["request_rate"] in ("", "inf") else float(r["request_rate"]),
                num_prompts=_int(r["num_prompts"], "num_prompts", rid),
                stat=r["stat"] or "mean",
                ttft_ms=_float(r["ttft_ms"], "ttft_ms", rid),
                tpot_ms=_float(r["tpot_ms"], "tpot_ms", rid),
                output_throughput=_float(r["output_throughput"], "output_throughput", rid),
                notes=r["notes"],
            )
        )
    ids = [r.id for r in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{MEASURED_RUNS.name}: ids repeat: {sorted({i for i in ids if ids.count(i) > 1})[:3]}")
    return out


@dataclass(frozen=True)
class Protocol:
    """How a measured run is replayed (see the module docstring for why these values)."""

    rounds: int = 20  # measured requests = rounds x concurrency (aiconfigurator's bench_run.sh: 20)
    # ... but rounds of requests of LONG_OUTPUT tokens or more are this many: a 1024 x 8192 row at 64 clients is
    # 164k engine steps per 20 rounds, too long to replay in a validation run; its TPOT is a steady-state figure either way
    # (its TTFT weighs the opening burst, 1 round in long_rounds, more)
    long_rounds: int = 2
    # distinct prompts a bench_run row's requests draw from, uniformly with replacement: aiperf's default
    # --num-dataset-entries (100), which bench_run.sh leaves as it is (an sflow row: one per measured request)
    dataset_entries: int = 100
    max_num_batched_tokens: int = SERVER_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = SERVER_MAX_NUM_SEQS
    # the aiperf rows' prompts: "recipe" (the pool their recipe drew from, above), "distinct" (every prompt new) or
    # a number N (every aiperf row draws from N, whatever its recipe)
    prompts: str = "recipe"
    # the aiperf rows' server: "generator" (the flags aiconfigurator's generator writes for a benchmark, above:
    # these runs are its benchmarks) or "vllm" (vLLM's defaults); `vllm bench serve` rows keep vLLM's defaults
    server: str = "generator"

    def __post_init__(self) -> None:
        if self.prompts not in PROMPTS and not (self.prompts.isdigit() and int(self.prompts) >= 1):
            raise ValueError(f"prompts must be {', '.join(PROMPTS)} or a count >= 1, got {self.prompts!r}")
        if self.server not in SERVERS:
            raise ValueError(f"server must be one of {', '.join(SERVERS)}, got {self.server!r}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.long_rounds < 1:
            raise ValueError(f"long_rounds must be >= 1, got {self.long_rounds}")
        if self.dataset_entries < 1:
            raise ValueError(f"dataset_entries must be >= 1, got {self.dataset_entries}")

    def rounds_for(self, run: MeasuredRun) -> int:
        return self.long_rounds if (run.osl or 0) >= LONG_OUTPUT else self.rounds

    def prompt_pool(self, run: MeasuredRun) -> int:
        """How many distinct prompts `run`'s replayed requests draw from at random; 0: every prompt distinct (a
        `vllm bench serve` row)."""
        if not run.recipe or self.prompts == "distinct":
            return 0
        if self.prompts.isdigit():
            return int(self.prompts)
        if run.recipe == "sflow":  # the measured run's requests (20c), however many rounds a long row replays
            assert run.concurrency
            return self.rounds * run.concurrency
        return self.dataset_entries

    def server_limits(self, run: MeasuredRun) -> tuple[int, int]:
        """The replayed server's (max_num_batched_tokens, max_num_seqs)."""
        if self.server == "generator" and run.recipe:
            assert run.concurrency and run.isl
            return run.concurrency + run.isl + GENERATOR_EXTRA_TOKENS, run.concurrency
        return SERVER_DEFAULTS.get(run.gpu, (self.max_num_batched_tokens, self.max_num_seqs))

    def key(self, run: MeasuredRun) -> str:
        """What of the protocol a replay of `run` depends on besides its rounds: a replay is reused only under
        the same key."""
        mnbt, seqs = self.server_limits(run)
        return f"prompts={self.prompt_pool(run)} max_num_batched_tokens={mnbt} max_num_seqs={seqs}"

    def perf_argv(self, run: MeasuredRun) -> list[str]:
        """The `cbbench perf` command line that replays `run` on its simulated GPU(s): the validation runs exactly
        this, so anyone can rerun one row by hand. An aiperf row follows this protocol; a `vllm bench serve` row
        its own figures: its request count, rate and concurrency, every prompt distinct."""
        if run.not_replayable:
            raise ValueError(f"run {run.id}: {run.not_replayable}")
        mnbt, seqs = self.server_limits(run)
        argv = ["perf", "--device", f"sim:{run.gpu}", "--model", run.model, "--dtype", run.dtype]
        argv += ["--tensor-parallel-size", str(run.tensor_parallel_size)]
        if run.workload == "sharegpt":
            argv += ["--workload", "sharegpt"]
        else:
            params = f"input_len={run.isl},output_len={run.osl}"
            argv += ["--workload", "fixed", "--workload-param"]
            pool = self.prompt_pool(run)
            argv.append(params + (f",dataset_entries={pool}" if pool else ""))
        if run.aiperf:
            assert run.concurrency
            rounds = self.rounds_for(run)
            argv += ["--num-prompts", str(rounds * run.concurrency), "--max-concurrency", str(run.concurrency)]
        else:
            argv += ["--num-prompts", str(run.num_prompts), "--request-rate", str(run.request_rate)]
            if run.concurrency:
                argv += ["--max-concurrency", str(run.concurrency)]
        argv += ["--max-num-batched-tokens", str(mnbt), "--max-num-seqs", str(seqs)]
        # one run: in this process (a validation worker already runs one row per process)
        return [*argv, "--batching", "continuous", "--peers", "none", "--executor", "serial"]
