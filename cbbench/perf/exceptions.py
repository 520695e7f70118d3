"""The perf suite's own exceptions, in a module that imports nothing, so the CLI can catch them before it loads
the sweep (which pulls in pandas and the backends)."""


class NoResultError(RuntimeError):
    """A run of the plan measured nothing (it failed, or every request of it failed): the command must not pass."""
