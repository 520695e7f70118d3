"""The import structure, read from the source (ast), not by importing it:

- refengine's modules import one another without a circle: the imports a module runs as it loads (those at module
  level, `if TYPE_CHECKING:` blocks included, since a type checker follows them too) form an acyclic graph. An
  import inside a function runs after every module has loaded and is left out; it is how a module defers a heavy
  dependency (torch, the model loader), not a way round a circle;
- the engine does not import the harness: refengine's own code (its tests aside) imports neither perf, workloads
  nor conformance, anywhere; kernels (the engine's kernel library) imports none of refengine, perf, workloads or
  conformance;
- the scheduler -> runner contract (refengine/scheduler/scheduler_output.py) asks the KV cache manager for block ids and does
  not import the block pool.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS = ("cbbench.perf", "cbbench.workloads", "conformance")  # import names (setup.py)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(root: Path, package: str) -> dict[str, Path]:
    """module name -> file, for the package's non-test modules."""
    return {
        _module_name(p, root): p
        for p in sorted((root / package).rglob("*.py"))
        if "tests" not in p.relative_to(root).parts
    }


def _imported_names(tree: ast.Module, module: str, *, load_time_only: bool) -> list[str]:
    """Every dotted name the module imports (`from a import b` gives a and a.b); with `load_time_only`, only the
    imports at module level and in module-level `if` (TYPE_CHECKING) and `try` blocks."""
    if load_time_only:
        nodes: list[ast.stmt] = []
        for stmt in tree.body:
            nodes.append(stmt)
            if isinstance(stmt, ast.If):
                nodes += stmt.body + stmt.orelse
            elif isinstance(stmt, ast.Try):
                nodes += stmt.body + [s for h in stmt.handlers for s in h.body] + stmt.orelse + stmt.finalbody
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                pkg = module.rsplit(".", node.level)[0]
                base = f"{pkg}.{base}" if base else pkg
            names += [base, *(f"{base}.{a.name}" for a in node.names)]
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports as it loads."""
    mods = _sources(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        imported = _imported_names(ast.parse(path.read_text()), name, load_time_only=True)
        graph[name] = {n for n in imported if n in mods and n != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def forbidden_imports(root: Path, package: str, banned: tuple[str, ...]) -> dict[str, list[str]]:
    """module -> the banned packages (dotted import names) it imports anywhere (lazy imports included)."""
    found = {}
    for name, path in _sources(root, package).items():
        imported = _imported_names(ast.parse(path.read_text()), name, load_time_only=False)
        if hits := sorted({b for b in banned for n in imported if n == b or n.startswith(b + ".")}):
            found[name] = hits
    return found


def test_refengine_imports_form_no_circle() -> None:
    graph = import_graph(REPO, "refengine")
    assert (
        "refengine.scheduler.scheduler" in graph
        and "refengine.scheduler.batching" in graph["refengine.scheduler.scheduler"]
    )
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_engine_does_not_import_the_harness() -> None:
    assert forbidden_imports(REPO, "refengine", HARNESS) == {}


def test_kernels_import_neither_the_engine_nor_the_harness() -> None:
    assert forbidden_imports(REPO, "kernels", ("refengine", *HARNESS)) == {}


def test_the_scheduler_output_asks_the_kv_cache_manager_not_the_block_pool() -> None:
    path = REPO / "refengine" / "scheduler" / "scheduler_output.py"
    names = _imported_names(ast.parse(path.read_text()), "refengine.scheduler.scheduler_output", load_time_only=False)
    assert "refengine.kv_cache.kv_cache_manager" in names and not [
        n for n in names if n.startswith("refengine.kv_cache.block_pool")
    ]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A circle through a TYPE_CHECKING import is found; a function-level one is not a circle; a lazy import of the
    harness is still an import of the harness."""
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import B\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n",
            "pkg/c.py": "def f():\n    from pkg.b import B\n",
            "pkg/d.py": "import pkg.a\nfrom . import c\n",
            "pkg/e.py": "def g():\n    import cbbench.perf.cli\n",
        },
    )
    assert find_cycle(import_graph(root, "pkg")) is None
    (root / "pkg" / "c.py").write_text("from pkg.a import A\n")
    assert find_cycle(import_graph(root, "pkg")) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert import_graph(root, "pkg")["pkg.d"] == {"pkg", "pkg.a", "pkg.c"}  # (`from . import c` runs pkg too)
    assert forbidden_imports(root, "pkg", HARNESS) == {"pkg.e": ["cbbench.perf"]}
