"""One step's path, engine.step -> scheduler -> runner -> scheduler -> output processor -> engine (docs/engine.md),
goes down and comes back up, never back: read from the source (ast), not by importing it.

- No callee imports its caller: the scheduler (and its policies) imports neither the engine nor the runner; the
  KV cache manager and block pool import none of the scheduler, engine or runner; the runner imports nothing of the
  engine and, of the scheduler, only the contract (scheduler_output.py); the output side (output processor,
  detokenizer) imports nothing of the scheduler or the runner: it reports what stopped, the engine finishes it.
- No module on the path reaches into another object's privates: every `x._name` (or `getattr(x, "_name")`) reads
  `self` or `cls`. A policy answers with a decision; it does not drive the scheduler's `_schedule_*` passes.
- `SchedulerOutput` is made in one place, the end of `Scheduler.schedule()` (scheduler.py), and nowhere else in
  the engine.
- The step function is chosen once, where the engine is built (sync or async, as vLLM's EngineCore picks `step` or
  `step_with_batch_queue`): `LLMEngine.step` only calls it, and no step function asks which mode the engine runs
  in (a test naming the batch queue, `async_scheduling` or the shut-down flag) or makes a lambda per step.
"""

from __future__ import annotations

import ast
from pathlib import Path

from refengine.tests.test_import_graph import REPO, _imported_names, _sources

# the packages a step passes through (their tests aside)
STEP_PATH = ("refengine.scheduler", "refengine.kv_cache", "refengine.worker", "refengine.sample", "refengine.engine")

# module prefix -> the import prefixes it must not use (a callee importing its caller), and the exceptions
NO_IMPORT_BACK: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "refengine.scheduler": (("refengine.engine", "refengine.worker", "refengine.entrypoints", "refengine.sim"), ()),
    "refengine.kv_cache.kv_cache_manager": (("refengine.scheduler", "refengine.engine", "refengine.worker"), ()),
    "refengine.kv_cache.block_pool": (("refengine.scheduler", "refengine.engine", "refengine.worker"), ()),
    "refengine.worker.model_runner": (
        ("refengine.engine", "refengine.entrypoints", "refengine.scheduler"),
        ("refengine.scheduler.scheduler_output",),
    ),
    "refengine.worker.input_batch": (("refengine.engine", "refengine.scheduler"), ()),
    "refengine.worker.runner_states": (
        ("refengine.engine", "refengine.scheduler"),
        ("refengine.scheduler.scheduler_output",),
    ),
    "refengine.engine.output_processor": (("refengine.scheduler", "refengine.worker"), ()),
    "refengine.engine.detokenizer": (("refengine.scheduler", "refengine.worker"), ()),
}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_back(root: Path, rules: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> dict[str, list[str]]:
    """module -> the imports (lazy ones included) its rule forbids."""
    found = {}
    for name, path in _sources(root, "refengine").items():
        for prefix, (banned, allowed) in rules.items():
            if not _under(name, prefix):
                continue
            imported = _imported_names(ast.parse(path.read_text()), name, is_package=path.name == "__init__.py")
            hits = sorted(
                {n for n in imported if any(_under(n, b) for b in banned) and not any(_under(n, a) for a in allowed)}
            )
            if hits:
                found[name] = hits
    return found


def private_reaches(root: Path, packages: tuple[str, ...]) -> list[str]:
    """`file:line: expr` for each read of another object's private attribute in the packages' modules (a class
    naming its own members, `LLMEngine._step_sync` inside LLMEngine, reads its own)."""
    found = []
    for name, path in _sources(root, "refengine").items():
        if not any(_under(name, p) for p in packages):
            continue
        tree = ast.parse(path.read_text())
        own = {
            id(node)
            for cls in ast.walk(tree)
            if isinstance(cls, ast.ClassDef)
            for node in ast.walk(cls)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == cls.name
        }
        for node in ast.walk(tree):
            attr = None
            if isinstance(node, ast.Attribute):
                owner_is_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                attr = None if owner_is_self or id(node) in own else node.attr
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))  # its own
            ):
                attr = node.args[1].value
            if attr is not None and attr.startswith("_") and not attr.startswith("__"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def scheduler_output_makers(root: Path) -> list[str]:
    """The modules of refengine (tests aside) that call SchedulerOutput(...)."""
    makers = []
    for name, path in _sources(root, "refengine").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SchedulerOutput":
                makers.append(name)
    return makers


# what a step function would test to learn the engine's mode (sync / async, or shut down), chosen in __init__ instead
MODE_NAMES = ("batch_queue", "async_scheduling", "_shut_down")


def _is_step_function(name: str) -> bool:
    return name == "step" or name.startswith("_step") or name == "_process_step"


def step_mode_branches(engine_source: str) -> list[str]:
    """`line: code` for each lambda, and each branch (if, conditional expression, boolean test) on the engine's mode,
    in LLMEngine's step functions; and for a `step` that does more than call the step function chosen once."""
    (engine,) = [n for n in ast.parse(engine_source).body if isinstance(n, ast.ClassDef) and n.name == "LLMEngine"]
    found = []
    for fn in engine.body:
        if not (isinstance(fn, ast.FunctionDef) and _is_step_function(fn.name)):
            continue
        body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) else fn.body  # (its docstring)
        if fn.name == "step" and [ast.unparse(n) for n in body] != ["return self._step(self)"]:
            found.append(f"{fn.lineno}: step does more than call self._step(self)")
        for node in ast.walk(fn):
            tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
            tests += node.values if isinstance(node, ast.BoolOp) else []
            on_mode = [t for t in tests if any(m in ast.unparse(t) for m in MODE_NAMES)]
            if isinstance(node, ast.Lambda) or on_mode:
                found.append(f"{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_no_callee_imports_its_caller() -> None:
    assert imports_back(REPO, NO_IMPORT_BACK) == {}


def test_the_step_path_reads_no_other_objects_privates() -> None:
    assert private_reaches(REPO, STEP_PATH) == []


def test_scheduler_output_is_made_once_at_the_end_of_schedule() -> None:
    assert scheduler_output_makers(REPO) == ["refengine.scheduler.scheduler"]
    tree = ast.parse((REPO / "refengine" / "scheduler" / "scheduler.py").read_text())
    (scheduler,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler"]
    makers = [
        f.name
        for f in scheduler.body
        if isinstance(f, ast.FunctionDef)
        for n in ast.walk(f)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "SchedulerOutput"
    ]
    assert makers == ["_make_output"]
    (schedule,) = [f for f in scheduler.body if isinstance(f, ast.FunctionDef) and f.name == "schedule"]
    assert isinstance(schedule.body[-1], ast.Return) and "_make_output" in ast.unparse(schedule.body[-1])


def test_the_step_function_is_chosen_once() -> None:
    assert step_mode_branches((REPO / "refengine" / "engine" / "llm_engine.py").read_text()) == []


def test_the_step_check_can_fail() -> None:
    """What issue 48 found: step() choosing sync or async inline, with a lambda."""
    planted = (
        "class LLMEngine:\n"
        "    def step(self):\n"
        "        if self._shut_down:\n"
        "            raise RuntimeError\n"
        "        return self._step(self)\n"
        "    def _step_sync(self):\n"
        "        if self.batch_queue is None:\n"
        "            return self._process_step(out, lambda: self.model_runner.execute_model(out))\n"
        "        return [] if not self.scheduler.has_unfinished_requests() else self.batch_queue.pop()\n"
        "    def add_request(self, rid):\n"
        "        return rid if self.batch_queue is None else (lambda: rid)()\n"
    )
    assert step_mode_branches(planted) == [
        "2: step does more than call self._step(self)",
        "3: if self._shut_down:",
        "7: if self.batch_queue is None:",
        "8: lambda: self.model_runner.execute_model(out)",
    ]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """What the reviewer found: a policy driving the scheduler's private passes, an output processor holding the
    scheduler, a SchedulerOutput filled outside schedule()."""
    root = _tree(
        tmp_path,
        {
            "refengine/__init__.py": "",
            "refengine/scheduler/__init__.py": "",
            "refengine/scheduler/batching.py": (
                "class Mode:\n    def step(self, sched, out):\n        sched._schedule_running(out)\n"
                "        return getattr(sched, '_budget')\n"
                "    def own(self):\n        return Mode._plan, Other._plan\n"
            ),
            "refengine/scheduler/scheduler.py": "def f(self):\n    return self._budget + self.kv._free\n",
            "refengine/engine/__init__.py": "",
            "refengine/engine/output_processor.py": (
                "def fail(req):\n    from refengine.scheduler.scheduler import Scheduler\n    return Scheduler\n"
            ),
            "refengine/worker/__init__.py": "",
            "refengine/worker/model_runner.py": (
                "from refengine.scheduler.scheduler_output import SchedulerOutput\nimport refengine.engine.llm_engine\n"
                "out = SchedulerOutput()\n"
            ),
        },
    )
    assert imports_back(root, NO_IMPORT_BACK) == {
        "refengine.engine.output_processor": [
            "refengine.scheduler.scheduler",
            "refengine.scheduler.scheduler.Scheduler",
        ],
        "refengine.worker.model_runner": ["refengine.engine.llm_engine"],
    }
    assert private_reaches(root, STEP_PATH) == [
        "refengine/scheduler/batching.py:3: sched._schedule_running",
        "refengine/scheduler/batching.py:4: getattr(sched, '_budget')",
        "refengine/scheduler/batching.py:6: Other._plan",
        "refengine/scheduler/scheduler.py:2: self.kv._free",
    ]
    assert scheduler_output_makers(root) == ["refengine.worker.model_runner"]
