"""Turning wrapping hardware counters into monotonic 64-bit totals.

Energy and byte counters wrap (RAPL at ``max_energy_range_uj``, some link counters at 2**32). Every
reader — live backends and importers of old logs — un-wraps through these two helpers, so there is
one rule: a drop of the raw value means exactly one wrap of the known modulus; without a modulus a
drop is a counter reset and the total keeps going from the new value.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class Unwrapper:
    """Stateful un-wrapping of one counter read repeatedly (live sampling)."""

    def __init__(self, modulus: int | float | None) -> None:
        self.modulus = modulus
        self._last: float | None = None
        self._offset = 0.0

    def __call__(self, raw: float | None) -> float | None:
        if raw is None:
            return None
        if self._last is not None and raw < self._last:
            # Without a modulus, treat a drop as a reset: continue from the last total.
            self._offset += self.modulus if self.modulus else self._last
        self._last = raw
        return raw + self._offset


def unwrap(values: Iterable[float | None], modulus: int | float | None) -> list[float | None]:
    """Un-wrap a recorded series (``None`` passes through and does not break the chain)."""
    u = Unwrapper(modulus)
    return [u(v) for v in values]


def unwrap_array(values: np.ndarray, modulus: int | float) -> np.ndarray:
    """Vectorised :func:`unwrap` for a NaN-free float/int array with a known modulus."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values
    wraps = np.concatenate([[0], np.cumsum(np.diff(values) < 0)])
    return values + wraps * float(modulus)
