"""What ci/gpu_env.sh asks a python3 on a GPU box, before cbbench is importable (standard library only, and torch
if it is there). One interpreter start and at most one torch import per question (a torch import costs seconds).

    python3 ci/gpu_probe.py deps MODULE[>=VERSION]...   one line: "<cuda 0|1> <torch version|-> <repo of refengine|->
                                                        <modules missing or too old...>"
    python3 ci/gpu_probe.py base-site                   the site-packages of the venv this python runs in (none
                                                        outside a venv), one a line
    python3 ci/gpu_probe.py purelib                     where this python installs pure-Python packages
    python3 ci/gpu_probe.py versions                    python, torch (+ CUDA), triton, transformers: one line

perf/tests/test_gpu_scripts.py runs each on the CPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import site
import sys
import sysconfig
from importlib.machinery import ModuleSpec


def _spec(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a submodule whose parent package is missing
        return None


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        digits = "".join(c for c in p if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _too_old(module: str, minimum: str) -> bool:
    """Whether the distribution of `module` (its name with '-' for '_') is older than `minimum`."""
    for dist in (module, module.replace("_", "-")):
        try:
            return _version_tuple(importlib.metadata.version(dist)) < _version_tuple(minimum)
        except importlib.metadata.PackageNotFoundError:
            continue
    return False  # imports, but its version is unknown: take it


def missing(wanted: list[str]) -> list[str]:
    """The modules of `wanted` ("name" or "name>=version") that do not import or are too old, by name."""
    out = []
    for want in wanted:
        name, _, minimum = want.partition(">=")
        if _spec(name) is None or (minimum and _too_old(name, minimum)):
            out.append(name)
    return out


def deps_line(wanted: list[str]) -> str:
    gone = missing(wanted)
    try:
        import torch

        cuda, version = int(torch.cuda.is_available()), torch.__version__
    except Exception:  # noqa: BLE001 (no torch, or a broken one: the line says "-")
        cuda, version = 0, "-"
    ref = _spec("refengine")
    ok = ref is not None and ref.origin and _spec("cbbench.perf.cli") is not None
    repo = os.path.dirname(os.path.dirname(ref.origin)) if ok and ref and ref.origin else "-"
    return " ".join(str(x) for x in (cuda, version, repo, *gone))


def versions_line() -> str:
    out = [f"python {sys.version.split()[0]}"]
    for dist in ("torch", "triton", "transformers"):
        try:
            out.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{dist} -")
    try:
        import torch

        out.append(f"cuda {torch.version.cuda or '-'}")
    except Exception:  # noqa: BLE001
        out.append("cuda -")
    return " ".join(out)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = argv[0]
    if cmd == "deps":
        print(deps_line(argv[1:]))
    elif cmd == "base-site":
        if sys.prefix != sys.base_prefix:
            print("\n".join(site.getsitepackages()))
    elif cmd == "versions":
        print(versions_line())
    elif cmd == "purelib":
        print(sysconfig.get_paths()["purelib"])
    else:
        print(f"gpu_probe: unknown question {cmd!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
