"""The writer's piecewise JSON is the document `write_run_json` writes, value for value."""

from __future__ import annotations

import json
import math

import numpy as np

from cbbench.perf.results.files import write_run_json
from cbbench.perf.results.json_text import encode, run_json_text

RECORDS = {
    "a": [{"ttft": 0.5, "itl": [0.1, 0.2], "n": 3}],
    "b": [{"ttft": math.inf, "e2e": math.nan, "n": np.int64(7), "shape": (1, 2)}],  # what the fast path refuses
}
STEPS = {"a": [{"t": 1.0, "num_running": 2}], "b": []}


def test_encode_matches_jsonable_for_values_the_c_encoder_refuses():
    assert json.loads(encode(RECORDS["b"])) == [{"ttft": "inf", "e2e": "nan", "n": 7, "shape": [1, 2]}]
    assert json.loads(encode(RECORDS["a"])) == RECORDS["a"]


def test_piecewise_document_equals_write_run_json(tmp_path):
    kw = dict(config={"device": "cpu", "x": (1, 2)}, environment={"host": "h"}, workload={"name": "w"})
    rows = [{"engine": "refengine", "tok_s": 1.5}]
    slow = json.loads(write_run_json(tmp_path / "a.json", rows=rows, records=RECORDS, steps=STEPS, **kw).read_text())
    enc = {k: encode(v) for k, v in RECORDS.items()}
    fast = json.loads(run_json_text(rows=rows, records=enc, steps={k: encode(v) for k, v in STEPS.items()}, **kw))
    assert fast == slow
    assert list(fast) == list(slow)  # same keys, same order
    series = {"a": [{"time": 0.0, "kv_usage": None}]}
    slow = json.loads(
        write_run_json(
            tmp_path / "b.json", rows=rows, records=RECORDS, steps=STEPS, server_metrics=series, **kw
        ).read_text()
    )
    steps = {k: encode(v) for k, v in STEPS.items()}
    fast = json.loads(run_json_text(rows=rows, records=enc, steps=steps, server_metrics=series, **kw))
    assert fast == slow
    assert list(fast) == list(slow)  # same keys, same order
