"""Damaged telemetry for tests: edits of a telemetry table that a real run can produce (a clock that
steps back, a sampler that stops writing, readings that are no readings). Shared by
tests/test_hostile_inputs.py and tests/test_time_gaps_missing.py."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

S = 1_000_000_000
Edit = Callable[[pa.Table], pa.Table]


def hole(start_s: float, length_s: float) -> Edit:
    """The sampler wrote nothing for ``length_s`` seconds from ``start_s`` after the first sample."""
    def edit(t: pa.Table) -> pa.Table:
        ts = t["t_ns"].to_numpy()
        a = ts.min() + int(start_s * S)
        return t.filter(pa.array((ts < a) | (ts > a + int(length_s * S))))
    return edit


def power_every(value: float, every: int = 7) -> Edit:
    """Every ``every``-th power reading replaced by ``value`` (NaN, a negative number, …)."""
    def edit(t: pa.Table) -> pa.Table:
        p = t["power_w"].to_numpy(zero_copy_only=False).astype(float).copy()
        p[::every] = value
        return t.set_column(t.column_names.index("power_w"), "power_w", pa.array(p, pa.float64()))
    return edit
