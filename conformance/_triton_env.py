"""Run the Triton kernels through the interpreter on a machine without CUDA.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when `kernels` is first imported, so this
must run before any test module (or the engine) imports it: conftest.py imports this module first thing.
An explicit TRITON_INTERPRET in the environment wins.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
