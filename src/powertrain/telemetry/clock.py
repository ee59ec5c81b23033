"""The one clock every sample and event is stamped with, and the sampler's default rate."""

from __future__ import annotations

import time
from typing import Any

DEFAULT_RATE_HZ = 20.0


def clock_info() -> dict[str, Any]:
    """What clock rows are stamped with, and its relation to the monotonic clock right now.

    Comparing ``realtime_minus_monotonic_ns`` at the start and end of a run shows whether the
    wall clock was stepped or slewed (NTP) while it ran.
    """
    real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return {"clock": "CLOCK_REALTIME", "realtime_minus_monotonic_ns": real - mono, "read_at_ns": real}
