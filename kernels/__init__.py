"""Attention kernels of the reference engine: Triton (GPU, or CPU under TRITON_INTERPRET=1) and the torch oracle.

Imported as `cbbench.kernels` (never `kernels`: that name on PyPI is Hugging Face's). The functions
`reshape_and_cache` / `unified_attention` shadow their submodules of the same name here; reach the submodules'
other names with `from cbbench.kernels.unified_attention import ...`.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this package is first imported (importing the
oracle imports the package too): to run the kernels on a CPU, set it before that.
"""
from cbbench.kernels.reference import reshape_and_cache_ref, unified_attention_ref
from cbbench.kernels.reshape_and_cache import reshape_and_cache
from cbbench.kernels.unified_attention import unified_attention

__all__ = ["reshape_and_cache", "reshape_and_cache_ref", "unified_attention", "unified_attention_ref"]
