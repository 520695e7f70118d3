"""What the faces of cbbench's packages (their __init__.py) share: lazy exports, and stepping aside under a bare name.

Lazy exports: a face names its public functions and classes, and each is imported from its module on first use,
so that `import cbbench.kernels.reference` (which the engine does as it loads) or `cbbench --help` imports no Triton
or pandas for a face's sake. Type checkers and IDEs read the same names from the face's `if TYPE_CHECKING:` block.

Bare names: the repository's top holds kernels/, perf/ and workloads/, links to cbbench.kernels, cbbench.perf and
cbbench.workloads. With the repository's root on sys.path (pytest's rootdir, `python -m` or a script run from the
checkout) `import kernels` would find that link before another distribution's package of the same name: Hugging
Face's `kernels`, which transformers >= 5.25 imports itself, or PyPI's `perf`. A regular package found first on the
path wins, so the face of such a package steps aside when it sees its bare name: it hands the name to the package
that owns it, or, where no other package has it, to the cbbench package itself, so that one module answers to both
names (pytest imports perf/__init__.py as `perf` when it collects perf/tests/): never a second copy of cbbench under
another name, which would hold its own state apart from the real one.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable


def lazy_exports(package: str, face: str) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """(__all__, __getattr__, __dir__) for a face: its public names are the imports of its `if TYPE_CHECKING:`
    block (`from cbbench.x.y import name as name`), which type checkers and IDEs read as they are; at run time each
    name is imported from its module on first access and then kept in the package's namespace (as the scientific
    Python `lazy_loader` reads a stub file)."""
    exports = _type_checking_imports(face)

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return sorted(exports), __getattr__, __dir__


def _type_checking_imports(face: str) -> dict[str, str]:
    """name -> module, from the `from MODULE import NAME as NAME` lines of the face's `if TYPE_CHECKING:` block."""
    with open(face, encoding="utf-8") as f:
        tree = ast.parse(f.read(), face)
    exports: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) and stmt.test.id == "TYPE_CHECKING":
            for node in stmt.body:
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    exports.update((a.asname or a.name, node.module) for a in node.names)
    return exports


def hand_over_bare_name(name: str, folder: str) -> None:
    """Put into sys.modules[name], where the import statement that is running picks it up, the package `name` from
    anywhere but `folder` (one of cbbench's packages, reached under its bare name), or cbbench.<name> itself when
    nothing else provides it."""
    ours = os.path.realpath(folder)
    elsewhere = [p for p in sys.path if os.path.realpath(os.path.join(p or os.curdir, name)) != ours]
    spec = None
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = finder.find_spec(name, elsewhere)
        elif hasattr(finder, "find_spec"):
            spec = finder.find_spec(name, None)
        if spec is not None and os.path.realpath(spec.origin or "") != os.path.join(ours, "__init__.py"):
            break
        spec = None
    if spec is None or spec.loader is None:
        sys.modules[name] = importlib.import_module(f"cbbench.{name}")
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
