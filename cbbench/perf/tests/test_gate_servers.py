"""`cbbench gate --base-url A --head-url B` end to end against two fake OpenAI-compatible servers: the two are measured
in turn, never at once, in ABBA order, and a head server five times slower per token fails the gate."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from benchmarks.fake_openai_server import TOKEN_DELAY_S, FakeOpenAIServer
from cbbench.perf.cli import app
from cbbench.perf.results.rows import read_rows

SLOWER = 5  # the head server's token delay, in base delays


class TimedServer(FakeOpenAIServer):
    """A fake server that notes when each completion request starts and ends (the client's warm-up included)."""

    def __init__(self, name: str, log: list[tuple[float, float, str]], lock: threading.Lock, **kw: Any) -> None:
        super().__init__(**kw)
        self.name, self.log, self.lock = name, log, lock

    async def _completions(self, request: Any) -> Any:
        t0 = time.monotonic()
        try:
            return await super()._completions(request)
        finally:
            with self.lock:
                self.log.append((t0, time.monotonic(), self.name))


@pytest.mark.slow  # ten client processes against two servers: about a minute on a shared CPU
def test_two_servers_are_measured_in_turn_and_a_slower_head_fails(tmp_path: Path) -> None:
    log: list[tuple[float, float, str]] = []
    lock = threading.Lock()
    out = tmp_path / "servers.csv"
    with (
        TimedServer("base", log, lock) as base,
        TimedServer("head", log, lock, token_delay_s=SLOWER * TOKEN_DELAY_S) as head,
    ):
        res = CliRunner().invoke(
            app,
            ["gate", "--base-url", base.base_url, "--head-url", head.base_url, "--repeats", "5", "--output",
             str(out), "--workload", "fixed", "--workload-param", "input_len=8,output_len=16", "--num-prompts", "8",
             "--warmup", "1", "--format", "json", "--quiet"],
        )  # fmt: skip
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["base"] == base.base_url and doc["head"] == head.base_url
    assert {r["metric"]: r["status"] for r in doc["rows"]}["mean_tpot_ms"] == "regressed"
    assert "process_cpu_s" not in {r["metric"] for r in doc["rows"]}  # the client's CPU is not the servers' work
    # never at once: in time order, the server changes only between runs, and the runs go B H H B B H ...
    log.sort()
    turns, last_end = [log[0][2]], log[0][1]
    for start, end, who in log[1:]:
        if who != turns[-1]:
            assert start >= last_end, "the two servers were measured at once"
            turns.append(who)
            last_end = end
        last_end = max(last_end, end)
    assert turns == ["base", "head", "base", "head", "base", "head"]  # (adjacent runs of one arm merge: BH HB BH ...)
    rows = read_rows(out)
    assert [r["arm"] for r in rows] == ["base", "head", "head", "base", "base", "head", "head", "base", "base", "head"]
    assert {r["model"] for r in rows} == {"fake-model"}  # asked of /v1/models: both serve it
