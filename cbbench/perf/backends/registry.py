"""The backends `cbbench perf` knows by name: importing this module registers each (see `base.Backend.register`).

Each module's import is cheap (torch models, transformers and aiohttp load inside `run`)."""

from cbbench.perf.backends import hf, hf_cb, in_process, openai, openai_embeddings  # noqa: F401 - imported to register
from cbbench.perf.backends.backend import Backend

__all__ = ["Backend"]
