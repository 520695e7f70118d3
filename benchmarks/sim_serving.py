"""Serving at GPU scale with no GPU: `cbbench serve --device sim:h200` (paced to its virtual clock, at the time scale
this host keeps up with) measured by `cbbench perf --backend openai`, against the in-process simulation of the
same workload.

    python -m benchmarks.sim_serving [--num-prompts N] [--concurrency C] [--time-scale R] [--out DIR]

Both sides run the same ShareGPT prompts (token ids, ignore_eos, each its own output length) at `--max-concurrency
C`; it prints mean and median TTFT / TPOT of each, the relative error of the served figures (converted by perf
into the server's simulated time, docs/sim-engine.md), the served clock's mean time scale and the wall time of the
served run, and whether mean TPOT is within CHECK_TOLERANCE. `--time-scale R` serves at a fixed
scale instead of the adaptive one (R = 1: real time, where the host's lateness becomes simulated time); `cbbench
serve` has no option for it yet, so the server is then started through `run_server` itself.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from cbbench.perf.results.files import read_csv

MODEL = "llama-3.1-8b"
DEVICE = "sim:h200"
STARTUP_TIMEOUT_S = 180.0  # importing torch and building the tokenizer on a busy 2-core machine
METRICS = ("mean_ttft_ms", "mean_tpot_ms", "median_ttft_ms", "median_tpot_ms")
CHECK_TOLERANCE = 0.10  # served mean TPOT within 10% of in-process at 256 streams: pacing must not shift it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cbbench serve exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(1.0)
    raise RuntimeError(f"cbbench serve not ready after {STARTUP_TIMEOUT_S:.0f} s")


def _perf(*args: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "cbbench.perf.cli",
        "perf",
        "--model",
        MODEL,
        "--workload",
        "sharegpt",
        "--seed",
        "0",
        "--quiet",
        *args,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def _serve_command(port: int, time_scale: float | None) -> list[str]:
    if time_scale is None:
        return [
            sys.executable,
            "-m",
            "cbbench.perf.cli",
            "serve",
            "--model",
            MODEL,
            "--device",
            DEVICE,
            "--port",
            str(port),
        ]
    code = (
        "from refengine.entrypoints.launch import run_server; "
        f"run_server({{'model': {MODEL!r}, 'device': {DEVICE!r}}}, port={port}, time_scale={time_scale!r})"
    )
    return [sys.executable, "-c", code]


def _served(common: tuple[str, ...], out: Path, time_scale: float | None) -> float:
    """Serve, run the openai backend against it into served.csv; the run's wall seconds."""
    port = _free_port()
    with open(out / "serve.log", "w") as log:
        proc = subprocess.Popen(_serve_command(port, time_scale), stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc)
        start = time.monotonic()
        _perf(
            "--backend", "openai", "--base-url", url, "--device", DEVICE, *common, "--output", str(out / "served.csv")
        )
        return time.monotonic() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def measure(num_prompts: int, concurrency: int, out: Path, time_scale: float | None = None) -> dict[str, Any]:
    """metric -> (in-process simulated, served, relative error of served); and the served clock's scale and wall."""
    common = ("--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency))
    _perf(
        "--device", DEVICE, "--batching", "continuous", "--peers", "none", *common, "--output", str(out / "inproc.csv")
    )
    wall = _served(common, out, time_scale)
    a, b = read_csv(out / "inproc.csv").iloc[0], read_csv(out / "served.csv").iloc[0]
    extra = json.loads(b["extra"]) if isinstance(b["extra"], str) and b["extra"] else {}
    res: dict[str, Any] = {m: (float(a[m]), float(b[m]), (float(b[m]) - float(a[m])) / float(a[m])) for m in METRICS}
    return {**res, "sim_time_scale": extra.get("sim_time_scale", 1.0), "served_wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sim_serving")
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--time-scale", type=float, default=None, help="a fixed served clock (default: adaptive)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    out = a.out or Path(tempfile.mkdtemp(prefix="sim-serving-"))
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    res = measure(a.num_prompts, a.concurrency, out, a.time_scale)
    for m in METRICS:
        inproc, served, err = res[m]
        print(f"{m:16s} in-process {inproc:10.2f}  served {served:10.2f}  error {err:+.1%}")
    print(
        f"served clock: {res['sim_time_scale']:.3g} simulated s per wall s (mean); served run {res['served_wall_s']:.0f}"
        f" s wall; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    ok = abs(res["mean_tpot_ms"][2]) <= CHECK_TOLERANCE
    print(f"check: served mean TPOT within {CHECK_TOLERANCE:.0%} of in-process: {'yes' if ok else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
