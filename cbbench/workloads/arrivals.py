"""Request arrival processes, as vLLM's `bench serve` draws them.

- `request_rate = inf`: every request arrives at t = 0 (offline throughput).
- finite `request_rate`, `burstiness = 1`: a Poisson process (exponential gaps with mean 1 / rate).
- other `burstiness`: gamma gaps with shape = burstiness, scale = 1 / (rate * burstiness), so the mean rate stays
  `request_rate` while the coefficient of variation of the gaps is 1 / sqrt(burstiness) (< 1 smoother, > 1 burstier).

As in vLLM, the first request is sent at t = 0 and each later one one gap after the previous.
The gaps come from their own random stream (seed, `ARRIVAL_STREAM`), so changing the rate never changes the
prompts of a workload with the same seed.
"""

from __future__ import annotations

import math

import numpy as np

# second entropy word of the arrival stream's SeedSequence; the samplers use other words
ARRIVAL_STREAM = 0xA221


def arrival_times(
    num_requests: int, request_rate: float = math.inf, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Arrival times in seconds from the start, non-decreasing, the first at 0.0."""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 (inf for offline), got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness}")
    if math.isinf(request_rate) or num_requests == 0:
        return [0.0] * num_requests
    rng = np.random.default_rng([seed, ARRIVAL_STREAM])
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests - 1)
    times: list[float] = np.cumsum(gaps).tolist()
    return [0.0] + times
