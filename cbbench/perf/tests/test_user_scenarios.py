"""ci/user_scenarios.py's normalisation on planted text (the recording itself, minutes of runs, is not run here): what
varies from one run of the same code to the next is masked, and a change a user would see is still reported."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load():
    spec = importlib.util.spec_from_file_location("user_scenarios", ROOT / "ci" / "user_scenarios.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


us = _load()
SHA = "3a858d62bc85ba97e3ed67c88792b4cd5ac096e4"


def masks(timed: bool = False, **kw) -> object:
    literals = {"/tmp/cbscen-ab12/perf-x-9z/tmp": "<tmpdir>", "/tmp/cbscen-ab12/perf-x-9z": "<scenario>"}
    return us.Masks(literals=literals, shas={SHA}, timed=timed, **kw)


def same(a: str, b: str, **kw) -> bool:
    return masks(**kw).text(a) == masks(**kw).text(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # wall-clock figures beside a simulated run's virtual ones
        (
            "simulated 37.7 s of GPU time in 3.1 s of worker time (...; 11.99 simulated s per worker s)",
            "simulated 37.7 s of GPU time in 12.4 s of worker time (...; 3.04 simulated s per worker s)",
        ),
        (
            "5 run(s) on pool (2 worker processes) in 5.3 s elapsed",
            "5 run(s) on pool (2 worker processes) in 61 s elapsed",
        ),
        (
            "gate [1/4] base HEAD (3a858d6): 5.5 s, 4.0 CPU s, output tok/s 880.1",
            "gate [1/4] base HEAD (3a858d6): 9.1 s, 4.7 CPU s, output tok/s 880.1",
        ),
        ("[1/1] row_1: TTFT 161 ms, TPOT 15.21 ms in 3 s", "[1/1] row_1: TTFT 161 ms, TPOT 15.21 ms in 14 s"),
        # a run's progress line, a grid's rate and ETA, the heartbeat (there or not, as the machine is slow or fast)
        (
            "[2/4] refengine continuous: 16/16 requests in 1.8 s, 1562 tok/s | 2/4 runs, 1.5 runs/min, ETA 1 min 20 s",
            "[2/4] refengine continuous: 16/16 requests in 0.9 s, 1562 tok/s | 2/4 runs, 3.10 runs/s, ETA 1 s",
        ),
        (
            "[1/2] x: 8 requests, 2.5 s on a worker, 9 tok/s | 1/2 runs, 2.0 runs/min, ETA 30 s",
            "[1/2] x: 8 requests, 0.5 s on a worker, 9 tok/s | 1/2 runs, 1.0 runs/s, ETA 1 s",
        ),
        (
            "a\n... [1/4] x: building and warming up the engine, 30 s\n... 1/4 runs on pool (2 worker processes)\nb\n",
            "a\nb\n",
        ),
        # dates, file-name stamps, process ids, temporary folders, shas
        ("timestamp 2026-12-07T05:27:19+00:00", "timestamp 2027-01-01T23:59:01+00:00"),
        ("wrote results/sharegpt-20261207-052719.csv", "wrote results/sharegpt-20270101-000000.csv"),
        ("results to results/gate-20261207-052719-29405.csv", "results to results/gate-20261207-052801-311.csv"),
        ("worker pid 1234 died", "worker pid 98765 died"),
        (
            "--output /tmp/cbscen-ab12/perf-x-9z/tmp/cbbench-gate-jrnd6nls/runs/a.csv",
            "--output /tmp/cbscen-ab12/perf-x-9z/tmp/cbbench-gate-q_0x9abc/runs/a.csv",
        ),
        ("commit 0123456789abcdef0123456789abcdef01234567", "commit fedcba9876543210fedcba9876543210fedcba98"),
    ],
)
def test_what_varies_between_two_runs_is_masked(a, b):
    assert a != b
    assert same(a, b), (masks().text(a), masks().text(b))


def test_the_source_trees_sha_is_masked_short_or_long():
    assert masks().text(f"base HEAD ({SHA[:7]}) at {SHA[:12]}, {SHA}") == "base HEAD (<sha>) at <sha>, <sha>"
    assert masks().text("base HEAD (main) at deadbee") == "base HEAD (main) at deadbee"  # not a sha it knows


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "cbbench perf: error: --num-prompts must be >= 1, got -1",
            "cbbench perf: error: --num-prompts must be at least 1, got -1",
        ),
        (
            "simulated 37.7 s of GPU time in 3.1 s of worker time",
            "simulated 37.8 s of GPU time in 3.1 s of worker time",
        ),
        (
            "│ refengine │ continuous │    1615.3 │      3063.3 │",
            "│ refengine │ continuous │    1615.4 │      3063.3 │",
        ),
        ("wrote out/a.csv, out/a.json and out/a.records/", "wrote out/a.csv and out/a.json"),
        ("5 run(s) on pool (2 worker processes) in 5.3 s elapsed", "5 run(s) serially in 5.3 s elapsed"),
        ("base HEAD (3a858d6)", "base HEAD (main)"),
    ],
)
def test_a_change_a_user_sees_is_reported(a, b):
    assert not same(a, b)
    assert us.diff_texts("x", masks().text(a), masks().text(b), "A", "B").startswith("=== x\n--- A/x\n+++ B/x")


TABLE = """\
cbbench perf of tiny-qwen2: sharegpt, 2 requests, prompt mean 113 (max 211)
┏━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━━━━┓
┃ engine    ┃ batching   ┃ out tok/s ┃ TTFT mean ms ┃ peak KV blk ┃
┡━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━┩
│ refengine │ continuous │      {tps} │          {ttft} │          {blk} │
└───────────┴────────────┴───────────┴──────────────┴─────────────┘
[1/1] refengine continuous, repeat 1/1: 2/2 requests in {secs} s, {rate} tok/s
"""


def test_a_timed_run_keeps_its_structure_and_masks_its_timings():
    a = TABLE.format(tps="47.6", ttft="516", blk="23", secs="3.0", rate="48")
    b = TABLE.format(tps="147.62", ttft="2016", blk="23", secs="12.5", rate="9")
    assert not same(a, b)  # untimed: every figure counts
    assert same(a, b, timed=True)
    normalised = masks(timed=True).text(a)
    assert "| engine | batching | out tok/s | TTFT mean ms | peak KV blk |" in normalised
    assert "| refengine | continuous | <masked> | <masked> | 23 |" in normalised
    assert "2/2 requests in <wall> s, <t> tok/s" in normalised
    # the count of blocks and of requests are not timings
    assert not same(a, TABLE.format(tps="47.6", ttft="516", blk="24", secs="3.0", rate="48"), timed=True)
    assert not same(a, a.replace("2/2 requests", "1/2 requests"), timed=True)


CSV = "schema_version,engine,num_steps,output_throughput,mean_ttft_ms,git_sha,timestamp,extra\n"


def csv_row(steps: int, tps: float, sha: str, when: str, cpu: float) -> str:
    return CSV + f'5,refengine,{steps},{tps},95.1,{sha},{when},"{{""process_cpu_s"": {cpu}}}"\n'


def test_results_csv_masks_the_sha_the_time_and_cpu_seconds_and_keeps_the_figures():
    a = csv_row(523, 1615.3, SHA, "2026-12-07T05:27:19+00:00", 4.85)
    b = csv_row(523, 1615.3, "f" * 40, "2026-12-08T01:00:00+00:00", 4.2)
    assert us.render_csv(a, masks()) == us.render_csv(b, masks())
    assert "num_steps = 523\noutput_throughput = 1615.3\n" in us.render_csv(a, masks())
    slower = csv_row(523, 1500.0, SHA, "2026-12-07T05:27:19+00:00", 4.85)
    assert us.render_csv(a, masks()) != us.render_csv(slower, masks())  # a simulated figure is kept
    assert us.render_csv(a, masks(timed=True)) == us.render_csv(slower, masks(timed=True))  # a measured one is not
    more_steps = csv_row(524, 1615.3, SHA, "2026-12-07T05:27:19+00:00", 4.85)
    assert us.render_csv(a, masks(timed=True)) != us.render_csv(more_steps, masks(timed=True))
    assert us.render_csv(CSV + "5,x,1,2,3,4,5,{}\n", masks()) != us.render_csv(
        CSV.replace("extra", "more") + "5,x,1,2,3,4,5,{}\n", masks()
    )


def test_json_masks_versions_and_wall_seconds_not_the_schema():
    doc = '{"schema_version": 5, "environment": {"git_sha": "%s", "torch_version": "%s", "cpu_count": 2}, "sim_speed": {"simulated_s": 37.7, "wall_s": %s}}'
    a = us.render_json(doc % (SHA, "2.13.0", "3.1"), masks())
    assert a == us.render_json(doc % ("0" * 40, "2.14.1", "9.9"), masks())
    assert '"schema_version": 5' in a and '"cpu_count": 2' in a and '"simulated_s": 37.7' in a
    assert a != us.render_json((doc % (SHA, "2.13.0", "3.1")).replace("37.7", "37.8"), masks())
    assert a != us.render_json(
        (doc % (SHA, "2.13.0", "3.1")).replace('"schema_version": 5', '"schema_version": 6'), masks()
    )


def test_a_pool_run_order_is_not_a_difference(tmp_path):
    """Runs on a pool of processes are numbered as they finish: with `unordered`, a run's files are named by its
    label and sim_speed's runs are sorted."""
    for folder, order in (("a", ["x/continuous", "x/static"]), ("b", ["x/static", "x/continuous"])):
        runs = tmp_path / folder / "out.records" / "runs"
        runs.mkdir(parents=True)
        for i, label in enumerate(order, 1):
            (runs / f"run-{i:06d}.json").write_text(f'{{"label": "{label}"}}')
    paths = ["out.records/runs/run-000001.json", "out.records/runs/run-000002.json"]
    a, b = (us.shown_names(paths, tmp_path / f, unordered=True) for f in "ab")
    assert (
        sorted(a.values())
        == sorted(b.values())
        == ["out.records/runs/run-<x/continuous>.json", "out.records/runs/run-<x/static>.json"]
    )
    assert us.shown_names(paths, tmp_path / "a", unordered=False) == {p: p for p in paths}
    speed = '{"runs": {"x static": {"wall_s": 1}, "x continuous": {"wall_s": 2}}}'
    flipped = '{"runs": {"x continuous": {"wall_s": 2}, "x static": {"wall_s": 1}}}'
    assert us.render_json(speed, masks(unordered=True)) == us.render_json(flipped, masks(unordered=True))
    assert us.render_json(speed, masks()) != us.render_json(flipped, masks())


def test_diff_exits_0_on_identical_recordings_and_1_with_a_unified_diff(tmp_path, capsys):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.txt").write_text("bad-x\nhelp-y\n")
        (tmp_path / name / "bad-x.txt").write_text(
            "$ cbbench perf\n== exit code\n2\n== stderr\ncbbench perf: error: no\n"
        )
        (tmp_path / name / "help-y.txt").write_text("usage\n")
    assert us.main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "identical: 2 scenario(s)" in capsys.readouterr().out
    (tmp_path / "b" / "bad-x.txt").write_text("$ cbbench perf\n== exit code\n1\n== stderr\ncbbench perf: error: no\n")
    (tmp_path / "b" / "only-b.txt").write_text("new\n")
    assert us.main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert f"--- {tmp_path / 'a'}/bad-x\n+++ {tmp_path / 'b'}/bad-x\n" in out
    assert "-2\n+1\n" in out and "=== only-b: only in" in out
    assert "2 of 3 scenario(s) differ: bad-x, only-b" in out


def test_the_scenario_list():
    names = [s.name for s in us.scenarios()]
    assert len(names) == len(set(names))
    assert all(s.needs is None or s.needs in names for s in us.scenarios())
    assert sum(n.startswith("bad-") for n in names) >= 15
    for cmd in us.COMMANDS:
        base = "help-" + ("-".join(cmd) or "cbbench")
        assert {base, base + "-c80", base + "-c200"} <= set(names)
    assert any(s.timed for s in us.scenarios()) and any("sim:h200" in s.args for s in us.scenarios())
