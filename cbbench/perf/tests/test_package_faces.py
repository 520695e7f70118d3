"""The faces of cbbench's packages (cbbench/kernels/__init__.py, workloads/, perf/): each public name is the
function or class it names, not a module of the same name; `__all__` and help() list them; the names load on first
use, so the engine's `import cbbench.kernels.reference` imports no Triton; and the names a type checker reads (the
face's `if TYPE_CHECKING:` block) are the names the face serves."""

from __future__ import annotations

import ast
import importlib
import inspect
import pydoc
import subprocess
import sys
from pathlib import Path

import pytest

from cbbench._faces import lazy_exports

REPO = Path(__file__).resolve().parents[3]
FACES = ("cbbench.kernels", "cbbench.workloads", "cbbench.perf")
# what a user of each package reaches for first (issue: `from cbbench.kernels import unified_attention` gave the module)
EXPECTED = {
    "cbbench.kernels": {"unified_attention", "reshape_and_cache", "rms_norm", "unified_attention_ref"},
    "cbbench.workloads": {"get_workload", "list_workloads", "Workload", "WorkloadRequest"},
    "cbbench.perf": {"run_perf", "PerfOptions", "compare", "read_rows", "compute_metrics"},
}


@pytest.mark.parametrize("name", FACES)
def test_every_public_name_is_a_function_or_class_with_a_docstring(name: str) -> None:
    face = importlib.import_module(name)
    assert EXPECTED[name] <= set(face.__all__)
    for public in face.__all__:
        value = getattr(face, public)
        assert inspect.isfunction(value) or inspect.isclass(value), (public, value)
        assert value.__module__.startswith(name + "."), (public, value.__module__)
        assert inspect.getdoc(value) and not inspect.ismodule(value), public
    text = pydoc.render_doc(face, renderer=pydoc.plaintext)
    assert (face.__doc__ or "").strip() and all(public in text for public in face.__all__)


@pytest.mark.parametrize("name", FACES)
def test_the_face_serves_exactly_what_its_type_checking_block_imports(name: str) -> None:
    face = importlib.import_module(name)
    tree = ast.parse(Path(face.__file__).read_text())
    block = [s for s in tree.body if isinstance(s, ast.If) and getattr(s.test, "id", "") == "TYPE_CHECKING"]
    names = {a.asname for s in block for n in s.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert None not in names, "a face's TYPE_CHECKING import must say `name as name` (an explicit re-export)"
    assert names == set(face.__all__)


def test_from_import_gives_the_kernel_even_after_its_module_was_imported() -> None:
    import cbbench.kernels.triton_unified_attention as module
    from cbbench.kernels import unified_attention

    assert unified_attention is module.unified_attention and inspect.isfunction(unified_attention)


def test_names_load_on_first_use_only() -> None:
    code = (
        "import sys, cbbench.kernels.reference, cbbench.perf, cbbench.workloads\n"
        "assert 'triton' not in sys.modules, 'the kernels face imported Triton'\n"
        "assert 'cbbench.perf.sweep' not in sys.modules and 'pandas' not in sys.modules\n"
        "from cbbench.kernels import unified_attention\n"
        "assert 'triton' in sys.modules\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_an_unknown_name_is_an_attribute_error_naming_it(tmp_path: Path) -> None:
    face = tmp_path / "face.py"
    face.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from os.path import join as join\n")
    names, getattr_, dir_ = lazy_exports("os", str(face))
    assert names == ["join"] and getattr_("join") is __import__("os.path").path.join
    with pytest.raises(AttributeError, match="'nope'"):
        getattr_("nope")
