"""The README states the main command's defaults in words; this check reads them there and compares them with the
plan the documented command line actually builds (the CLI's defaults, through `cbbench perf`'s own parsing), so the
two cannot drift apart: the CPU run's prompts, slots, length caps, model, modes and peers, and the simulated run's
model, prompts, caps, modes and peers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.perf.cli import main as cli
from cbbench.perf.grid.build import build_plan

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5}


def documented_plan(monkeypatch: pytest.MonkeyPatch, *args: str):
    """The plan `cbbench perf ARGS` builds, options parsed as the command line parses them (nothing runs)."""
    got = {}
    monkeypatch.setattr(cli, "run_perf", lambda opts, console: got.setdefault("opts", opts))
    res = CliRunner().invoke(cli.app, ["perf", *args])
    assert res.exit_code == 0, res.output
    return build_plan(got["opts"])


def modes_and_peers(plan) -> tuple[list[str], list[str]]:
    first = [s for s in plan.specs if s.repeat == 0]  # (every repeat runs the same configurations)
    modes = [s.batching for s in first if s.backend == "refengine"]
    return modes, [s.backend for s in first if s.backend != "refengine"]


def test_the_readmes_cpu_defaults_are_the_commands(monkeypatch):
    m = re.search(
        r"through the engine's (\w+) batching modes and (\w+) peers.*?The CPU default is (\d+) prompts, (\d+) slots, "
        r"prompts capped at (\d+) tokens and outputs at (\d+), on `([^`]+)`, (\w+) runs of each configuration".replace(
            " ", r"\s+"
        ),
        README,
        re.S,
    )
    assert m, "the README no longer states the CPU defaults in the sentence this check reads"
    modes, peers, prompts, slots, prompt_cap, output_cap, model, repeats = m.groups()
    plan = documented_plan(monkeypatch, "--workload", "sharegpt")
    got_modes, got_peers = modes_and_peers(plan)
    assert (WORDS[modes], WORDS[peers]) == (len(got_modes), len(got_peers))
    assert int(prompts) == len(plan.workload.requests)
    assert {int(slots)} == {s.knobs.max_num_seqs for s in plan.specs}
    assert (int(prompt_cap), int(output_cap)) == (
        plan.workload.params["max_prompt_len"],
        plan.workload.params["max_output_len"],
    )
    assert model == plan.settings.model
    assert WORDS[repeats] == plan.settings.repeats == max(s.repeat for s in plan.specs) + 1


def test_the_readmes_simulated_defaults_are_the_commands(monkeypatch):
    m = re.search(
        r"Its defaults are a GPU run's: `([^`]+)`, (\d+) ShareGPT prompts, no length caps, the (\w+) modes and a "
        r"simulated HF static `generate`".replace(" ", r"\s+"),  # the README wraps its lines anywhere
        README,
    )
    assert m, "the README no longer states the simulated defaults in the sentence this check reads"
    model, prompts, modes = m.groups()
    plan = documented_plan(monkeypatch, "--device", "sim:h200", "--workload", "sharegpt")
    got_modes, got_peers = modes_and_peers(plan)
    assert model == plan.settings.model and int(prompts) == len(plan.workload.requests)
    assert plan.workload.params["max_prompt_len"] is None and plan.workload.params["max_output_len"] is None
    assert WORDS[modes] == len(got_modes) and got_peers == ["hf-static"]
