"""No measured run against a server is served from the prefix cache an earlier run filled (`--prefix-cache-isolation`,
backends/cache_isolation.py), against a real `cbbench serve` stack (tiny model, in a thread of this process):

- repeated runs of the same prompts: with isolation every repeat's prefix-cache hit rate is ~0 (its own salt, a
  reset after its warm-up, or both); with `off` the second repeat is served warm, and the table says so;
- the prefixes one run shares inside itself still hit under isolation (the `prefix` workload), as much in the
  second repeat as in the first;
- bad input is one line and exit 2 before anything runs: a mode the server lacks, any mode but auto in process.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi", reason="cbbench serve needs fastapi (pip install -e .)")

from benchmarks.fake_openai_server import FakeOpenAIServer  # noqa: E402
from cbbench.perf.backends.cache_isolation import Isolation, probe  # noqa: E402
from cbbench.perf.backends.http_client import HttpTarget  # noqa: E402
from cbbench.perf.cli import app  # noqa: E402
from cbbench.perf.report.table import PREFIX_HIT_SHOWN  # noqa: E402
from cbbench.perf.results.files import read_csv  # noqa: E402
from refengine.engine.llm_engine import LLMEngine  # noqa: E402
from refengine.models.presets import TEST_MODEL  # noqa: E402
from refengine.tests.live_server import live_server  # noqa: E402

BLOCK = 16
# four distinct 64-token prompts, run one at a time: a warm repeat finds 3 of each prompt's 4 blocks (the last
# token is always computed), a hit rate of 48 / 64 = 0.75; a cold one finds none
FIXED = ["--workload", "fixed", "--workload-param", "input_len=64,output_len=2"]
# one shared 64-token prefix, four prompts one at a time: the last three hit it inside the run, 3 x 64 / (4 x 72) =
# 0.67 in every cold run; a warm repeat hits the first prompt's too, 4 x 64 / 288 = 0.89
PREFIX = ["--workload", "prefix", "--workload-param", "num_prefixes=1,prefix_len=64,suffix_len=8,output_len=2"]
COMMON = ["--num-prompts", "4", "--max-concurrency", "1", "--repeats", "2", "--warmup", "2", "--model", TEST_MODEL]
WARM = 0.5  # a repeat served from the first repeat's cache hits most of its prompts (0.75 and 0.89 above)
IN_RUN = 0.6  # the prefix workload's own hits inside one run (0.67 above)


@pytest.fixture(scope="module")
def url():
    engine = LLMEngine(TEST_MODEL, max_num_seqs=4, block_size=BLOCK, stats_log_size=1)
    with live_server(engine) as live:
        yield live.url


def _perf(tmp_path, url, *args: str):
    res = CliRunner().invoke(app, ["perf", "--backend", "openai", "--base-url", url, *COMMON, *args,
                                   "--result-dir", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 0, res.output
    (csv,) = tmp_path.glob("*.csv")
    rows = sorted(read_csv(csv).to_dict("records"), key=lambda r: r["repeat"])
    return rows, res.output


def _isolation(row) -> str:
    return json.loads(row["extra"])["prefix_cache_isolation"]


@pytest.mark.parametrize("mode, label", [("auto", "salt+reset"), ("salt", "salt"), ("reset", "reset")])
def test_every_repeat_starts_cold_with_isolation(tmp_path, url, mode, label):
    rows, out = _perf(tmp_path, url, *FIXED, "--prefix-cache-isolation", mode)
    assert [_isolation(r) for r in rows] == [label, label]
    assert [r["prefix_cache_hit_rate"] for r in rows] == [0.0, 0.0]  # repeat 2 found nothing of repeat 1
    assert "may be served from the prefix cache" not in out


def test_a_warm_repeat_is_seen_with_isolation_off(tmp_path, url):
    rows, out = _perf(tmp_path, url, *FIXED, "--prefix-cache-isolation", "off", "--format", "markdown")
    assert [_isolation(r) for r in rows] == ["off", "off"]
    assert rows[1]["prefix_cache_hit_rate"] > WARM  # served from repeat 1's cache
    assert "prefix-cache isolation off" in out and "prefix hit" in out  # the note, and the column
    assert out.count("prefix-cache isolation off") == 1  # one note for the table, not one per run


def test_prefixes_shared_inside_a_run_still_hit(tmp_path, url):
    rows, _ = _perf(tmp_path, url, *PREFIX)
    hits = [r["prefix_cache_hit_rate"] for r in rows]
    assert all(h > IN_RUN for h in hits), hits
    assert hits[0] == hits[1], "the second repeat hit more than its own prefixes: it was served warm"


def test_a_mode_the_server_lacks_or_an_in_process_backend_is_one_line_and_exit_2(tmp_path):
    with FakeOpenAIServer() as fake:  # no reset route (404)
        res = CliRunner().invoke(app, ["perf", "--backend", "openai", "--base-url", fake.base_url, *FIXED,
                                       "--num-prompts", "2", "--prefix-cache-isolation", "reset",
                                       "--result-dir", str(tmp_path)])  # fmt: skip
        assert res.exit_code == 2, res.output
        assert "offers no prefix-cache reset" in res.output and not list(tmp_path.glob("*.csv"))
        # what auto finds there: it takes the field (and ignores it: the hit rate is the check); no reset
        assert probe(HttpTarget("openai", fake.base_url, "fake-model"), "auto") == Isolation("auto", True, None)
        res = CliRunner().invoke(app, ["perf", "--backend", "openai-embeddings", "--base-url", fake.base_url,
                                       "--prefix-cache-isolation", "salt", "--dry-run"])  # fmt: skip
        assert res.exit_code == 2 and "carry no cache_salt" in res.output, res.output
    for mode in ("salt", "reset", "off"):
        res = CliRunner().invoke(app, ["perf", *FIXED, "--num-prompts", "2", "--prefix-cache-isolation", mode,
                                       "--dry-run"])  # fmt: skip
        assert res.exit_code == 2, res.output
        assert "--prefix-cache-isolation" in res.output and "server backend" in res.output
    res = CliRunner().invoke(app, ["perf", *FIXED, "--prefix-cache-isolation", "cold", "--dry-run"])
    assert res.exit_code == 2 and "--prefix-cache-isolation" in res.output, res.output


def test_a_server_offering_neither_is_said_under_the_table():
    assert Isolation("auto").label == "none"
    note = Isolation("auto").note("http://h:1")
    assert note is not None and "runs after the first may be served" in note
    assert Isolation("auto", salt=True).note("http://h:1") is None
    assert PREFIX_HIT_SHOWN < WARM
