"""perf/sim/data/measured_runs.csv, the measured vLLM runs the simulated GPUs are validated against: the table's shape
(the columns SOURCE.md documents, unique ids, values from the documented vocabularies, positive finite numbers), that
every row cites a source SOURCE.md describes, and that ci/extract_measured_runs.py, which regenerates the
aiconfigurator rows, keeps every other row as it is."""

from __future__ import annotations

import csv
import importlib.util
import math
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[4]
DATA = ROOT / "perf" / "sim" / "data"
CSV_PATH = DATA / "measured_runs.csv"
SOURCE_MD = DATA / "SOURCE.md"
EXTRACT = ROOT / "ci" / "extract_measured_runs.py"

# the rows ci/extract_measured_runs.py takes from aiconfigurator-core 0.12.0 (its docstring says which and why)
AICONFIGURATOR_ROWS = 219
MODELS = {
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "opt-13b",
    "mistral-7b",
    "mistral-nemo-12b",
    "mistral-large-123b",
}
GPUS = {"h100", "h200", "a100", "a100-40gb"}
DTYPES = {"bfloat16", "float16", "fp8"}
WORKLOADS = {"fixed", "random", "sharegpt", "anyscale-exp"}
STATS = {"mean", "median", ""}
METRICS = ("ttft_ms", "tpot_ms", "output_throughput")
NUMERIC = ("tensor_parallel_size", "isl", "osl", "concurrency", "num_prompts", *METRICS)
# the workloads whose requests have set lengths carry both; ShareGPT's come from the sample, Anyscale's outputs
# from a distribution
LENGTHS = {"fixed": (True, True), "random": (True, True), "sharegpt": (False, False), "anyscale-exp": (True, False)}


def _load(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def table() -> tuple[list[str], list[dict[str, str]]]:
    return _load(CSV_PATH)


@pytest.fixture(scope="module")
def extract() -> ModuleType:
    spec = importlib.util.spec_from_file_location("extract_measured_runs", EXTRACT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented_prefixes() -> list[str]:
    """The first column of SOURCE.md's source table: one backticked prefix a row."""
    return re.findall(r"^\| `([^`]+)` \|", SOURCE_MD.read_text(), flags=re.M)


def test_columns_are_the_documented_ones(table: tuple[list[str], list[dict[str, str]]], extract: ModuleType) -> None:
    header, rows = table
    assert header == extract.COLUMNS, "the CSV's header must be the columns the extract script writes"
    doc = SOURCE_MD.read_text()
    assert [c for c in header if f"`{c}`" not in doc] == [], "every column is described in SOURCE.md"
    assert all(None not in r and len(r) == len(header) for r in rows), "every row has exactly the header's cells"


def test_ids_are_unique(table: tuple[list[str], list[dict[str, str]]]) -> None:
    ids = [r["id"] for r in table[1]]
    assert all(ids) and len(set(ids)) == len(ids)


def test_every_row_has_a_source_and_a_metric(table: tuple[list[str], list[dict[str, str]]]) -> None:
    rows = table[1]
    assert [r["id"] for r in rows if not r["source"].strip()] == []
    assert [r["id"] for r in rows if not any(r[m] for m in METRICS)] == []


def test_numbers_are_positive_and_finite(table: tuple[list[str], list[dict[str, str]]]) -> None:
    bad = []
    for r in table[1]:
        for col in NUMERIC:
            if r[col] and not (math.isfinite(float(r[col])) and float(r[col]) > 0):
                bad.append((r["id"], col, r[col]))
        # `inf` is the documented token for "all at once"; anything else is a finite positive rate
        rate = r["request_rate"]
        if rate != "inf" and not (rate and math.isfinite(float(rate)) and float(rate) > 0):
            bad.append((r["id"], "request_rate", rate))
    assert bad == []


def test_values_come_from_the_listed_sets(table: tuple[list[str], list[dict[str, str]]]) -> None:
    rows = table[1]
    for col, allowed in (("model", MODELS), ("gpu", GPUS), ("dtype", DTYPES), ("workload", WORKLOADS)):
        assert {r[col] for r in rows} <= allowed, col
    assert {r["engine"] for r in rows} == {"vllm"}
    assert {r["stat"] for r in rows} <= STATS


def test_stat_is_named_exactly_when_a_latency_is_given(table: tuple[list[str], list[dict[str, str]]]) -> None:
    rows = table[1]
    assert [r["id"] for r in rows if bool(r["ttft_ms"] or r["tpot_ms"]) != bool(r["stat"])] == []


def test_lengths_match_the_workload(table: tuple[list[str], list[dict[str, str]]]) -> None:
    wrong = [r["id"] for r in table[1] if (bool(r["isl"]), bool(r["osl"])) != LENGTHS[r["workload"]]]
    assert wrong == []


def test_every_source_is_documented_and_every_documented_source_used(
    table: tuple[list[str], list[dict[str, str]]],
) -> None:
    prefixes = _documented_prefixes()
    assert prefixes, "SOURCE.md's source table was not found"
    rows = table[1]
    assert [r["id"] for r in rows if not any(r["source"].startswith(p) for p in prefixes)] == []
    assert [p for p in prefixes if not any(r["source"].startswith(p) for r in rows)] == []


def test_aiconfigurator_rows_are_the_extracts(
    table: tuple[list[str], list[dict[str, str]]], extract: ModuleType
) -> None:
    ours = [r for r in table[1] if r["source"].startswith(extract.SOURCE_PREFIX)]
    assert len(ours) == AICONFIGURATOR_ROWS
    assert table[1][: len(ours)] == ours, "the extract writes its own rows first"


def _silicon_row(extract: ModuleType) -> dict[str, str]:
    """One row of silicon_sample.csv that the extract keeps (a vLLM run of a dense model it has a preset for)."""
    return {
        "id": "fake_qwen3_32b_h100_1",
        "silicon_data_source": "source_file=fake.csv; model=Qwen3-32B",
        "backend": "vllm",
        "backend_version": "0.12.0",
        "model_path": "Qwen/Qwen3-32B",
        "system": "h100_sxm",
        "precision": "bfloat16",
        "mode": "agg",
        "isl": "1024",
        "osl": "128",
        "gemm_quant_mode": "",
        "batch_size": "8",
        "tp_size": "2",
        "pp_size": "1",
        "attention_dp_size": "1",
        "silicon_ttft_ms": "150.0",
        "silicon_tpot_ms": "18.0",
    }


def test_the_extract_keeps_the_other_rows(
    table: tuple[list[str], list[dict[str, str]]], extract: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "measured_runs.csv"
    out.write_bytes(CSV_PATH.read_bytes())
    silicon = tmp_path / "silicon_sample.csv"
    fake = _silicon_row(extract)
    with silicon.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fake))
        writer.writeheader()
        writer.writerow(fake)
    monkeypatch.setattr(extract, "OUT", out)
    extract.main(["--silicon", str(silicon)])
    _, rows = _load(out)
    others = [r for r in table[1] if not r["source"].startswith(extract.SOURCE_PREFIX)]
    assert others, "the table holds rows of other sources"
    assert [r["id"] for r in rows] == [fake["id"]] + [r["id"] for r in others]
    assert rows[1:] == others, "the other rows come back cell for cell, in their order"
