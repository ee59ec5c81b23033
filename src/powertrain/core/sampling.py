"""The telemetry sampler's rate ceiling, which specs are checked against before anything runs.

It lives here, below every layer, so that a sweep spec can refuse a rate the sampler would refuse
only after each run's retries, without the planner importing the sampler.
"""

from __future__ import annotations

# Above 1 kHz a Python loop over NVML/amdsmi/procfs reads cannot keep its period; readings would be
# stamped at a rate they were not taken at.
MAX_RATE_HZ = 1000.0


def check_rate_hz(rate: float, what: str = "sampling rate") -> float:
    """``rate`` in (0, :data:`MAX_RATE_HZ`] samples per second (NaN fails too), else ``ValueError`` naming ``what``."""
    if not 0 < rate <= MAX_RATE_HZ:
        raise ValueError(f"{what} must be in (0, {MAX_RATE_HZ:g}] samples per second, got {rate:g}")
    return rate
