"""perf: the perf suite (imported as `perf`, never as a bare `perf`).

What each module owns: docs/architecture.md (made from the modules' docstrings by ci/codemap.py).
"""
