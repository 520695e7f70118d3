"""The engine-knob options are generated from SchedulerConfig / EngineConfig: every settable field is an option of
`cbbench perf` with the config's type and choices, and the values reach the run as a knob dict."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from cbbench.perf.cli import main as cli
from cbbench.perf.knobs import EngineKnobs, KnobAxis, KnobGrid, engine_knobs, knob, parse_knobs, validate_knobs
from refengine.config import BATCHING_MODES, POLICIES, PREEMPTION_MODES, EngineConfig, SchedulerConfig

NOT_KNOBS = {"model", "device", "dtype", "seed", "scheduler", "stats_log_size"}  # own options / plumbing


def test_engine_knobs_fields_are_the_knobs_by_name_and_type():
    """EngineKnobs spells the configs' fields by hand, for typed access; the configs stay the source of truth."""
    fields = {f.name: f.type for f in dataclasses.fields(EngineKnobs) if f.name != "order"}
    assert list(fields) == [k.name for k in engine_knobs()]
    for k in engine_knobs():
        assert fields[k.name] == f"{k.type.__name__} | None", k.name
    assert EngineKnobs(max_num_seqs=4, policy="priority").given() == {"max_num_seqs": 4, "policy": "priority"}
    given_order = EngineKnobs.of({"block_size": 32, "max_num_seqs": 4})  # (a CPU's default max_num_seqs comes last)
    assert list(given_order.given()) == ["block_size", "max_num_seqs"]
    assert given_order == EngineKnobs(max_num_seqs=4, block_size=32)  # the order names them, it is not a knob


def test_every_config_field_is_a_knob():
    names = {k.name for k in engine_knobs()}
    expected = ({f.name for f in dataclasses.fields(SchedulerConfig)} - {"max_model_len"}) | (
        {f.name for f in dataclasses.fields(EngineConfig)} - NOT_KNOBS
    )
    assert names == expected
    assert knob("policy").choices == POLICIES and knob("preemption_mode").choices == PREEMPTION_MODES
    assert knob("batching").choices == BATCHING_MODES
    assert knob("max_num_seqs").type is int and knob("enable_prefix_caching").type is bool
    assert knob("max_num_seqs").default == SchedulerConfig.max_num_seqs


def test_perf_help_lists_every_knob_except_batching():
    res = CliRunner().invoke(cli.app, ["perf", "--help"], env={"COLUMNS": "300"})
    assert res.exit_code == 0
    for k in engine_knobs():
        assert k.flag in res.output, k.name
        if k.type is bool:
            assert f"--no-{k.flag[2:]}" in res.output
    assert res.output.count("--batching ") == 1  # its own option (all four modes by default), not a second one


def test_knob_values_reach_the_run(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(cli, "run_perf", lambda opts, console: seen.setdefault("opts", opts))
    res = CliRunner().invoke(
        cli.app,
        [
            "perf",
            "--max-num-batched-tokens",
            "256,512",
            "--no-enable-prefix-caching",
            "--policy",
            "priority",
            "--result-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    knobs = seen["opts"].engine.knobs
    assert [(a.name, a.values) for a in knobs.axes] == [
        ("max_num_batched_tokens", (256, 512)),
        ("enable_prefix_caching", (False,)),
        ("policy", ("priority",)),
    ]
    record = knobs.record(exclude=("batching",))
    assert record["max_num_batched_tokens"] == "256,512" and record["enable_prefix_caching"] is False
    assert record["policy"] == "priority" and record["block_size"] is None
    assert [ks.given() for ks in knobs.configurations()] == [
        {"max_num_batched_tokens": n, "enable_prefix_caching": False, "policy": "priority"} for n in (256, 512)
    ]


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("max_num_seqs", "4,x", "max_num_seqs: expected a comma list of integers"),
        ("policy", "fcfs,lifo", "policy must be one of"),
        ("attention_backend", "cuda", "attention_backend must be one of"),
        ("kv_cache_memory_gb", "nan", "kv_cache_memory_gb: expected a comma list of numbers"),
        ("block_size", ",", "block_size: empty list"),
    ],
)
def test_bad_knob_text_names_the_knob(name, text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_knobs({name: text})


def test_validate_knobs_uses_the_configs_own_checks():
    validate_knobs({"max_num_seqs": 4, "attention_backend": "torch"}, batching="static")
    with pytest.raises(ValueError, match="max_num_seqs"):
        validate_knobs({"max_num_seqs": 0})
    with pytest.raises(ValueError, match="priority_preemption"):
        validate_knobs({"priority_preemption": True, "policy": "fcfs"})


def test_serve_takes_the_same_generated_knobs_as_single_values(monkeypatch):
    import refengine.entrypoints.launch as launch

    res = CliRunner().invoke(cli.app, ["serve", "--help"], env={"COLUMNS": "300"})
    assert res.exit_code == 0
    for k in engine_knobs():  # batching too: a server runs one mode
        assert k.flag in res.output, k.name
    seen = {}
    monkeypatch.setattr(launch, "run_server", lambda knobs, **kw: seen.update(knobs=knobs, **kw))
    res = CliRunner().invoke(
        cli.app,
        ["serve", "--max-num-seqs", "8", "--batching", "static", "--no-enable-prefix-caching", "--port", "9001"],
    )
    assert res.exit_code == 0, res.output
    assert {k: v for k, v in seen["knobs"].items() if v is not None} == {
        "model": "tiny-qwen2",
        "device": "cpu",
        "seed": 0,
        "max_num_seqs": 8,
        "batching": "static",
        "enable_prefix_caching": False,
    }
    assert seen["port"] == 9001
    res = CliRunner().invoke(cli.app, ["serve", "--policy", "lifo"])
    assert res.exit_code == 2 and "policy must be one of" in res.stderr
    res = CliRunner().invoke(cli.app, ["serve", "--max-num-seqs", "many"])
    assert res.exit_code == 2


def test_a_grid_keeps_its_axes_in_the_configs_field_order():
    """The runs of a sweep follow the axes' order (the first axis slowest), as the command line gives them: an axis
    added later (the planner's default search, the CPU's max_num_seqs) takes its knob's place, not the last."""
    grid = KnobGrid.parse({"tensor_parallel_size": "1,2"}).with_axis(KnobAxis.of("max_num_seqs", [8, 16]))
    assert [a.name for a in grid.axes] == ["max_num_seqs", "tensor_parallel_size"]
    assert [(k.max_num_seqs, k.tensor_parallel_size) for k in grid.configurations()] == [
        (8, 1),
        (8, 2),
        (16, 1),
        (16, 2),
    ]
    assert grid.with_axis(KnobAxis.of("max_num_seqs", [4])).axis("max_num_seqs") == KnobAxis("max_num_seqs", (4,), "4")
