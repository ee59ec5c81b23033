"""A wall clock that a system clock step cannot move: the wall time read once, plus monotonic time since.

Telemetry rows (``telemetry.sampler``) and step events (``hooks.recorder``) are stamped on it, so an NTP
step or a manual ``date`` during a run leaves both on one time line and aligned with each other (to the
difference of the two processes' start readings, which NTP slews alike); the run's duration comes from
the monotonic clock the same way (``monitor``).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class AnchoredClock:
    """``now_ns()``: the wall clock at construction + ``CLOCK_MONOTONIC`` elapsed since (ns since the epoch)."""

    def __init__(self, wall_ns: Callable[[], int] = time.time_ns,
                 mono_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._mono_ns = mono_ns
        self._wall0, self._mono0 = wall_ns(), mono_ns()

    def now_ns(self) -> int:
        return self._wall0 + (self._mono_ns() - self._mono0)
