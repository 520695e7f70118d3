"""Attention kernels of the reference engine: Triton (GPU, or CPU under TRITON_INTERPRET=1) and the torch oracle.

Imported as `kernels`, the folder's name. Hugging Face publishes an unrelated PyPI package of that name:
`CBBENCH_KERNELS` marks this one, and refengine checks for it (refengine/attention.py). The functions
`reshape_and_cache` / `unified_attention` shadow their submodules of the same name here; reach the submodules'
other names with `from kernels.unified_attention import ...`.

Light import: importing this package, or the oracle (`kernels.reference`, the engine's torch backend),
does not import Triton. The Triton kernels load on first use of one of their names here (module `__getattr__`),
so an engine on the torch backend never pays Triton's import, nor needs Triton installed.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when the Triton kernels are first loaded: to run
them on a CPU, set it before that.
"""

from __future__ import annotations

import importlib
import sys
import types

from kernels.reference import reshape_and_cache_ref, unified_attention_ref

# this repository's kernels, not another distribution's package of the same name (refengine/attention.py checks)
CBBENCH_KERNELS = True

__all__ = [
    "reshape_and_cache",
    "reshape_and_cache_ref",
    "unified_attention",
    "unified_attention_ref",
    "warmup_attention_kernels",
]

# name here -> (submodule, attribute); the first two are functions named like their submodules
_LAZY = {
    "reshape_and_cache": ("reshape_and_cache", "reshape_and_cache"),
    "unified_attention": ("unified_attention", "unified_attention"),
    "warmup_attention_kernels": ("warmup", "warmup_attention_kernels"),
}


class _KernelsPackage(types.ModuleType):
    """The package's module type. Importing submodule X binds attribute X of its package to the submodule; for the
    two names that are also functions, the function must win, whichever is imported first."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _LAZY and name == _LAZY[name][0] and isinstance(value, types.ModuleType):
            return  # the import system binding the submodule: __getattr__ gives the function instead
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> object:
        if name not in _LAZY:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        super().__setattr__(name, value)  # cached: later lookups do not come here
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_LAZY))


sys.modules[__name__].__class__ = _KernelsPackage
