"""The import structure, read from the source (ast), not by importing it. Every import counts, wherever it stands:
at module level, under `if TYPE_CHECKING:` (a type checker follows it) and inside a function (it runs on the first
call, and ties the two modules as surely as one at the top: deferring an import hides a circle, it does not open it).

- No import circle: the modules of refengine and of cbbench (cbbench.kernels, cbbench.perf, cbbench.workloads) and
  the imports between them form an acyclic graph;
- refengine's layers (`LAYERS`, docs/architecture.md): a module imports its own layer and the layers below it, never
  one above. What runs a step goes down and its answer comes back up as a return value, not as an import;
- the engine does not import the harness: refengine's own code (its tests aside) imports neither cbbench.perf,
  cbbench.workloads nor conformance; cbbench.kernels (the engine's kernel library) imports none of refengine,
  cbbench.perf, cbbench.workloads or conformance; and neither refengine nor cbbench imports benchmarks/, the
  project's measurements of itself, which the wheel leaves out;
- the scheduler -> runner contract (refengine/scheduler/scheduler_output.py) asks the KV cache manager for block
  ids and does not import the block pool;
- perf's packages in layers (`PERF_LAYERS`, docs/architecture.md): read as packages (cbbench/perf's subpackages, and
  each of its top-level modules as a package of its own), perf's imports form no circle, and none runs up the
  layers;
- an import inside a function of perf is of a heavy dependency only (`LAZY_IMPORTS`, each with its reason), one
  its module does not bring in already as it is imported, or a command's work (`COMMAND_LINE`), and one of a module
  of refengine or cbbench says why in a comment; every other import stands at its module's top;
- nothing of cbbench reads a private (underscore) name of refengine (`private_engine_names`).

How an import is read (`imports_of`): `import a.b` names the module a.b; `from a import x` names a.x when that is a
module which a's __init__.py does not bind, else a itself (a face handing x on, or the module that defines x); a
relative import is resolved against the importing module's package. The packages above a module, which Python runs
before it, are not counted: a face binds its names lazily (cbbench/_faces.py, refengine/__init__.py), so running it
imports nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("refengine", "cbbench")
HARNESS = ("cbbench.perf", "cbbench.workloads", "conformance")  # import names
SELF_MEASUREMENT = "benchmarks"  # the project's measurements of itself, beside the product (not shipped)

# refengine's layers, lowest first, by the name under refengine/ (a folder, or a module of the package's top).
# A module may import its own layer and those below it. `sim` is a device, as the worker is (refengine/worker/
# device.py's LocalDevice beside refengine/sim/sim_device.py's SimDevice): it builds on the worker's seams (the
# Device protocols, EngineParts, the batch queue's bound), and the worker knows nothing of it; the engine chooses
# one of the two where it is built (refengine/engine/platform.py). refengine/__init__.py, the package's face, stands
# above every layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("checks", "limits", "clock", "sampling_params", "request", "outputs", "config", "tokenizer"),  # leaf modules
    ("kv_cache", "sample", "layers"),
    ("models",),
    ("scheduler",),
    ("worker",),
    ("sim",),
    ("engine",),
    ("entrypoints",),
)


# perf's layers, lowest first, by the name under cbbench/perf/: a subpackage, or a top-level module standing as a
# package of its own. A module may import its own layer and those below it, and the packages import one another
# without a circle (a cycle inside one layer is a circle all the same).
PERF = "cbbench.perf"
PERF_LAYERS: tuple[tuple[str, ...], ...] = (
    ("exceptions", "json_values", "records", "stats", "knobs", "metrics", "client_lag", "steady_state"),  # leaf modules
    ("results",),  # the results files: schema, rows, writer, compare, the gate's tolerances, the capacity frontier
    ("report", "sim", "gate"),  # what reads them: tables and reports, the simulator's validation, the gate's verdict
    ("plan",),  # what a run is: the typed options, load points, --like, --executor, the run's spec
    ("backends",),  # what runs one
    ("grid", "bench"),  # a plan's runs, built into a RunPlan and executed; the micro-benchmark commands
    ("sweep",),  # cbbench perf
    ("capacity",),  # cbbench plan
    ("cli",),  # the command line
)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(root: Path, package: str) -> dict[str, Path]:
    """module name -> file, for the package's non-test modules (`package` dotted: "cbbench.kernels" is
    root/cbbench/kernels/)."""
    return {
        _module_name(p, root): p
        for p in sorted((root / package.replace(".", "/")).rglob("*.py"))
        if "tests" not in p.relative_to(root).parts
    }


def _base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The dotted module a `from ... import` reads from (a relative one resolved against the importing module)."""
    if not node.level:
        return node.module or ""
    pkg = module if is_package else module.rpartition(".")[0]
    if node.level > 1:
        pkg = pkg.rsplit(".", node.level - 1)[0]
    return f"{pkg}.{node.module}" if node.module else pkg


def _imported_names(tree: ast.Module, module: str, *, is_package: bool = False) -> list[str]:
    """Every dotted name the module imports, anywhere in it (`from a import b` gives a and a.b)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, module, is_package)
            names += [base, *(f"{base}.{a.name}" for a in node.names)]
    return names


def _bound_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top (in module-level `if` and `try` blocks too): what `from it import x`
    finds before it looks for a submodule x."""
    stmts: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        stmt = todo.pop()
        stmts.append(stmt)
        if isinstance(stmt, ast.If):
            todo += stmt.body + stmt.orelse
        elif isinstance(stmt, ast.Try):
            todo += stmt.body + [s for h in stmt.handlers for s in h.body] + stmt.orelse + stmt.finalbody
    bound: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, ast.Import):
            bound |= {a.asname or a.name.partition(".")[0] for a in stmt.names}
        elif isinstance(stmt, ast.ImportFrom):
            bound |= {a.asname or a.name for a in stmt.names}
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return bound


class Modules:
    """The modules of some packages under `root`: their files, parsed once, and what each import of theirs names."""

    def __init__(self, root: Path, packages: tuple[str, ...] = PACKAGES) -> None:
        self.files = {name: path for p in packages for name, path in _sources(root, p).items()}
        self.trees = {name: ast.parse(path.read_text(), str(path)) for name, path in self.files.items()}
        self._bound: dict[str, set[str]] = {}

    def is_package(self, name: str) -> bool:
        return self.files[name].name == "__init__.py"

    def binds(self, name: str, attr: str) -> bool:
        if name not in self._bound:
            self._bound[name] = _bound_names(self.trees[name])
        return attr in self._bound[name]

    def imports_of(self, name: str) -> list[tuple[str, int]]:
        """(module imported, line) for each import of module `name` that names one of these modules."""
        found = []
        for node in ast.walk(self.trees[name]):
            if isinstance(node, ast.Import):
                found += [(a.name, node.lineno) for a in node.names if a.name in self.files]
            elif isinstance(node, ast.ImportFrom):
                base = _base(node, name, self.is_package(name))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in self.files and not (base in self.files and self.binds(base, a.name)):
                        found.append((sub, node.lineno))
                    elif base in self.files:
                        found.append((base, node.lineno))
        return [(target, line) for target, line in found if target != name]

    def graph(self) -> dict[str, set[str]]:
        """module -> the modules it imports."""
        return {name: {target for target, _ in self.imports_of(name)} for name in self.files}


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    return Modules(root, packages).graph()


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as its modules sorted (the strongly connected components of more than one module, or
    of one that imports itself; Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            nxt = next(successors, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    circles.append(sorted(component))
    return circles


def describe(circle: list[str], graph: dict[str, set[str]]) -> str:
    """A circle as its imports: `a -> b, b -> a`."""
    members = set(circle)
    return ", ".join(f"{a} -> {b}" for a in circle for b in sorted(graph[a] & members))


def layer_of(module: str) -> int | None:
    """The rank of a refengine module's layer in LAYERS; None for the package's face (above them all) and for a
    module of another package."""
    parts = module.split(".")
    if parts[0] != "refengine" or len(parts) == 1:
        return None
    for rank, names in enumerate(LAYERS):
        if parts[1] in names:
            return rank
    raise AssertionError(f"{module}: refengine/{parts[1]} stands in no layer of LAYERS; place it there")


def upward_imports(modules: Modules) -> list[str]:
    """`module:line -> imported` for each import of a refengine module from a higher layer."""
    found = []
    for name in modules.files:
        rank = layer_of(name)
        if rank is None:
            continue
        for target, line in modules.imports_of(name):
            above = layer_of(target)
            if above is not None and above > rank:
                found.append(f"{name}:{line} -> {target}")
    return sorted(found)


def perf_package(module: str) -> str | None:
    """The package of perf a module belongs to: cbbench.perf.plan.options -> "plan", cbbench.perf.sweep -> "sweep";
    None for perf's face and for a module outside perf."""
    parts = module.split(".")
    if parts[:2] != PERF.split(".") or len(parts) < 3:
        return None
    return parts[2]


def package_imports(modules: Modules) -> dict[tuple[str, str], list[str]]:
    """(package, a package of perf it imports) -> the imports that make the edge, each `module:line -> imported`."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name in modules.files:
        if (a := perf_package(name)) is None:
            continue
        for target, line in modules.imports_of(name):
            if (b := perf_package(target)) is not None and b != a:
                edges.setdefault((a, b), []).append(f"{name}:{line} -> {target}")
    return edges


def package_graph(modules: Modules) -> dict[str, set[str]]:
    """perf's packages -> the packages of perf each imports."""
    graph: dict[str, set[str]] = {p: set() for name in modules.files if (p := perf_package(name)) is not None}
    for a, b in package_imports(modules):
        graph[a].add(b)
    return graph


def perf_layer_of(package: str) -> int:
    """The rank of a package of perf in PERF_LAYERS."""
    for rank, names in enumerate(PERF_LAYERS):
        if package in names:
            return rank
    raise AssertionError(f"cbbench/perf/{package} stands in no layer of PERF_LAYERS; place it there")


def upward_package_imports(modules: Modules) -> list[str]:
    """`module:line -> imported` for each import of a package of perf from a lower layer."""
    return sorted(
        found
        for (a, b), imports in package_imports(modules).items()
        if perf_layer_of(b) > perf_layer_of(a)
        for found in imports
    )


# The imports a function of perf may make instead of its module's top: of a package heavy to import (each with why),
# or of a module of refengine or cbbench that imports one of them as it is imported (its top, its module-level blocks,
# its packages' faces; not what it imports inside a function or for a type checker). Every other import stands at
# the top of its module: the layers above leave no circle to open by deferring one (perf/tests/test_cli_fast.py holds
# `--help`, compare and show to importing none of the heavy ones).
LAZY_IMPORTS: dict[str, str] = {
    "torch": "2-7 s; planning, reading results and --help never load it (the commands that run the engine do)",
    "numpy": "0.1-0.4 s; --help, compare and show never load it (test_cli_fast.py)",
    "pandas": "1-2 s; only the plots, the kernel benchmark's CSV and a frame read load it",
    "pyarrow": "0.6 s; only where a run's Parquet records are written or read",
    "matplotlib": "0.5-3 s with pyplot; only plot, timeline and the HTML report's figures draw",
    "transformers": "2-3 s; only the Hugging Face peers (hf-static, hf-cb) and their profiles",
    "triton": "0.5 s and a GPU toolchain; only the attention kernel benchmark",
    "ray": "an optional extra (pip install 'cbbench[ray]'): only --executor ray",
    "typer._coercion": "typer's own coercion, which imports pydantic: only a bool from an environment variable",
    "aiohttp": "0.2 s; the HTTP client's, only a server backend (--backend openai) runs it",
    "fastapi": "0.9 s; only `cbbench serve`",
}


# The one other reason: the command line (cbbench/perf/cli/) builds every command for `--help` and runs at most one,
# so a command imports the module of perf that does its work when it runs. With each command's work imported at the
# top, `cbbench --help` imports 463 modules, not 380, in a third more CPU time (docs/architecture.md, "The harness in
# numbers"); perf/tests/test_cli_fast.py holds it to loading none of LAZY_IMPORTS.
COMMAND_LINE = "cbbench.perf.cli"


def _runs_at_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs as it is imported: at its top, in its module-level `if`, `try` and `with` blocks and
    class bodies; not inside a function, nor under `if TYPE_CHECKING:` (a type checker reads that, nothing runs it)."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found.append(stmt)
        elif isinstance(stmt, ast.If):
            checking = isinstance(stmt.test, (ast.Name, ast.Attribute)) and "TYPE_CHECKING" in ast.unparse(stmt.test)
            todo += stmt.orelse if checking else stmt.body + stmt.orelse
        elif isinstance(stmt, ast.Try):
            todo += stmt.body + [s for h in stmt.handlers for s in h.body] + stmt.orelse + stmt.finalbody
        elif isinstance(stmt, (ast.With, ast.ClassDef)):
            todo += stmt.body
    return found


def _in_functions(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports that stand inside a function (a nested function's counted once)."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[tuple[ast.AST, bool]] = [(tree, False)]
    while todo:
        node, inside = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)) and inside:
            found.append(node)
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        todo += [(child, inside) for child in ast.iter_child_nodes(node)]
    return found


def _targets(modules: Modules, name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """What one import statement names: a module of `modules` as `imports_of` reads it, else the dotted name."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _base(node, name, modules.is_package(name))
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        ours = sub in modules.files and not (base in modules.files and modules.binds(base, a.name))
        out.append(sub if ours else base)
    return out


def _lazy_reason(dotted: str) -> str | None:
    """The LAZY_IMPORTS entry a dotted name falls under (`torch.nn` under `torch`), if any."""
    return next((k for k in LAZY_IMPORTS if dotted == k or dotted.startswith(k + ".")), None)


def heavy_at_import(modules: Modules, target: str, seen: dict[str, set[str]] | None = None) -> set[str]:
    """The LAZY_IMPORTS entries that importing `target` brings in: its own name's, or for a module of `modules`
    everything it and the packages above it import as they are imported, followed through the modules it imports."""
    seen = {} if seen is None else seen
    if target not in modules.files:
        return {reason} if (reason := _lazy_reason(target)) else set()
    if target in seen:
        return seen[target]
    seen[target] = set()  # (a circle is the circle test's to report)
    parts = target.split(".")
    heavy: set[str] = set()
    for module in (".".join(parts[:k]) for k in range(1, len(parts) + 1)):
        if module in modules.files:
            for node in _runs_at_import(modules.trees[module]):
                if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                    continue
                for t in _targets(modules, module, node):
                    if t != module:
                        heavy |= heavy_at_import(modules, t, seen)
    seen[target] = heavy
    return heavy


def lazy_imports(modules: Modules, package: str = PERF) -> list[tuple[str, int, str, set[str]]]:
    """(module, line, imported, the LAZY_IMPORTS entries it brings in) for each import inside a function of
    `package`'s modules."""
    seen: dict[str, set[str]] = {}
    found = []
    for name in sorted(modules.files):
        if name == package or name.startswith(package + "."):
            for node in _in_functions(modules.trees[name]):
                for t in _targets(modules, name, node):
                    found.append((name, node.lineno, t, heavy_at_import(modules, t, seen)))
    return found


def needless_lazy_imports(modules: Modules, package: str = PERF) -> list[str]:
    """`module:line -> imported` for each import inside a function that brings in nothing of LAZY_IMPORTS that its
    module does not bring in already as it is imported (then deferring it spares nothing), unless it is a command's
    work (COMMAND_LINE)."""
    seen: dict[str, set[str]] = {}
    return sorted(
        {
            f"{name}:{line} -> {t}"
            for name, line, t, heavy in lazy_imports(modules, package)
            if not heavy - heavy_at_import(modules, name, seen) and not _command_work(name, t)
        }
    )


def unexplained_lazy_imports(modules: Modules, package: str = PERF) -> list[str]:
    """`module:line -> imported` for each import inside a function of a module of refengine or cbbench that says not
    why, in a comment on its line or the line above (a package's own name says it for LAZY_IMPORTS'): what it brings
    in, or that it is a command's work."""
    found = set()
    for name, line, t, _ in lazy_imports(modules, package):
        if t.split(".")[0] in PACKAGES:
            text = modules.files[name].read_text().splitlines()
            node_lines = text[line - 2 : line + 1]  # the line above, the import's and (a wrapped import) the next
            if not any("#" in x for x in node_lines[1:]) and not node_lines[0].lstrip().startswith("#"):
                found.add(f"{name}:{line} -> {t}")
    return sorted(found)


def _command_work(name: str, imported: str) -> bool:
    """A command of the command line importing the work of perf it runs (COMMAND_LINE)."""
    inside = (name + ".").startswith(COMMAND_LINE + ".")
    return inside and imported.startswith(PERF + ".") and not (imported + ".").startswith(COMMAND_LINE + ".")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_engine_names(modules: Modules, package: str = "cbbench") -> list[str]:
    """`module:line name` for each private (underscore) name of refengine that a module of `package` reads: imported
    (`from refengine.x import _y`, or a private module `refengine._x`), read as an attribute (`._y`) of a name an
    import of refengine binds, or of a name assigned what one of those returns (`engine = LLMEngine(...)`), or named
    as a string beside such a name in one tuple or call (a patch target, a getattr)."""
    found = []
    for name in sorted(modules.files):
        if name != package and not name.startswith(package + "."):
            continue
        tree = modules.trees[name]
        engine: set[str] = set()  # local names that hold refengine, its modules or what they return
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _base(node, name, modules.is_package(name))
                if base.split(".")[0] == "refengine":
                    engine |= {a.asname or a.name for a in node.names}
                    found += [f"{name}:{node.lineno} {base}.{a.name}" for a in node.names if _private(a.name)]
                    if any(_private(part) for part in base.split(".")):
                        found.append(f"{name}:{node.lineno} {base}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "refengine":
                        engine.add(a.asname or "refengine")
                        if any(_private(part) for part in a.name.split(".")):
                            found.append(f"{name}:{node.lineno} {a.name}")

        def _root(expr: ast.expr) -> str | None:
            while isinstance(expr, (ast.Attribute, ast.Call, ast.Subscript)):
                expr = expr.func if isinstance(expr, ast.Call) else expr.value
            return expr.id if isinstance(expr, ast.Name) else None

        for _ in range(2):  # what a refengine name returns, and what that returns
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _root(node.value) in engine:
                    engine |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and _root(node.value) in engine:
                found.append(f"{name}:{node.lineno} .{node.attr}")
            elif isinstance(node, (ast.Tuple, ast.Call)):
                items = node.elts if isinstance(node, ast.Tuple) else node.args
                if any(_root(x) in engine for x in items if isinstance(x, (ast.Name, ast.Attribute))):
                    found += [
                        f"{name}:{node.lineno} {x.value!r}"
                        for x in items
                        if isinstance(x, ast.Constant) and isinstance(x.value, str) and _private(x.value)
                    ]
    return sorted(found)


def forbidden_imports(root: Path, package: str, banned: tuple[str, ...]) -> dict[str, list[str]]:
    """module -> the banned packages (dotted import names) it imports anywhere."""
    found = {}
    for name, path in _sources(root, package).items():
        imported = _imported_names(ast.parse(path.read_text()), name, is_package=path.name == "__init__.py")
        if hits := sorted({b for b in banned for n in imported if n == b or n.startswith(b + ".")}):
            found[name] = hits
    return found


def test_no_import_circle_in_refengine_or_cbbench() -> None:
    graph = import_graph(REPO)
    # the graph reads what it should: a function-level import, a face's, and both packages
    assert "refengine.entrypoints.launch" in graph["cbbench.perf.cli.commands"]  # (inside `serve`)
    assert "cbbench.kernels.triton_unified_attention" in graph["cbbench.kernels"]  # (the face's TYPE_CHECKING)
    assert "refengine.scheduler.batching" in graph["refengine.scheduler.scheduler"]
    circles = find_circles(graph)
    assert circles == [], "\n".join(describe(c, graph) for c in circles)


def test_no_refengine_import_runs_up_its_layers() -> None:
    modules = Modules(REPO, ("refengine",))
    assert {layer_of(name) for name in modules.files} == {None, *range(len(LAYERS))}  # every layer holds a module
    assert upward_imports(modules) == []


def test_the_engine_does_not_import_the_harness() -> None:
    assert forbidden_imports(REPO, "refengine", HARNESS) == {}


def test_kernels_import_neither_the_engine_nor_the_harness() -> None:
    assert forbidden_imports(REPO, "cbbench.kernels", ("refengine", *HARNESS)) == {}


def test_what_ships_does_not_import_the_projects_self_measurement() -> None:
    """benchmarks/ (not in the wheel) imports the product; nothing of refengine or cbbench imports it."""
    assert forbidden_imports(REPO, "refengine", (SELF_MEASUREMENT,)) == {}
    assert forbidden_imports(REPO, "cbbench", (SELF_MEASUREMENT,)) == {}


def test_no_import_circle_among_perfs_packages() -> None:
    modules = Modules(REPO, ("cbbench",))
    graph = package_graph(modules)
    assert {"plan", "backends", "grid", "results", "sweep", "cli"} <= set(graph) and "plan" in graph["backends"]
    imports = package_imports(modules)
    circles = find_circles(graph)
    assert circles == [], "\n".join(
        f"{a} -> {b}: {imports[(a, b)][0]}" for c in circles for a in c for b in sorted(graph[a] & set(c))
    )


def test_no_perf_import_runs_up_its_layers() -> None:
    modules = Modules(REPO, ("cbbench",))
    assert {perf_layer_of(p) for p in package_graph(modules)} == set(range(len(PERF_LAYERS)))  # each placed, none empty
    assert upward_package_imports(modules) == []


def test_perf_imports_inside_functions_only_what_is_heavy() -> None:
    modules = Modules(REPO)
    lazy = lazy_imports(modules)
    assert ("cbbench.perf.cli.main", "cbbench.perf.sweep") in {(n, t) for n, _, t, _ in lazy}  # (it reads them)
    assert needless_lazy_imports(modules) == []
    assert unexplained_lazy_imports(modules) == []
    assert {h for *_, heavy in lazy for h in heavy} == set(LAZY_IMPORTS)  # every entry is still needed


def test_the_harness_reads_no_private_name_of_the_engine() -> None:
    assert private_engine_names(Modules(REPO)) == []


def test_the_scheduler_output_asks_the_kv_cache_manager_not_the_block_pool() -> None:
    modules = Modules(REPO, ("refengine",))
    imported = {target for target, _ in modules.imports_of("refengine.scheduler.scheduler_output")}
    assert "refengine.kv_cache.kv_cache_manager" in imported and "refengine.kv_cache.block_pool" not in imported


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_reading_of_an_import(tmp_path: Path) -> None:
    """`from pkg import c` is the module pkg.c, unless pkg's face binds c; a relative import is resolved; a lazy
    import is an import; the packages above a module are not counted."""
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B as B\n",
            "pkg/a.py": "from pkg import c\nfrom pkg import B\n",
            "pkg/b.py": "def f():\n    from . import c\n",
            "pkg/c.py": "import pkg.sub.d\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/d.py": "from .. import c as _c\nfrom ..b import f\nimport os\n",
            "pkg/e.py": "def g():\n    import cbbench.perf.cli\n",
        },
    )
    graph = import_graph(root, ("pkg",))
    assert graph == {
        "pkg": {"pkg.b"},
        "pkg.a": {"pkg.c", "pkg"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.sub.d"},
        "pkg.sub": set(),
        "pkg.sub.d": {"pkg.c", "pkg.b"},
        "pkg.e": set(),
    }
    assert forbidden_imports(root, "pkg", HARNESS) == {"pkg.e": ["cbbench.perf"]}


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A planted circle (through a function-level import and a face) and a planted upward import are found."""
    root = _tree(
        tmp_path,
        {
            "refengine/__init__.py": "",
            "refengine/config.py": "import enum\n",
            "refengine/request.py": "",
            "refengine/scheduler/__init__.py": "",
            "refengine/scheduler/scheduler.py": "from refengine.config import X\n",
            "refengine/worker/__init__.py": "from refengine.worker.model_runner import Runner as Runner\n",
            "refengine/worker/model_runner.py": "from refengine.scheduler.scheduler import S\n",
            "refengine/engine/__init__.py": "",
            "refengine/engine/llm_engine.py": "from refengine.worker import Runner\n",
        },
    )
    modules = Modules(root, ("refengine",))
    assert find_circles(modules.graph()) == [] and upward_imports(modules) == []
    (root / "refengine/scheduler/scheduler.py").write_text(
        "from refengine.config import X\ndef f():\n    from refengine.worker import Runner\n"
    )
    modules = Modules(root, ("refengine",))
    graph = modules.graph()
    assert find_circles(graph) == [
        ["refengine.scheduler.scheduler", "refengine.worker", "refengine.worker.model_runner"]
    ]
    assert describe(find_circles(graph)[0], graph) == (
        "refengine.scheduler.scheduler -> refengine.worker, refengine.worker -> refengine.worker.model_runner, "
        "refengine.worker.model_runner -> refengine.scheduler.scheduler"
    )
    assert upward_imports(modules) == ["refengine.scheduler.scheduler:3 -> refengine.worker"]
    (root / "refengine/scheduler/scheduler.py").write_text("from refengine.config import X\n")
    (root / "refengine/request.py").write_text("def f():\n    import refengine.engine.llm_engine\n")
    modules = Modules(root, ("refengine",))
    assert find_circles(modules.graph()) == []
    assert upward_imports(modules) == ["refengine.request:2 -> refengine.engine.llm_engine"]
    (root / "refengine/newpart.py").write_text("")
    try:
        upward_imports(Modules(root, ("refengine",)))
    except AssertionError as e:
        assert "refengine/newpart stands in no layer" in str(e)
    else:
        raise AssertionError("a module outside LAYERS went unplaced")


def test_the_package_checks_can_fail(tmp_path: Path) -> None:
    """perf's packages: a planted import up the layers through a function (a circle too), one up the layers with no
    circle, and a package outside PERF_LAYERS are each found."""
    root = _tree(
        tmp_path,
        {
            "cbbench/__init__.py": "",
            "cbbench/perf/__init__.py": "",
            "cbbench/perf/records.py": "",
            "cbbench/perf/stats.py": "import math\n",
            "cbbench/perf/results/__init__.py": "",
            "cbbench/perf/results/rows.py": "from cbbench.perf.records import R\n",
            "cbbench/perf/plan/__init__.py": "",
            "cbbench/perf/plan/options.py": "from cbbench.perf.results.rows import read\n",
            "cbbench/perf/backends/__init__.py": "",
            "cbbench/perf/backends/backend.py": "from cbbench.perf.plan.options import O\n",
            "cbbench/perf/sweep.py": "from cbbench.perf.backends.backend import B\nfrom cbbench.perf import stats\n",
        },
    )
    modules = Modules(root, ("cbbench",))
    assert package_graph(modules) == {
        "records": set(),
        "stats": set(),
        "results": {"records"},
        "plan": {"results"},
        "backends": {"plan"},
        "sweep": {"backends", "stats"},
    }
    assert find_circles(package_graph(modules)) == [] and upward_package_imports(modules) == []
    options = root / "cbbench/perf/plan/options.py"
    options.write_text(
        "from cbbench.perf.results.rows import read\ndef f():\n    from cbbench.perf.backends import backend\n"
    )
    modules = Modules(root, ("cbbench",))
    assert find_circles(package_graph(modules)) == [["backends", "plan"]]
    assert upward_package_imports(modules) == ["cbbench.perf.plan.options:3 -> cbbench.perf.backends.backend"]
    options.write_text("from cbbench.perf.results.rows import read\n")
    (root / "cbbench/perf/stats.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cbbench.perf.results import rows\n"
    )
    modules = Modules(root, ("cbbench",))
    assert find_circles(package_graph(modules)) == []
    assert upward_package_imports(modules) == ["cbbench.perf.stats:3 -> cbbench.perf.results.rows"]
    (root / "cbbench/perf/newpart.py").write_text("")
    try:
        [perf_layer_of(p) for p in package_graph(Modules(root, ("cbbench",)))]  # as the layer test places each
    except AssertionError as e:
        assert "cbbench/perf/newpart stands in no layer" in str(e)
    else:
        raise AssertionError("a package of perf outside PERF_LAYERS went unplaced")


def test_the_lazy_import_and_private_name_checks_can_fail(tmp_path: Path) -> None:
    """Planted in a scratch tree: a function's import of a light module and of one its module already pays for are
    found; of a heavy package, of a module heavy through its top or its face, or of a command's work, is not. A private name of
    refengine, imported, read off an engine or named for a patch, is found."""
    root = _tree(
        tmp_path,
        {
            "refengine/__init__.py": "",
            "refengine/sample.py": "import torch\ndef _mask(x):\n    return x\ndef mask(x):\n    return x\n",
            "refengine/config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
            "cbbench/__init__.py": "",
            "cbbench/perf/__init__.py": "",
            "cbbench/perf/heavy/__init__.py": "import numpy\n",
            "cbbench/perf/heavy/rows.py": "X = 1\n",
            "cbbench/perf/light.py": "import json\n",
            "cbbench/perf/ok.py": (
                "def f():\n    import torch.nn\n    from cbbench.perf.heavy import rows\n"
                "    import refengine.sample as s\n    return s.mask, (s, 'mask')\n"
            ),
            "cbbench/perf/bad.py": (
                "import numpy\ndef f():\n    import json\n    from cbbench.perf import light\n"
                "    from refengine import config\n    from cbbench.perf.heavy import rows\n"
            ),
            "cbbench/perf/cli/__init__.py": "",
            "cbbench/perf/cli/main.py": "def run():\n    from cbbench.perf import light\n    import json\n",
            "cbbench/perf/private.py": (
                "from refengine.sample import _mask, mask\nimport refengine.sample as s\n"
                "def f(engine):\n    e = s.Engine()\n    return e._scheduler, s._mask, setattr(s, '_mask', mask), engine._x\n"
            ),
        },
    )
    modules = Modules(root)
    assert needless_lazy_imports(modules) == [
        "cbbench.perf.bad:3 -> json",
        "cbbench.perf.bad:4 -> cbbench.perf.light",
        "cbbench.perf.bad:5 -> refengine.config",  # (only a type checker imports torch there)
        "cbbench.perf.bad:6 -> cbbench.perf.heavy.rows",  # (numpy, which bad.py imports at its top already)
        "cbbench.perf.cli.main:3 -> json",  # (a command may defer its work, cli/main.py:2, not the standard library)
    ]
    assert heavy_at_import(modules, "cbbench.perf.heavy.rows") == {"numpy"}  # (through its package's face)
    assert "cbbench.perf.ok:4 -> refengine.sample" in unexplained_lazy_imports(modules)
    assert "cbbench.perf.ok:2 -> torch.nn" not in unexplained_lazy_imports(modules)  # (a package's name says why)
    assert private_engine_names(modules) == [
        "cbbench.perf.private:1 refengine.sample._mask",
        "cbbench.perf.private:5 '_mask'",
        "cbbench.perf.private:5 ._mask",
        "cbbench.perf.private:5 ._scheduler",
    ]  # (`engine._x`: nothing says the parameter is refengine's)
