"""Argument checks shared by the configs, SamplingParams and the engine: each raises ValueError naming the field.

Python's bool is an int, so every integer check rejects it explicitly; numpy integers and floats pass (they are
numbers.Integral / numbers.Real) and callers convert them to plain Python numbers.
"""

from __future__ import annotations

import math
import numbers

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # what torch's generators and int64 tensors take
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        raise ValueError(f"{name} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return value


def check_real(
    name: str, value: object, minimum: float | None = None, maximum: float | None = None, *, min_open: bool = False
) -> float:
    """A finite real number in [minimum, maximum] (or (minimum, maximum] with `min_open`)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    value = float(value)
    low_bad = minimum is not None and (value <= minimum if min_open else value < minimum)
    if low_bad or (maximum is not None and value > maximum):
        lo = "(" if min_open else "["
        hi = f"{maximum}]" if maximum is not None else "inf)"
        raise ValueError(f"{name} must be in {lo}{minimum}, {hi}, got {value!r}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool (True or False), got {value!r}")
    return value


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_gpu_memory_utilization(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"gpu_memory_utilization must be a number in (0, 1], got {value!r}")
