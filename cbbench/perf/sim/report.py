"""The validation's tables: one line per measured run (measured, simulated and peer figures, errors, feasibility)
and the medians, as Markdown (docs/sim-validation.md is this output) or plain text."""

from __future__ import annotations

import math
from collections.abc import Sequence

from cbbench.perf.sim.measured import GENERATOR_EXTRA_TOKENS, SERVER_DEFAULTS, MeasuredRun, Protocol
from cbbench.perf.sim.relative_errors import METRICS, Medians, RowErrors, groups, medians


def _pct(x: float) -> str:
    return "" if not math.isfinite(x) else f"{100 * x:+.0f}%"


def _abs_pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 1) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _medians_line(name: str, m: Medians) -> str:
    return f"| {name} | {m.rows} | " + " | ".join(_abs_pct(getattr(m, k)) for k in METRICS) + " |"


def median_table(rows: Sequence[RowErrors], peers: Sequence[str]) -> list[str]:
    """Medians over all rows and over the self-consistent ones; then each peer beside cbbench on the rows it
    predicts."""
    consistent = [r for r in rows if r.consistent]
    out = [
        "| rows | count | TTFT median error | TPOT median error | throughput median error |",
        "|---|---|---|---|---|",
        _medians_line("all", medians(rows)),
        _medians_line("self-consistent only", medians(consistent)),
    ]
    for peer in peers:
        theirs = [r for r in rows if peer in r.peers]
        if theirs:
            out.append(_medians_line(f"{peer}'s rows: cbbench", medians(theirs)))
            out.append(_medians_line(f"{peer}'s rows: {peer}", medians(theirs, peer)))
    return out


def group_table(rows: Sequence[RowErrors]) -> list[str]:
    out = ["| model gpu tp dtype | rows | TTFT | TPOT | throughput |", "|---|---|---|---|---|"]
    for key, rs in groups(rows).items():
        out.append(_medians_line(key, medians(rs)))
    return out


def row_table(rows: Sequence[RowErrors], peers: Sequence[str]) -> list[str]:
    head = (
        "| model | gpu | tp | isl / osl | c | TTFT meas / sim (ms) | err | TPOT meas / sim (ms) | err "
        "| out tok/s meas / sim | err | GPU busy at least |"
    )
    sep = "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for p in peers:
        head += f" {p} TTFT / TPOT err |"
        sep += "---|"
    out = [head, sep]
    for r in rows:
        run, sim, e = r.run, r.sim, r.errors
        f = r.feasibility
        need = "" if f is None else f"{100 * f.busy:.0f}%" + ("" if f.consistent else " **x**")
        line = (
            f"| {run.model} | {run.gpu} | {run.tensor_parallel_size} | {run.isl} / {run.osl} | {run.concurrency} "
            f"| {_num(run.ttft_ms, 0)} / {_num(sim.ttft_ms, 0)} | {_pct(e['ttft'])} "
            f"| {_num(run.tpot_ms, 2)} / {_num(sim.tpot_ms, 2)} | {_pct(e['tpot'])} "
            f"| {_num(run.implied_output_throughput, 0)} / {_num(sim.output_throughput, 0)} | {_pct(e['throughput'])} "
            f"| {need} |"
        )
        for p in peers:
            pe = r.peers.get(p)
            line += f" {_pct(pe['ttft'])} / {_pct(pe['tpot'])} |" if pe else " |"
        out.append(line)
    return out


def _protocol_text(protocol: Protocol) -> str:
    a100_tokens, a100_seqs = SERVER_DEFAULTS["a100"]
    if protocol.prompts == "recipe":
        prompts = (
            f"their prompts drawn at random from {protocol.dataset_entries} distinct prompts (bench_run.sh) or from "
            "as many as there are requests (sflow; which campaign ran which: perf/sim/data/SOURCE.md)"
        )
    elif protocol.prompts == "distinct":
        prompts = "every prompt distinct"
    else:
        prompts = f"their prompts drawn at random from {protocol.prompts} distinct prompts"
    server = (
        "under the server flags aiconfigurator's generator writes for a benchmark (c sequences, c + isl + "
        f"{GENERATOR_EXTRA_TOKENS} batched tokens)"
        if protocol.server == "generator"
        else f"under vLLM's server defaults ({protocol.max_num_batched_tokens} batched tokens, "
        f"{protocol.max_num_seqs} sequences)"
    )
    return (
        f"Rows measured with aiperf (aiconfigurator's recipes): {protocol.rounds} x concurrency requests "
        f"({protocol.long_rounds} x for 4096+ output tokens) starting at once into an idle server, {prompts}, "
        f"{server}; rows measured with `vllm bench serve`: their own request count, rate and concurrency, distinct "
        f"prompts, vLLM's server defaults ({protocol.max_num_batched_tokens} batched tokens and "
        f"{protocol.max_num_seqs} sequences; A100: {a100_tokens} and {a100_seqs})."
    )


def render_markdown(
    rows: Sequence[RowErrors],
    protocol: Protocol,
    peers: Sequence[str],
    version: str,
    skipped: Sequence[MeasuredRun] = (),
) -> str:
    bad = [r for r in rows if not r.consistent]
    parts = [
        f"Cost model `{version}`. {_protocol_text(protocol)} Each row's `cbbench perf` command: "
        "`Protocol.perf_argv` (perf/sim/measured.py).",
        "",
        *median_table(rows, peers),
        "",
        f'Self-inconsistent rows (marked **x** below): {len(bad)} of {len(rows)}. "GPU busy at least" is a lower '
        "bound on each GPU's busy time per second that the row's own TTFT, TPOT and concurrency imply: its decoder "
        "GEMMs and prefill attention at the fastest rates the kernel tables measured, and its KV reads at peak HBM "
        "bandwidth (perf/sim/consistency.py); over 100% the run cannot have held what it reports.",
        "",
        "By model, GPU, tensor-parallel size and dtype (median |error|):",
        "",
        *group_table(rows),
        "",
        "Every row (errors signed: simulated - measured, over measured):",
        "",
        *row_table(rows, peers),
        "",
        f"Held but not replayed: {len(skipped)} rows.",
        "",
        *(f"- `{r.id}`: {r.not_replayable}" for r in skipped),
    ]
    return "\n".join(parts) + "\n"


def render_summary(rows: Sequence[RowErrors], peers: Sequence[str]) -> str:
    """The medians only, for the terminal."""
    return "\n".join(line.replace("|", " ").strip() for line in median_table(rows, peers) if "---" not in line)
