"""The harness's structure in numbers (docs/architecture.md, "The harness in numbers"): lines per package of
cbbench/perf, `Any` per 1,000 lines, imports inside functions, the package-level import edges among perf's
subpackages and those on a cycle, and the harness's imports of refengine's private names.

    python ci/archcounts.py [ROOT]

Read from the source (ast), tests left out, by the import reader refengine/tests/test_import_graph.py uses (every
import counts, a function's and a TYPE_CHECKING block's too), and `Any` by the count perf/tests/test_any_budget.py
holds to its limit (typing.Any however imported, and every alias of it, as many times as it holds it).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "refengine" / "tests"))
sys.path.insert(0, str(HERE / "cbbench" / "perf" / "tests"))
from test_any_budget import ANY_PER_KLOC_LIMIT, any_uses  # noqa: E402
from test_import_graph import Modules, find_circles  # noqa: E402

PERF = "cbbench.perf"


def perf_package(module: str) -> str | None:
    """perf's subpackage (or top-level module) a module belongs to: cbbench.perf.plan.build -> "plan"."""
    parts = module.split(".")
    if parts[:2] != ["cbbench", "perf"] or len(parts) < 3:
        return None
    return parts[2]


def _function_imports(tree: ast.Module) -> int:
    """Imports that stand inside a function (a nested function's counted once)."""
    count = 0
    todo: list[tuple[ast.AST, bool]] = [(tree, False)]
    while todo:
        node, in_function = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)) and in_function:
            count += 1
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        todo += [(child, inside) for child in ast.iter_child_nodes(node)]
    return count


def _private_engine_names(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("refengine"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if any(part.startswith("_") and part != "__init__" for part in (node.module or "").split(".")):
                found.append(node.module or "")
    return found


def counts(root: Path) -> dict:
    modules = Modules(root, ("cbbench",))
    perf = {m: p for m, p in modules.files.items() if perf_package(m)}
    lines: Counter[str] = Counter()
    anys: Counter[str] = Counter()
    func_imports = 0
    private: list[str] = []
    uses = any_uses({m: modules.trees[m] for m in perf})
    for m, path in perf.items():
        text = path.read_text()
        tree = modules.trees[m]
        lines[perf_package(m) or ""] += len(text.splitlines())
        anys[perf_package(m) or ""] += uses[m]
        func_imports += _function_imports(tree)
        private += [f"{m}: {n}" for n in _private_engine_names(tree)]
    graph = modules.graph()
    edges: set[tuple[str, str]] = set()
    for m in perf:
        for target in graph[m]:
            a, b = perf_package(m), perf_package(target)
            if a and b and a != b:
                edges.add((a, b))
    pkg_graph: dict[str, set[str]] = {p: set() for p in lines}
    for a, b in edges:
        pkg_graph[a].add(b)
    cycles = find_circles(pkg_graph)
    on_cycle = {(a, b) for c in cycles for a in c for b in pkg_graph[a] if b in c}
    total = sum(lines.values())
    bench = lines.get("bench", 0)
    return {
        "lines": dict(sorted(lines.items(), key=lambda kv: -kv[1])),
        "any_by_package": dict(anys),
        "total_lines": total,
        "any": sum(anys.values()),
        "any_per_kloc": round(1000 * sum(anys.values()) / total, 1),
        "any_per_kloc_without_bench": round(1000 * (sum(anys.values()) - anys["bench"]) / max(total - bench, 1), 1),
        "function_imports": func_imports,
        "function_imports_per_kloc": round(1000 * func_imports / total, 1),
        "package_edges": len(edges),
        "edges_on_a_cycle": sorted(on_cycle),
        "cycles": cycles,
        "private_engine_names": private,
    }


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else HERE
    c = counts(root)
    print(f"cbbench/perf (tests left out): {c['total_lines']} lines")
    for pkg, n in c["lines"].items():
        print(f"  {pkg:<16} {n:>6}  Any {c['any_by_package'].get(pkg, 0):>3}")
    print(
        f"Any: {c['any']} ({c['any_per_kloc']} per 1,000 lines; limit {ANY_PER_KLOC_LIMIT:g}, "
        f"perf/tests/test_any_budget.py); bench/ left out: {c['any_per_kloc_without_bench']}"
    )
    print(f"imports inside functions: {c['function_imports']} ({c['function_imports_per_kloc']} per 1,000 lines)")
    print(f"package-level import edges among perf's subpackages: {c['package_edges']}")
    print(f"  on a cycle: {len(c['edges_on_a_cycle'])}: " + ", ".join(f"{a}->{b}" for a, b in c["edges_on_a_cycle"]))
    print("  cycles: " + ("; ".join("{" + ", ".join(x) + "}" for x in c["cycles"]) or "none"))
    print(f"imports of refengine's private names: {len(c['private_engine_names'])}")
    for p in c["private_engine_names"]:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
