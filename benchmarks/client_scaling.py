"""How far the HTTP client scales: TTFT / ITL error against a fake server's known inter-token delay, per
concurrency and client worker count, the request rate and streamed tokens/s each sustained, and the client's own
median schedule delay (perf/client_lag.py: how late it sent the wave's requests; a run is flagged at 10 ms).

    python -m benchmarks.client_scaling [--concurrency 1,64,256,1024,4096] [--workers 1,2]
                                                [--token-delay-ms 20] [--output-len 6] [--run-timeout-s 120]

The fake server (backends/fake_openai_server.py) runs in its own process and sends token k after (k + 1) x delay,
so the truth is TTFT = ITL = delay; what the client measures above that is the client's (and, when the machine's
cores are all busy, the fake server's) lag. Each load point sends `concurrency` requests at once, capped at that
concurrency: one wave. Runs interleave the worker counts at each concurrency. A request that takes longer than
--run-timeout-s fails (the `failed` column), so no run hangs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import Any

ERROR_LIMIT_MS = 1.0  # the client is "sustaining" a load while its median TTFT and ITL error stay under this


def _serve(delay_s: float, port_q: Any, stop: Any) -> None:
    from benchmarks.fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer(token_delay_s=delay_s, with_metrics=False) as s:
        port_q.put(s.port)
        stop.wait()


def measure(
    base_url: str, concurrency: int, workers: int, output_len: int, delay_s: float, timeout_s: float
) -> dict[str, float]:
    from cbbench.perf.backends.http_client import HttpTarget
    from cbbench.perf.backends.http_run import run_http
    from cbbench.perf.client_lag import client_metrics
    from cbbench.perf.metrics import request_latencies
    from cbbench.workloads.workload import Workload, WorkloadRequest

    wl = Workload(
        "manual", {"num_prompts": concurrency}, [WorkloadRequest([1, 2, 3, 4], output_len) for _ in range(concurrency)]
    )
    r = run_http(
        wl,
        HttpTarget("openai", base_url, "fake-model", timeout_s=timeout_s),
        max_concurrency=concurrency,
        warmup=0,
        client_workers=workers,
    )
    if r.error:
        return {"error": 1.0}
    done = [x for x in r.records if x.finish_reason != "error"]
    lat = [request_latencies(x) for x in done]
    ttft = [d["ttft"] for d in lat if d["ttft"] is not None]
    itl = [g for d in lat for g in d["itl"]]
    if not ttft:
        return {"error": 1.0}
    chunks = sum(len(x.chunk_times or []) for x in done)
    pct = statistics.quantiles  # p99 needs >= 2 values
    return {
        "failed": float(len(r.records) - len(done)),
        "ttft_err_ms": (statistics.median(ttft) - delay_s) * 1e3,
        "ttft_p99_err_ms": ((pct(ttft, n=100)[98] if len(ttft) > 1 else ttft[0]) - delay_s) * 1e3,
        "itl_err_ms": (statistics.median(itl) - delay_s) * 1e3 if itl else float("nan"),
        "itl_p99_err_ms": ((pct(itl, n=100)[98] if len(itl) > 1 else itl[0]) - delay_s) * 1e3 if itl else float("nan"),
        "sched_ms": client_metrics(r.records)["median_schedule_delay_ms"],
        "req_per_s": len(done) / r.duration,
        "tok_per_s": chunks / r.duration,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,64,256,1024,4096")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--token-delay-ms", type=float, default=20.0)
    ap.add_argument("--output-len", type=int, default=6)
    ap.add_argument("--run-timeout-s", type=float, default=120.0)
    a = ap.parse_args(argv)
    concs, workers = [int(x) for x in a.concurrency.split(",")], [int(x) for x in a.workers.split(",")]
    delay = a.token_delay_ms / 1e3
    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(delay, port_q, stop), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port_q.get(timeout=120)}"
    print(
        f"fake server: {a.token_delay_ms:g} ms per token, {a.output_len} tokens per request; "
        f"error limit {ERROR_LIMIT_MS:g} ms",
        flush=True,
    )
    print(
        f"{'conc':>5} {'workers':>7} {'TTFT err ms':>11} {'p99':>8} {'ITL err ms':>10} {'p99':>8} "
        f"{'sched ms':>8} {'req/s':>8} {'tok/s':>8} {'failed':>6} {'wall s':>7}",
        flush=True,
    )
    try:
        for c in concs:
            for w in workers:
                t = time.perf_counter()
                m = measure(url, c, w, a.output_len, delay, a.run_timeout_s)
                wall = time.perf_counter() - t
                if "ttft_err_ms" not in m:
                    print(f"{c:>5} {w:>7} {'failed':>11} {'':>55} {wall:>7.1f}", flush=True)
                    continue
                print(
                    f"{c:>5} {w:>7} {m['ttft_err_ms']:>11.2f} {m['ttft_p99_err_ms']:>8.2f} {m['itl_err_ms']:>10.2f} "
                    f"{m['itl_p99_err_ms']:>8.2f} {m['sched_ms']:>8.2f} {m['req_per_s']:>8.1f} {m['tok_per_s']:>8.0f} "
                    f"{int(m['failed']):>6} {wall:>7.1f}",
                    flush=True,
                )
    finally:
        stop.set()
        server.join(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
