"""The harness's structure in numbers (docs/architecture.md, "The harness in numbers"): lines per package of
cbbench/perf, `Any` per 1,000 lines, imports inside functions, the package-level import edges among perf's
subpackages, those on a cycle and those that run up perf's layers (PERF_LAYERS), perf's imports of refengine, and
the harness's reads of refengine's private names (imported, read as an attribute, or named for a patch:
`private_engine_names`).

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
from test_import_graph import (  # noqa: E402
    Modules,
    find_circles,
    package_graph,
    perf_layer_of,
    perf_package,
    private_engine_names,
    upward_package_imports,
)


def _unplaced(package: str) -> bool:
    try:
        perf_layer_of(package)
    except AssertionError:
        return True
    return False


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


def counts(root: Path) -> dict:
    modules = Modules(root, ("cbbench",))
    perf = {m: p for m, p in modules.files.items() if perf_package(m)}
    everything = Modules(root, ("refengine", "cbbench"))
    private = private_engine_names(everything, "cbbench")
    engine_imports = [
        (m, target) for m in perf for target, _ in everything.imports_of(m) if target.split(".")[0] == "refengine"
    ]
    lines: Counter[str] = Counter()
    anys: Counter[str] = Counter()
    func_imports = 0
    uses = any_uses({m: modules.trees[m] for m in perf})
    for m, path in perf.items():
        text = path.read_text()
        tree = modules.trees[m]
        lines[perf_package(m) or ""] += len(text.splitlines())
        anys[perf_package(m) or ""] += uses[m]
        func_imports += _function_imports(tree)
    pkg_graph = package_graph(modules)
    edges = {(a, b) for a, targets in pkg_graph.items() for b in targets}
    cycles = find_circles(pkg_graph)
    on_cycle = {(a, b) for c in cycles for a in c for b in pkg_graph[a] if b in c}
    try:
        unplaced = sorted(p for p in pkg_graph if _unplaced(p))
        upward = upward_package_imports(modules) if not unplaced else []
    except AssertionError:
        unplaced, upward = sorted(pkg_graph), []
    total = sum(lines.values())
    bench = lines.get("bench", 0)
    return {
        "lines": dict(sorted(lines.items(), key=lambda kv: -kv[1])),
        "total_lines": total,
        "any_by_package": dict(anys),
        "any": sum(anys.values()),
        "any_per_kloc": round(1000 * sum(anys.values()) / total, 1),
        "any_per_kloc_without_bench": round(1000 * (sum(anys.values()) - anys["bench"]) / max(total - bench, 1), 1),
        "function_imports": func_imports,
        "function_imports_per_kloc": round(1000 * func_imports / total, 1),
        "package_edges": len(edges),
        "edges_on_a_cycle": sorted(on_cycle),
        "cycles": cycles,
        "upward_imports": upward,
        "unplaced_packages": unplaced,
        "private_engine_names": private,
        "engine_imports": len(engine_imports),
        "engine_modules": len({target for _, target in engine_imports}),
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
    if c["unplaced_packages"]:
        print(
            "imports up perf's layers: not counted (packages outside PERF_LAYERS: "
            + ", ".join(c["unplaced_packages"])
            + ")"
        )
    else:
        print(f"imports up perf's layers (PERF_LAYERS): {len(c['upward_imports'])}")
    print(f"imports of refengine in cbbench/perf: {c['engine_imports']}, of {c['engine_modules']} of its modules")
    print(f"reads of refengine's private names in cbbench: {len(c['private_engine_names'])}")
    for p in c["private_engine_names"]:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
