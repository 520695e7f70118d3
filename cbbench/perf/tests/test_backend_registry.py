"""A backend is one class registered by name: this test registers a throwaway one (in the test, nothing else
changes) and runs `cbbench perf --backend <it>` end to end, through the plan, the writer and the table."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from cbbench.perf.backends.backend import ProgressFn, RunResult
from cbbench.perf.backends.registry import Backend  # with the built-in backends registered: the fixture copies them
from cbbench.perf.cli import app
from cbbench.perf.plan.spec import RunSpec
from cbbench.perf.records import RequestRecord, StepRecord
from cbbench.perf.results.files import read_csv
from cbbench.perf.results.run_json import read_run

NAME = "echo-test"
TOKEN_S = 0.01  # the throwaway backend's pretend time per output token


class EchoBackend(Backend):
    """Answers every request at once, one token per TOKEN_S: no engine, only records."""

    runs: list[RunSpec] = []

    def run(self, spec: RunSpec, progress: ProgressFn | None = None) -> RunResult:
        EchoBackend.runs.append(spec)
        records, steps = [], []
        for i, r in enumerate(spec.workload.requests):
            times = [TOKEN_S * (k + 1) for k in range(r.output_len)]
            records.append(
                RequestRecord(
                    str(i),
                    r.prompt_len,
                    r.output_len,
                    0.0,
                    0.0,
                    times[0],
                    times,
                    times[-1],
                    num_preemptions=0,
                    num_cached_tokens=0,
                    finish_reason="length",
                )
            )
        for k in range(max(r.output_len for r in spec.workload.requests)):
            steps.append(StepRecord(TOKEN_S * (k + 1), len(records), len(records), 0, None, len(records), None))
        if progress:
            progress(len(records))
        return RunResult(
            self.name,
            spec.batching,
            dataclasses.replace(spec.knobs, max_num_seqs=len(records)),  # (the slots its steps' metrics divide by)
            records=records,
            steps=steps,
            duration=max(r.finish_time for r in records),
        )


@pytest.fixture
def echo_registered(monkeypatch):
    monkeypatch.setattr(Backend, "_registry", dict(Backend._registry))  # the registration ends with the test
    EchoBackend.runs = []
    Backend.register(NAME, kind="engine")(EchoBackend)
    yield


def test_a_registered_backend_runs_end_to_end(echo_registered, tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(
        app,
        [
            "perf",
            "--backend",
            NAME,
            "--workload",
            "fixed",
            "--workload-param",
            "input_len=8,output_len=4",
            "--num-prompts",
            "3",
            "--batching",
            "continuous,static",
            "--peers",
            "none",
            "--warmup",
            "0",
            "--quiet",
            "--output",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert [(s.backend, s.batching) for s in EchoBackend.runs] == [(NAME, "continuous"), (NAME, "static")]
    df = read_csv(out)
    assert list(df["engine"]) == [NAME, NAME] and list(df["batching"]) == ["continuous", "static"]
    assert (df["completed"] == 3).all() and (df["total_output_tokens"] == 12).all()
    # 4 tokens at TOKEN_S each: E2EL 40 ms, TTFT 10 ms for every request
    assert df["mean_e2el_ms"].tolist() == pytest.approx([4000 * TOKEN_S] * 2)
    doc = read_run(out.with_suffix(".json"))
    assert sorted(doc["records"]) == [f"{NAME}/continuous/-/repeat0", f"{NAME}/static/-/repeat0"]
    assert all(len(recs) == 3 for recs in doc["records"].values())
    assert f"{NAME}" in res.output


def test_an_unregistered_backend_is_refused():
    res = CliRunner().invoke(app, ["perf", "--backend", NAME, "--workload", "fixed", "--quiet"])
    assert res.exit_code == 2
    assert f"backend: unknown {NAME!r}; expected one of refengine, openai, openai-chat" in res.stderr
