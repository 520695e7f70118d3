"""The server's overhead over in-process generation: output throughput of `cbbench perf --backend openai` against
`cbbench serve` divided by that of the in-process engine, same workload, same knobs, same concurrency, in one run.

    python -m benchmarks.http_overhead [--concurrency 16] [--num-prompts 64] [--input-len 64] [--output-len 64]
                                         [--repeats 3] [--model tiny-qwen2] [--device cpu] [--profile OUT.prof]

One `cbbench serve` subprocess (max_num_seqs = the concurrency, one torch thread on the CPU) serves every HTTP run;
the in-process runs build a fresh engine with the same knobs in this process. Runs alternate (in-process, HTTP,
in-process, ...) so that a slow patch of a shared machine hits both; the ratio is of the medians.

On a shared CPU the wall-clock ratio swings with the neighbours' load, so the CPU cost is reported too: CPU seconds
per 1000 output tokens, of this process for an in-process run (less the engine's construction, measured once) and
of the server process plus this client for an HTTP run (from /proc and `time.process_time`). `--profile` writes a
cProfile of the client's HTTP runs (where the client's share of the overhead goes).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

from cbbench.perf.knobs import EngineKnobs

STARTUP_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(model: str, device: str, knobs: dict[str, Any], threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-c",
        "from cbbench.perf.cli import app; app()",
        "serve",
        "--model",
        model,
        "--device",
        device,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if device == "cpu":
        cmd += ["--cpu-threads", str(threads)]
    for k, v in knobs.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cbbench serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("cbbench serve did not start")


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="tiny-qwen2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each side on the CPU")
    ap.add_argument("--profile", default=None, help="write a cProfile of the client's HTTP runs here")
    return ap.parse_args(argv)


def _warm_up(a: argparse.Namespace, short: Any, knobs: dict[str, Any]) -> float:
    """Not measured: a first short run (first-use costs of this process: imports, allocator, kernels selection;
    the first in-process run here took 2x the CPU of the next), and the engine's construction, which every
    run_refengine repeats: returns its CPU seconds (timed on a second construction, the first pays for first use)."""
    from cbbench.perf.backends.in_process import run_refengine
    from refengine import LLMEngine

    ks = EngineKnobs.of(knobs)
    run_refengine(
        short,
        engine_args=ks.engine_args(model=a.model, device=a.device, dtype=None, seed=0, batching="continuous"),
        knobs=ks,
    )
    LLMEngine(a.model, device=a.device, seed=0, **knobs)
    c0 = time.process_time()
    LLMEngine(a.model, device=a.device, seed=0, **knobs)
    return time.process_time() - c0


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)

    import torch

    from cbbench.perf.backends.http_client import HttpTarget
    from cbbench.perf.backends.http_run import run_http
    from cbbench.workloads.catalog import get_workload
    from refengine.models.presets import load_tokenizer

    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    knobs = {"max_num_seqs": a.concurrency}
    wl = get_workload(
        "fixed",
        tokenizer=load_tokenizer(a.model),
        num_prompts=a.num_prompts,
        seed=0,
        max_concurrency=a.concurrency,
        input_len=a.input_len,
        output_len=a.output_len,
    )
    proc, url = start_server(a.model, a.device, knobs, a.threads)
    prof = None
    if a.profile:
        import cProfile

        prof = cProfile.Profile()
    short = get_workload("fixed", num_prompts=a.concurrency, seed=1, input_len=a.input_len, output_len=4)
    build_cpu = _warm_up(a, short, knobs)
    res: dict[str, list[dict[str, float]]] = {"in-process": [], "http": []}
    try:
        run_http(short, HttpTarget("openai", url, a.model))
        for rep in range(a.repeats):
            res["in-process"].append(_in_process_run(a, wl, knobs, build_cpu))
            m = _http_run(a, wl, url, proc.pid, prof)
            res["http"].append(m)
            print(
                f"repeat {rep}: in-process {res['in-process'][-1]['output_throughput']:.1f} tok/s "
                f"({res['in-process'][-1]['cpu_s_per_1k']:.2f} CPU s/1k tok), http "
                f"{m['output_throughput']:.1f} tok/s ({m['cpu_s_per_1k']:.2f} CPU s/1k tok)",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(30)
    _print_medians(a, res)
    if prof:
        prof.dump_stats(a.profile)
        print(f"  client profile: {a.profile}")


def _in_process_run(a: argparse.Namespace, wl: Any, knobs: dict[str, Any], build_cpu: float) -> dict[str, Any]:
    """One in-process run's metrics, with its CPU seconds per 1k output tokens (the engine's build left out)."""
    from cbbench.perf.backends.in_process import run_refengine

    ks = EngineKnobs.of(knobs)
    args = ks.engine_args(model=a.model, device=a.device, dtype=None, seed=0, batching="continuous")
    c0 = time.process_time()
    r = run_refengine(wl, engine_args=args, knobs=ks, max_concurrency=a.concurrency)
    m = r.metrics(metric_percentiles=[50], goodput=None)
    m["cpu_s_per_1k"] = (time.process_time() - c0 - build_cpu) / m["total_output_tokens"] * 1000
    return m


def _http_run(a: argparse.Namespace, wl: Any, url: str, server_pid: int, prof: Any) -> dict[str, Any]:
    """One HTTP run's metrics, with the CPU seconds per 1k output tokens of the client and the server together."""
    from cbbench.perf.backends.cache_isolation import probe
    from cbbench.perf.backends.http_client import HttpTarget
    from cbbench.perf.backends.http_run import run_http

    if prof:
        prof.enable()
    c0, s0 = time.process_time(), _proc_cpu_s(server_pid)
    target = HttpTarget("openai", url, a.model)
    # each run cold, as each in-process run's fresh engine is: else every HTTP run after the first is served from
    # the prefix cache the first one filled (backends/cache_isolation.py)
    h = run_http(wl, target, max_concurrency=a.concurrency, isolation=probe(target, "auto"))
    cpu = time.process_time() - c0 + _proc_cpu_s(server_pid) - s0
    if prof:
        prof.disable()
    if h.error or h.failures:
        raise RuntimeError(f"HTTP run failed: {h.error or h.failures[0].error}")
    m = h.metrics(metric_percentiles=[50], goodput=None)
    m["cpu_s_per_1k"] = cpu / m["total_output_tokens"] * 1000
    return m


def _print_medians(a: argparse.Namespace, res: dict[str, list[dict[str, float]]]) -> None:
    med = {
        side: {
            k: statistics.median(m[k] for m in runs)
            for k in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "cpu_s_per_1k")
        }
        for side, runs in res.items()
    }
    print(
        f"\n{a.model} on {a.device}: fixed {a.input_len}/{a.output_len}, {a.num_prompts} prompts, "
        f"{a.concurrency} concurrent streams, max_num_seqs {a.concurrency}, median of {a.repeats}"
    )
    for side, m in med.items():
        print(
            f"  {side:>10}: {m['output_throughput']:8.1f} out tok/s  TTFT {m['mean_ttft_ms']:7.1f} ms  "
            f"TPOT {m['mean_tpot_ms']:6.2f} ms  ITL {m['mean_itl_ms']:6.2f} ms  CPU {m['cpu_s_per_1k']:.2f} s/1k tok"
        )
    ratio = med["http"]["output_throughput"] / med["in-process"]["output_throughput"]
    print(f"  throughput ratio http / in-process: {ratio:.3f} ({(1 - ratio):+.1%} lost)")
    cpu_ratio = med["http"]["cpu_s_per_1k"] / med["in-process"]["cpu_s_per_1k"]
    print(f"  CPU cost ratio http (server + client) / in-process: {cpu_ratio:.3f}")


if __name__ == "__main__":
    main()
