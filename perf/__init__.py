"""cbbench.perf: the perf suite (imported as `cbbench.perf`, never as a bare `perf`).

What each module owns: docs/architecture.md (made from the modules' docstrings by ci/codemap.py).
"""
