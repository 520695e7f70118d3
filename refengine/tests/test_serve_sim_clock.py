"""A served simulated GPU reports its clock's time scale (refengine/entrypoints/sim_clock.py) on every response, in
/metrics and in GET /version, and a real device reports none of it; and a stream whose outputs piled up while the
loop was behind writes them as one chunk (serving.outputs)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")
from fastapi.testclient import TestClient  # noqa: E402

from cbbench.perf.backends.server_metrics import parse_prometheus
from refengine.engine.llm_engine import LLMEngine
from refengine.entrypoints.api_server import build_app
from refengine.entrypoints.serving import Call, OpenAIServing
from refengine.outputs import CompletionOutput, RequestOutput
from refengine.sampling_params import SamplingParams

SIM = "llama-3.1-8b"
SCALE = 0.5


@pytest.fixture(scope="module")
def sim_client():
    with TestClient(build_app(LLMEngine(SIM, device="sim:h200"), time_scale=SCALE)) as c:
        yield c


def test_every_response_of_a_served_simulated_gpu_carries_its_time_scale(sim_client):
    ok = sim_client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
    refused = sim_client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": -1})
    missing = sim_client.get("/no-such-route")
    assert (ok.status_code, refused.status_code, missing.status_code) == (200, 400, 404)
    assert {r.headers["x-sim-time-scale"] for r in (ok, refused, missing)} == {"0.5"}


def test_metrics_and_version_report_the_scale_and_a_point_of_the_clock(sim_client):
    sim_client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4})
    parsed = parse_prometheus(sim_client.get("/metrics").text)
    [(_, scale)], [(_, sim)], [(_, wall)] = (
        parsed[k] for k in ("cbbench:sim_time_scale", "cbbench:sim_clock_seconds", "cbbench:sim_wall_clock_seconds")
    )
    assert scale == SCALE and sim > 0 and wall > 0
    later = parse_prometheus(sim_client.get("/metrics").text)
    dw = later["cbbench:sim_wall_clock_seconds"][0][1] - wall
    ds = later["cbbench:sim_clock_seconds"][0][1] - sim
    assert dw > 0 and ds == pytest.approx(SCALE * dw, rel=1e-6)  # idle: the clock runs at the scale
    version = sim_client.get("/version").json()
    assert version["sim_time_scale"] == SCALE and "simulated" in version


def test_a_real_device_reports_no_simulated_clock():
    with TestClient(build_app(LLMEngine("tiny-qwen2", max_num_seqs=2))) as c:
        r = c.get("/version")
        assert "x-sim-time-scale" not in r.headers and "sim_time_scale" not in r.json()
        assert "cbbench:sim" not in c.get("/metrics").text


def _out(index: int, text: str, tokens: list[int], finish: str | None = None) -> RequestOutput:
    done = finish is not None
    return RequestOutput(f"c-{index}", None, [1, 2], [CompletionOutput(0, text, tokens, finish)], done)


def test_outputs_queued_together_come_out_as_one_per_request_in_order():
    call = Call("completion", "c", SIM, 0, [[1, 2], [3, 4]], SamplingParams(max_tokens=4))
    serving = OpenAIServing.__new__(OpenAIServing)  # outputs() reads only the call
    queued = [(0, " a", [5]), (0, " b", [6]), (1, " x", [9], "length"), (0, " c", [7], "length")]

    async def drain() -> list[tuple[int, str, list[int], str | None]]:
        for index, *rest in queued:
            call.queue.put_nowait((index, _out(index, *rest)))  # type: ignore[arg-type]
        return [
            (i, o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason)
            async for i, o in serving.outputs(call)
        ]

    assert asyncio.run(drain()) == [(0, " a b", [5, 6], None), (1, " x", [9], "length"), (0, " c", [7], "length")]
