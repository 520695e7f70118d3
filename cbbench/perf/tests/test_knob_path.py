"""A knob's path from the flag to the scheduler's budget (docs/architecture.md, "A knob's path"): each configuration's
engine arguments are made, and so checked, once, by refengine's `EngineArgs`, as the plan is built; the run's engine
is made of those very arguments (`LLMEngine.from_engine_args`), and its result stores each knob once
(`RunResult.knobs`). No function of the engine or the harness restates a config's default as its own."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from cli_runs import invoke
from tiny_run import TINY_RUN  # perf/tests/tiny_run.py (pytest puts this folder on sys.path)

from cbbench.perf.backends.backend import RunResult
from cbbench.perf.knobs import knob_names
from refengine.config import EngineConfig, SchedulerConfig
from refengine.engine import engine_args as engine_args_module
from refengine.engine.llm_engine import LLMEngine

REPO = Path(__file__).resolve().parents[3]
BUDGETS = (16, 64)

# (file, function, parameter) -> why it still restates the config's default (for a later round, not a new habit)
RESTATED_LEFT = {
    ("refengine/kv_cache/kv_cache_manager.py", "__init__", "num_cpu_blocks"): "kv_cache/ is edited for issue 45 now",
    ("refengine/sim/cost_model.py", "__init__", "tensor_parallel_size"): "a cost model made alone is of one GPU",
    ("refengine/sim/sim_device.py", "create", "tensor_parallel_size"): "a simulated device made alone is one GPU",
    ("refengine/sim/sim_device.py", "SimDevice", "tensor_parallel_size"): "a simulated device made alone is one GPU",
    ("cbbench/perf/cli/bench_cmd.py", "bench_async", "max_num_seqs"): "the CLI is edited for issue 45/46 now",
}


def test_each_configurations_engine_args_are_made_once_and_reach_its_engine(monkeypatch, tmp_path):
    made, used = [], []
    real_post_init, real_from = engine_args_module.EngineArgs.__post_init__, LLMEngine.from_engine_args.__func__

    def counted(self):
        real_post_init(self)
        made.append(self)

    def from_engine_args(cls, args, **parts):
        engine = real_from(cls, args, **parts)
        used.append((args, engine.scheduler.config.max_num_batched_tokens))
        return engine

    monkeypatch.setattr(engine_args_module.EngineArgs, "__post_init__", counted)
    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(from_engine_args))
    budgets = ",".join(map(str, BUDGETS))
    args = [*TINY_RUN, "--peers", "none", "--batching", "continuous", "--max-num-batched-tokens", budgets]
    res = invoke("perf", *args, "--output", str(tmp_path / "r.csv"))
    assert res.exit_code == 0, res.output
    assert len(made) == len(BUDGETS)  # one EngineArgs per configuration, made as the plan was built
    assert [a for a, _ in used] == made and all(a is b for (a, _), b in zip(used, made))  # and no other
    assert [budget for _, budget in used] == list(BUDGETS)  # the flag's values are the scheduler's budgets


def test_a_run_result_stores_each_knob_once():
    fields = {f.name for f in dataclasses.fields(RunResult)}
    knobs = set(knob_names(exclude=("batching",)))  # (batching is a run's own column, not one of its knobs)
    assert fields & knobs == set(), "a knob is stored in RunResult.knobs, not beside it"


def restated_defaults(root: Path) -> list[str]:
    """`file:function:param` for each parameter (or dataclass field) of refengine or cbbench/perf (tests aside)
    named after an EngineConfig / SchedulerConfig field whose default is that field's default, restated."""
    defaults = {}
    for cls in (SchedulerConfig, EngineConfig):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING and f.default is not None:
                defaults.setdefault(f.name, f.default)
    for what in ("model", "device", "dtype", "seed"):  # (what a run is of: each command's and API's own to name)
        defaults.pop(what, None)
    found = []
    for folder in ("refengine", "cbbench/perf"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "tests" in path.relative_to(root).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                pairs: list[tuple[str, str, ast.expr | None]] = []
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    pos = [*a.posonlyargs, *a.args]
                    pairs += [(node.name, p.arg, d) for p, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults)]
                    pairs += [(node.name, p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
                elif isinstance(node, ast.ClassDef) and rel != "refengine/config.py":
                    pairs += [
                        (node.name, n.target.id, n.value)
                        for n in node.body
                        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                    ]
                for owner, name, default in pairs:
                    if (
                        name in defaults
                        and isinstance(default, ast.Constant)
                        and type(default.value) is type(defaults[name])
                        and default.value == defaults[name]
                    ):
                        found.append(f"{rel}:{owner}:{name}")
    return sorted(found)


def test_no_config_default_is_restated():
    found = restated_defaults(REPO)
    assert [f for f in found if tuple(f.split(":")) not in RESTATED_LEFT] == []


def test_the_restated_default_check_can_fail(tmp_path):
    """What issue 48 found: the model runner restating the scheduler's token budget."""
    runner = tmp_path / "refengine" / "worker" / "model_runner.py"
    runner.parent.mkdir(parents=True)
    runner.write_text(
        "class ModelRunner:\n"
        "    def __init__(self, *, max_num_seqs: int, max_num_batched_tokens: int = 8192, block_size=32) -> None:\n"
        "        pass\n"
    )
    opts = tmp_path / "cbbench" / "perf" / "plan" / "options.py"
    opts.parent.mkdir(parents=True)
    opts.write_text("class Opts:\n    enable_prefix_caching: bool = True\n    max_num_seqs: int = 8\n")
    assert restated_defaults(tmp_path) == [
        "cbbench/perf/plan/options.py:Opts:enable_prefix_caching",
        "refengine/worker/model_runner.py:__init__:max_num_batched_tokens",
    ]
