"""Readers never render nothing silently: a results set whose files do not match (renamed, its record folder missing,
a file or a symlink loop where a folder or file should be, a CSV none of whose rows has a run, a corrupt run file, an
extra column) is one line and exit 2 naming the file and the field; a UTF-8 BOM reads as what it hides."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.perf.cli import app

RUN = ["perf", "--device", "sim:h200", "--num-prompts", "4", "--batching", "continuous", "--peers", "none",
       "--max-num-seqs", "2,4", "--repeats", "1", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("result-sets") / "run.csv"
    res = CliRunner().invoke(app, [*RUN, "--output", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _copy(pair: Path, folder: Path, stem: str = "run") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(pair, folder / f"{stem}.csv")
    shutil.copy(pair.with_suffix(".json"), folder / f"{stem}.json")
    shutil.copytree(pair.with_suffix(".records"), folder / f"{stem}.records")
    return folder / f"{stem}.csv"


def _one_line_exit_2(args: list[str], *names: str) -> str:
    res = CliRunner().invoke(app, args)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.output)
    assert "internal error" not in lines[0]
    for n in names:
        assert n in lines[0], lines[0]
    return lines[0]


def _report(json_path: Path, tmp: Path) -> list[str]:
    return ["report", str(json_path), "-o", str(tmp / "r.html")]


def test_a_renamed_pair_names_rows_file(pair: Path, tmp_path: Path) -> None:
    csv = _copy(pair, tmp_path, "renamed")
    _one_line_exit_2(_report(csv.with_suffix(".json"), tmp_path), "renamed.json", "rows_file", "run.csv", "renamed")


@pytest.mark.parametrize("how", ["missing", "a file", "a symlink loop", "empty"])
def test_a_record_folder_that_is_not_there_names_it(pair: Path, tmp_path: Path, how: str) -> None:
    csv = _copy(pair, tmp_path)
    rec = csv.with_suffix(".records")
    shutil.rmtree(rec)
    if how == "a file":
        rec.write_text("")
    elif how == "a symlink loop":
        os.symlink(rec.name, rec)
    elif how == "empty":
        rec.mkdir()
    words = {"missing": "is missing", "a file": "is a file", "a symlink loop": "symlink loop", "empty": "none of"}
    _one_line_exit_2(_report(csv.with_suffix(".json"), tmp_path), str(rec if how != "empty" else csv), words[how])


@pytest.mark.parametrize("command", ["show", "plot", "report", "compare"])
def test_a_symlink_loop_given_to_a_reader_is_one_line(tmp_path: Path, command: str) -> None:
    loop = tmp_path / "loop.csv"
    os.symlink(loop.name, loop)
    args = {"report": [str(loop.with_suffix(".json"))], "compare": [str(loop), str(loop)]}.get(command, [str(loop)])
    if command == "report":
        os.symlink(loop.with_suffix(".json").name, loop.with_suffix(".json"))
    _one_line_exit_2([command, *args], "loop.", "symbolic links")


def test_a_corrupt_run_file_is_named(pair: Path, tmp_path: Path) -> None:
    csv = _copy(pair, tmp_path)
    run_file = sorted((csv.with_suffix(".records") / "runs").glob("run-*.json"))[0]
    run_file.write_text("{not json")
    _one_line_exit_2(_report(csv.with_suffix(".json"), tmp_path), str(run_file), "run file")


def test_an_extra_column_is_named(pair: Path, tmp_path: Path) -> None:
    csv = _copy(pair, tmp_path)
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join([lines[0] + ",my_note"] + [line + ",x" for line in lines[1:]]) + "\n")
    _one_line_exit_2(["show", str(csv)], str(csv), "extra column 'my_note'")


def test_a_utf8_bom_reads(pair: Path, tmp_path: Path) -> None:
    csv = _copy(pair, tmp_path)
    for p in (csv, csv.with_suffix(".json")):
        p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    assert CliRunner().invoke(app, ["show", str(csv)]).exit_code == 0
    assert CliRunner().invoke(app, _report(csv.with_suffix(".json"), tmp_path)).exit_code == 0


@pytest.mark.parametrize("key", ["two words", "clé", ""])
def test_serve_refuses_an_api_key_no_header_can_carry(key: str) -> None:
    _one_line_exit_2(["serve", "--api-key", key, "--port", "1"], "--api-key")
