"""The committed peer predictions (perf/sim/data/peer_predictions.csv), their reader, perf/sim/peers.py, and the
peers' errors table (benchmarks/peer_errors.py).

The peers themselves never run here (ci/peer_sims.sh does, by hand, in their own venvs): these tests check what the
script committed and what the project reads from it, and that the peers' venvs stay out of the project.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks import peer_errors
from cbbench.perf.sim import peers
from cbbench.perf.sim.peers import PINNED_VERSIONS, PeerPrediction, load_peer_predictions

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "ci" / "peer_sims.sh"


def _ci_module(name: str) -> ModuleType:
    """A module of ci/peer_sims/ (not a package: the runners load it by path from their own venvs)."""
    sys.path.insert(0, str(REPO / "ci" / "peer_sims"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "ci" / "peer_sims" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "ci" / "peer_sims"))


def _measured() -> list[dict[str, str]]:
    with peers.MEASURED_RUNS.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def committed() -> dict[tuple[str, str], PeerPrediction]:
    return load_peer_predictions()


def test_every_id_is_a_measured_row(committed: dict[tuple[str, str], PeerPrediction]) -> None:
    ids = {row["id"] for row in _measured()}
    assert {row_id for row_id, _ in committed} <= ids


def test_every_measured_row_has_an_answer_from_each_peer(committed: dict[tuple[str, str], PeerPrediction]) -> None:
    """The script writes a row for each (measured row, peer), predicted or not, so a missing answer is a bug."""
    expected = {(row["id"], sim) for row in _measured() for sim in PINNED_VERSIONS}
    assert set(committed) == expected


def test_versions_are_the_pinned_ones(committed: dict[tuple[str, str], PeerPrediction]) -> None:
    assert {(p.simulator, p.simulator_version) for p in committed.values()} == set(PINNED_VERSIONS.items())
    script = SCRIPT.read_text()
    for sim, version in PINNED_VERSIONS.items():
        assert f"peer_venv .venv-{sim} {sim} {version}" in script
        assert f'PINNED = "{version}"' in (REPO / "ci" / "peer_sims" / f"{sim}_rows.py").read_text()


def test_ok_rows_have_positive_finite_latencies(committed: dict[tuple[str, str], PeerPrediction]) -> None:
    ok = [p for p in committed.values() if p.status == "ok"]
    assert ok, "no peer predicted any row"
    for p in ok:
        assert p.ttft_ms is not None and p.tpot_ms is not None
        assert math.isfinite(p.ttft_ms) and p.ttft_ms > 0 and math.isfinite(p.tpot_ms) and p.tpot_ms > 0, p.id
    for p in committed.values():
        assert p.status == "ok" or p.error, f"{p.id} {p.simulator}: {p.status} without a reason"


def test_columns_match_the_runners_side() -> None:
    assert tuple(_ci_module("common").COLUMNS) == peers.COLUMNS


def _write(tmp_path: Path, rows: list[list[str]], header: tuple[str, ...] = peers.COLUMNS) -> Path:
    path = tmp_path / "peers.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


GOOD = ["row-a", "aiconfigurator", "0.12.0", "ok", "100.0", "10.0", "", "agg", ""]


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({3: "fine"}, "status"),
        ({4: "-5"}, "ttft_ms"),
        ({5: "nan"}, "tpot_ms"),
        ({5: "fast"}, "tpot_ms"),
        ({5: ""}, "ttft_ms / tpot_ms"),  # an ok row without its TPOT
        ({3: "unsupported", 4: "", 5: ""}, "error"),  # not predicted, and no reason given
        ({3: "error", 8: "boom"}, "ttft_ms"),  # latencies on a row that is not ok
    ],
)
def test_reader_rejects_a_malformed_row_naming_it(tmp_path: Path, change: dict[int, str], names: str) -> None:
    bad = list(GOOD)
    bad[0] = "row-b"
    for i, value in change.items():
        bad[i] = value
    path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(ValueError, match=rf"peers\.csv:3: row 'row-b': {names}"):
        load_peer_predictions(path)


def test_reader_rejects_short_rows_duplicates_and_a_wrong_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r":2: row 'row-a': 9 fields"):
        load_peer_predictions(_write(tmp_path, [GOOD[:7]]))
    with pytest.raises(ValueError, match=r":3: row 'row-a': a second aiconfigurator"):
        load_peer_predictions(_write(tmp_path, [GOOD, GOOD]))
    with pytest.raises(ValueError, match="header"):
        load_peer_predictions(_write(tmp_path, [GOOD], header=peers.COLUMNS[:-1]))


def test_reader_reads_a_good_file(tmp_path: Path) -> None:
    unsupported = ["row-a", "vidur", "0.0.26", "unsupported", "", "", "", "not run", "no profile"]
    got = load_peer_predictions(_write(tmp_path, [GOOD, unsupported]))
    assert got[("row-a", "aiconfigurator")].ttft_ms == 100.0 and got[("row-a", "aiconfigurator")].tpot_ms == 10.0
    assert got[("row-a", "vidur")].status == "unsupported" and got[("row-a", "vidur")].ttft_ms is None


def test_summary_medians_are_of_the_relative_errors(tmp_path: Path) -> None:
    """TTFT off by +10%, -30%, +100% -> median |error| 30.0%, median signed +10.0%; TPOT exact -> 0.0%."""
    rows = _measured()[:3]
    factors = (1.1, 0.7, 2.0)  # means (46.7%, +26.7%) differ from the medians, so a mean cannot pass
    lines = [
        [r["id"], "aiconfigurator", "0.12.0", "ok", f"{float(r['ttft_ms']) * k}", r["tpot_ms"], "", "x", ""]
        for r, k in zip(rows, factors)
    ]
    lines.append([rows[0]["id"], "vidur", "0.0.26", "unsupported", "", "", "", "not run", "no profile"])
    table = peer_errors.summary(load_peer_predictions(_write(tmp_path, lines)), {r["id"]: r for r in _measured()})
    assert "| aiconfigurator | all rows it predicts | 3 | 30.0% | +10.0% | 0.0% | +0.0% |" in table
    assert "| vidur | none of 1 predicted | 0 | - | - | - | - |" in table


def test_cli_refuses_a_bad_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _write(tmp_path, [[*GOOD[:3], "fine", *GOOD[4:]]])
    assert peer_errors.main(["--summary", "--path", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --path:") and "status" in err


def test_merge_orders_by_measured_row_and_refuses_unknown_ids(tmp_path: Path) -> None:
    merge = _ci_module("merge")
    first, second = (r["id"] for r in _measured()[:2])
    part = tmp_path / "part.csv"
    _ci_module("common").write_part(part, [dict(zip(peers.COLUMNS, [x, *GOOD[1:]])) for x in (second, first)])
    assert [r["id"] for r in merge.merge([part])] == [first, second]
    _ci_module("common").write_part(part, [dict(zip(peers.COLUMNS, GOOD))])
    with pytest.raises(SystemExit, match="not a row of measured_runs.csv"):
        merge.merge([part])


def test_the_peers_venvs_are_not_the_projects() -> None:
    """Every venv the script makes is git-ignored, and neither peer is in what the project's venv installs."""
    venvs = sorted(set(re.findall(r"peer_venv (\.venv-[\w-]+) ", SCRIPT.read_text())))
    assert venvs == [".venv-aiconfigurator", ".venv-vidur"]
    res = subprocess.run(["git", "check-ignore", *[f"{v}/bin/python" for v in venvs]], cwd=REPO, capture_output=True)
    assert res.returncode == 0 and len(res.stdout.splitlines()) == len(venvs), res.stdout
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installed = " ".join(project["dependencies"] + project["optional-dependencies"]["test"]).lower()  # ci/setup.sh's
    assert "vidur" not in installed and "aiconfigurator" not in installed
