"""Units in source headers and cells → the telemetry columns' units (W, J, °C, MHz, %, bytes).

One table per physical dimension (:data:`UNITS`); a telemetry column's dimension follows from its
name (:func:`dimension`). :func:`conversion` gives ``(scale, offset)`` for a unit string, and an unknown
unit is an error that names the column (never a silent factor of 1: ``0.5 kW`` read as 0.5 W and
``500 mW`` as 500 W are the mistakes this module exists to prevent). :func:`split_value` separates
a cell like ``"250.00 W"`` into its number and unit; a unit in the cell wins over the header's.

Byte units follow their names: ``KiB``/``MiB``/``GiB`` are binary, ``kB``/``MB``/``GB`` decimal
(nvidia-smi writes ``MiB``). Temperatures in kelvin or °F are converted to °C.
"""

from __future__ import annotations

import re
from functools import cache

UNITS: dict[str, dict[str, tuple[float, float]]] = {
    "power": {"w": (1.0, 0.0), "watt": (1.0, 0.0), "watts": (1.0, 0.0), "mw": (1e-3, 0.0),
              "milliwatt": (1e-3, 0.0), "milliwatts": (1e-3, 0.0), "kw": (1e3, 0.0), "kilowatt": (1e3, 0.0),
              "kilowatts": (1e3, 0.0), "uw": (1e-6, 0.0), "µw": (1e-6, 0.0)},
    "energy": {"j": (1.0, 0.0), "mj": (1e-3, 0.0), "kj": (1e3, 0.0), "uj": (1e-6, 0.0), "µj": (1e-6, 0.0),
               "wh": (3600.0, 0.0), "kwh": (3.6e6, 0.0)},
    "temperature": {"c": (1.0, 0.0), "°c": (1.0, 0.0), "degc": (1.0, 0.0), "celsius": (1.0, 0.0),
                    "k": (1.0, -273.15), "f": (5 / 9, -32 * 5 / 9), "°f": (5 / 9, -32 * 5 / 9)},
    "clock": {"mhz": (1.0, 0.0), "ghz": (1e3, 0.0), "khz": (1e-3, 0.0), "hz": (1e-6, 0.0)},
    "percent": {"%": (1.0, 0.0), "pct": (1.0, 0.0), "percent": (1.0, 0.0)},
    "bytes": {"b": (1.0, 0.0), "bytes": (1.0, 0.0), "kib": (2.0**10, 0.0), "mib": (2.0**20, 0.0),
              "gib": (2.0**30, 0.0), "tib": (2.0**40, 0.0), "kb": (1e3, 0.0), "mb": (1e6, 0.0),
              "gb": (1e9, 0.0), "tb": (1e12, 0.0)},
}
# Units that differ only by case from another unit of the same dimension: compared case-sensitively.
_CASE_SENSITIVE: dict[str, dict[str, tuple[float, float] | None]] = {"power": {"MW": None, "mW": (1e-3, 0.0)}, "energy": {"MJ": (1e6, 0.0), "mJ": (1e-3, 0.0)}}
DEFAULT_UNIT = {"power": "W", "energy": "J", "temperature": "C", "clock": "MHz", "percent": "%", "bytes": "B"}


def dimension(column: str) -> str | None:
    """The physical dimension of a telemetry column (``None``: a count, a bit set, a load average)."""
    if column.endswith("_w"):
        return "power"
    if column.endswith("_j"):
        return "energy"
    if column.endswith("_c"):
        return "temperature"
    if column.endswith("_mhz"):
        return "clock"
    if column.endswith("_pct"):
        return "percent"
    if column.endswith("_bytes"):
        return "bytes"
    return None


class UnitError(ValueError):
    """A unit this column cannot be in; the message names the column and the units it may be in."""


@cache
def conversion(column: str, unit: str, where: str = "") -> tuple[float, float]:
    """``(scale, offset)`` with ``value_in_column_unit = value * scale + offset``; ``unit`` empty = the
    column's own unit. Raises :class:`UnitError` naming ``where`` (the source column) otherwise."""
    dim = dimension(column)
    u = unit.strip().strip("[]()").strip()
    if not u:
        return (1.0, 0.0)
    if dim is None:
        raise UnitError(f"column {where or column!r}: unit {unit!r} given for {column}, which has no unit")
    exact = _CASE_SENSITIVE.get(dim, {})
    if u in exact:
        hit = exact[u]
        if hit is None:
            raise UnitError(f"column {where or column!r}: unit {u!r} is megawatts — not a device reading; "
                            "if milliwatts were meant, write mW")
        return hit
    key = u.lower().replace(" ", "")
    table = UNITS[dim]
    if key not in table:
        raise UnitError(f"column {where or column!r}: unknown unit {u!r} for {dim} "
                        f"(known: {', '.join(sorted({k for k in table if k.isascii()}))})")
    return table[key]


_NUM_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf(?:inity)?|nan)\s*(.*?)\s*$",
                       re.IGNORECASE)


def split_value(cell: str) -> tuple[float, str]:
    """``"250.00 W"`` → ``(250.0, "W")``; ``"71"`` → ``(71.0, "")``; ``ValueError`` if no number leads."""
    m = _NUM_UNIT.match(cell)
    if not m:
        raise ValueError(f"not a number: {cell!r}")
    return float(m.group(1)), m.group(2)


_HEADER_UNIT = re.compile(r"^(?P<name>.*?)\s*[\[(](?P<unit>[^\])]*)[\])]\s*$")


def split_header_unit(cell: str) -> tuple[str, str]:
    """``"power.draw [W]"`` / ``"power (kW)"`` → ``(name, unit)``; no bracket → ``(cell, "")``."""
    m = _HEADER_UNIT.match(cell.strip())
    if m:
        return m.group("name").strip(), m.group("unit").strip()
    return cell.strip(), ""
