"""`cbbench gate` end to end on the simulated H200, whose runs repeat to the digit: a scratch commit that makes every
simulated step 2 % slower fails on every gated metric, with ratios of exactly 1.02; the gate writes one results pair
that `show`, `compare`, `report` and `plot` read, each row with its arm and the git_sha its own tree's code recorded.
(The A/A gate, every ratio exactly 1.0, is perf/tests/test_gpu_scripts.py's: ci/gpu_check.sh's last step run on the
simulated H200.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gate_repos import copy_of_this_checkout, git
from typer.testing import CliRunner

from benchmarks.gate_power import plant_sim_slowdown
from cbbench.perf.cli import app
from cbbench.perf.results.files import write_csv
from cbbench.perf.results.rows import read_rows

# 5 runs per arm: the fewest with which a change can be significant over the 7 default tests (1 / C(10, 5) < 0.05 / 7)
SIM = ["--device", "sim:h200", "--num-prompts", "20", "--repeats", "5", "--quiet", "--format", "json"]
PLANTED = 1.02  # the planted cost-model slowdown


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_this_checkout(tmp_path_factory.mktemp("gate-sim") / "repo")


def gate(repo: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, dict]:
    monkeypatch.chdir(repo)
    res = CliRunner().invoke(app, ["gate", *args, *SIM])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def test_a_planted_two_percent_cost_model_slowdown_fails(repo, monkeypatch, tmp_path):
    tag = plant_sim_slowdown(repo, PLANTED)
    out = tmp_path / "planted.csv"
    code, doc = gate(repo, monkeypatch, "--base", "HEAD", "--head", tag, "--output", str(out))
    assert code == 1 and doc["regressed"]
    assert {r["status"] for r in doc["rows"]} == {"regressed"}
    for r in doc["rows"]:
        want = 1 / PLANTED if r["metric"].endswith("throughput") else PLANTED
        assert r["ratio"] == pytest.approx(want, rel=1e-9) and r["low"] == pytest.approx(want, rel=1e-9)
    rows = read_rows(out)
    assert [r["arm"] for r in rows] == ["base", "head", "head", "base", "base", "head", "head", "base", "base", "head"]
    assert sorted(r["repeat"] for r in rows if r["arm"] == "head") == [0, 1, 2, 3, 4]
    sha, planted = git(repo, "rev-parse", "HEAD"), git(repo, "rev-parse", tag)
    assert {r["git_sha"] for r in rows if r["arm"] == "base"} == {sha}  # each arm's own code said which tree it was
    assert {r["git_sha"] for r in rows if r["arm"] == "head"} == {planted}
    assert {r["label"] for r in rows} == {f"base HEAD ({sha[:7]})", f"head {tag} ({planted[:7]})"}
    show = CliRunner().invoke(app, ["show", str(out), "--format", "json"])
    assert show.exit_code == 0, show.output
    assert sorted(r["knobs"] for r in json.loads(show.stdout)["runs"]) == ["base", "head"]
    same = CliRunner().invoke(app, ["compare", str(out), str(out), "--where", "arm=head", "--format", "json"])
    assert same.exit_code == 0 and json.loads(same.stdout)["configurations_in_common"] == 1
    report = CliRunner().invoke(app, ["report", str(out.with_suffix(".json")), "--out", str(tmp_path / "r.html")])
    html = (tmp_path / "r.html").read_text()
    assert report.exit_code == 0 and "refengine continuous base" in html and "refengine continuous head" in html
    # a sweep of a gate's rows plots one curve per arm (the arm is part of each row's configuration)
    from cbbench.perf.report.plot_data import curves, load_results

    swept = [{**r, "max_num_seqs": n} for n in (64, 128) for r in rows]
    write_csv(tmp_path / "sweep.csv", [{k: None if v != v else v for k, v in r.items()} for r in swept])
    names = [name for name, _ in curves(load_results([tmp_path / "sweep.csv"]), "max_num_seqs")]
    assert len(names) == 2 and "arm=base" in names[0] and "arm=head" in names[1], names
