"""The backends `cbbench perf` knows by name: importing this module registers each (see `backend.Backend.register`),
and `check_backend` holds the options' backend and peers to them.

Each module's import is cheap (torch models, transformers and aiohttp load inside `run`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench.perf.backends import hf, hf_cb, in_process, openai, openai_embeddings  # noqa: F401 - imported to register
from cbbench.perf.backends.backend import Backend

if TYPE_CHECKING:
    from cbbench.perf.plan.options import BackendOptions

__all__ = ["Backend", "check_backend"]


def check_backend(b: BackendOptions) -> BackendOptions:
    """`b`, its peers and its backend known to the registry: else a ValueError naming the option (the peers first,
    as the command line parses them first)."""
    known = Backend.names("peer")
    bad = [p for p in b.peers.values if p not in known]
    if bad:
        raise ValueError(f"peers: unknown peer {bad[0]!r}; expected a comma list of {', '.join(known)}, or none")
    engines = Backend.names("engine", "server")
    if b.name not in engines:
        raise ValueError(f"backend: unknown {b.name!r}; expected one of {', '.join(engines)}")
    return b
