"""refengine: a compact continuous-batching reference engine with vLLM's public surface.

The names below load on first use (PEP 562), so that `refengine.config` imports without torch (the CLI's help)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMEngine": "refengine.engine.llm_engine",
    "LLM": "refengine.entrypoints.llm",
    "CompletionOutput": "refengine.outputs",
    "RequestOutput": "refengine.outputs",
    "SamplingParams": "refengine.sampling_params",
}

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'refengine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
