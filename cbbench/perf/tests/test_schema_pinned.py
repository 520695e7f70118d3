"""The result files' schema, pinned: the CSV header and, per engine, the keys (in order) of the JSON's top level,
its rows, its per-request records and its per-step traces, against fixtures/schema.json. A refactor keeps what
`compare`, `report` and other readers of old files rely on; a deliberate change regenerates the fixture
(`python perf/tests/test_schema_pinned.py`) and bumps `SCHEMA_VERSION` if a CSV column changes."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from benchmarks.fake_openai_server import FakeOpenAIServer
from cbbench.perf.cli import app
from cbbench.perf.results.run_json import read_run

FIXTURE = Path(__file__).parent / "fixtures" / "schema.json"
TINY = [
    "--workload",
    "fixed",
    "--workload-param",
    "input_len=8,output_len=4",
    "--num-prompts",
    "3",
    "--warmup",
    "1",
    "--cpu-threads",
    "0",
    "--quiet",
]


class RefusingServer(FakeOpenAIServer):
    """A server that answers every completion 400: each request of a run is an error record."""

    async def _completions(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"error": {"message": "refused", "code": 400}}, status=400)


def _perf(out: Path, *args: str, exit_code: int = 0) -> tuple[list[str], dict[str, Any]]:
    res = CliRunner().invoke(app, ["perf", *TINY, "--output", str(out / "r.csv"), *args])
    assert res.exit_code == exit_code, res.output
    return (out / "r.csv").read_text().splitlines()[0].split(","), read_run(out / "r.json")


def _layout(doc: dict[str, Any]) -> dict[str, Any]:
    """The key layout of a results JSON: per engine (the label's first part), its records' and steps' keys."""
    out: dict[str, Any] = {
        "top": list(doc),
        "config": list(doc["config"]),
        "row": list(doc["rows"][0]),
        "workload": list(doc["workload"]),
    }
    for kind in ("records", "steps"):
        for label, items in doc[kind].items():
            for item in items:
                key = f"{kind}:{label.split('/')[0]}:{'error' if item.get('finish_reason') == 'error' else 'ok'}"
                out.setdefault(key, list(item))
                assert out[key] == list(item), key  # every item of one kind has the same keys
    return out


def measure() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        header, doc = _perf(Path(d), "--batching", "continuous,static", "--peers", "hf-static", "--max-num-seqs", "2")
        got = {"csv": header, "in_process": _layout(doc)}
    with tempfile.TemporaryDirectory() as d, FakeOpenAIServer() as server:
        _, doc = _perf(Path(d), "--backend", "openai", "--base-url", server.base_url, "--model", "fake-model")
        got["http"] = _layout(doc)
    with tempfile.TemporaryDirectory() as d, RefusingServer() as server:  # every request is an error record
        # (a run that measured nothing exits 1, after writing its files)
        _, doc = _perf(Path(d), "--backend", "openai", "--base-url", server.base_url, "--warmup", "0", exit_code=1)
        got["http_failed"] = _layout(doc)
    return got


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return measure()


@pytest.mark.parametrize("part", ["csv", "in_process", "http", "http_failed"])
def test_schema_matches_fixture(measured: dict[str, Any], part: str) -> None:
    assert measured[part] == json.loads(FIXTURE.read_text())[part]


if __name__ == "__main__":  # regenerate the fixture
    FIXTURE.write_text(json.dumps(measure(), indent=1) + "\n")
    sys.exit(0)
