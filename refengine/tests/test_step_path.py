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
    """`file:line: expr` for each read of another object's private attribute in the packages' modules."""
    found = []
    for name, path in _sources(root, "refengine").items():
        if not any(_under(name, p) for p in packages):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            attr = None
            if isinstance(node, ast.Attribute):
                owner_is_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                attr = None if owner_is_self else node.attr
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
        "refengine/scheduler/scheduler.py:2: self.kv._free",
    ]
    assert scheduler_output_makers(root) == ["refengine.worker.model_runner"]
