"""Serving at GPU scale with no GPU: `cbbench serve --device sim:h200` (paced to the virtual clock in real time)
measured by `cbbench perf --backend openai`, against the in-process simulation of the same workload.

    python -m perf.bench.sim_serving [--num-prompts N] [--concurrency C] [--out DIR]

Both sides run the same ShareGPT prompts (token ids, ignore_eos, each its own output length) at `--max-concurrency
C`; it prints mean TTFT / TPOT of each and the relative error of the served figures. The pacing holds only while
the host keeps up with the simulated steps (docs/sim-engine.md): on a loaded machine the served times grow.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from perf.results.files import read_csv

MODEL = "llama-3.1-8b"
DEVICE = "sim:h200"
STARTUP_TIMEOUT_S = 180.0  # importing torch and building the tokenizer on a busy 2-core machine
METRICS = ("mean_ttft_ms", "mean_tpot_ms", "median_ttft_ms", "median_tpot_ms")


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
        "perf.cli",
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


def measure(num_prompts: int, concurrency: int, out: Path) -> dict[str, tuple[float, float, float]]:
    """metric -> (in-process simulated, served, relative error of served)."""
    common = ("--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency))
    _perf(
        "--device", DEVICE, "--batching", "continuous", "--peers", "none", *common, "--output", str(out / "inproc.csv")
    )
    port = _free_port()
    with open(out / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "perf.cli",
                "serve",
                "--model",
                MODEL,
                "--device",
                DEVICE,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc)
        _perf(
            "--backend", "openai", "--base-url", url, "--device", DEVICE, *common, "--output", str(out / "served.csv")
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    a, b = read_csv(out / "inproc.csv").iloc[0], read_csv(out / "served.csv").iloc[0]
    return {m: (float(a[m]), float(b[m]), (float(b[m]) - float(a[m])) / float(a[m])) for m in METRICS}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.bench.sim_serving")
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    out = a.out or Path(tempfile.mkdtemp(prefix="sim-serving-"))
    out.mkdir(parents=True, exist_ok=True)
    for m, (inproc, served, err) in measure(a.num_prompts, a.concurrency, out).items():
        print(f"{m:16s} in-process {inproc:10.2f}  served {served:10.2f}  error {err:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
