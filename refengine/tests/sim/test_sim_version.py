"""A served simulated engine says so: GET /version carries the device label under "simulated" (what the HTTP
suite's `Server.simulated` reads to skip sampling-semantics tests); a real device's /version has no such field."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")
from fastapi.testclient import TestClient  # noqa: E402

from refengine.engine.llm_engine import LLMEngine  # noqa: E402
from refengine.entrypoints.api_server import build_app  # noqa: E402


def _version(engine: LLMEngine) -> dict:
    with TestClient(build_app(engine)) as client:
        return client.get("/version").json()


def test_a_simulated_server_names_its_gpu_in_version() -> None:
    engine = LLMEngine("qwen2.5-0.5b", device="sim:h200", max_num_seqs=4)
    body = _version(engine)
    assert body["simulated"] == engine.device_label and "H200" in body["simulated"].upper()
    assert body["version"]


def test_a_real_device_does_not_claim_to_be_simulated() -> None:
    assert "simulated" not in _version(LLMEngine("tiny-qwen2", max_num_seqs=4))
