"""Choosing the backends for this node, and saying plainly what was found.

``auto`` tries every vendor backend and always adds the host backend. A vendor library or device that
is missing is not an error: it produces one line in ``notes`` ("NVIDIA: nvidia-ml-py not installed
…; using host counters only") that the sampler logs and ``run.json`` keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from powertrain.telemetry.backend import Backend, BackendUnavailable

BACKEND_NAMES = ("nvidia", "amd", "host")


def unknown_backends(requested: Sequence[str] | str) -> list[str]:
    """The names in ``requested`` (``"auto"`` or backend names) that are not in :data:`BACKEND_NAMES`."""
    if requested == "auto" or list(requested) == ["auto"]:
        return []
    return [n for n in (x.strip().lower() for x in requested) if n not in BACKEND_NAMES]


def open_backends(
    requested: Sequence[str] | str = "auto",
    *,
    proc: str | Path = "/proc",
    sys: str | Path = "/sys",
) -> tuple[list[Backend], list[str]]:
    """Open the requested backends (``"auto"`` or names from :data:`BACKEND_NAMES`).

    Returns the opened backends and human-readable notes. A backend named explicitly that cannot
    open raises :class:`BackendUnavailable`; under ``auto`` it becomes a note.
    """
    auto = requested == "auto" or list(requested) == ["auto"]
    unknown = unknown_backends(requested)
    if unknown:
        raise BackendUnavailable(
            f"unknown telemetry backend {', '.join(unknown)}; choose from {', '.join(BACKEND_NAMES)} or auto"
        )
    names = list(BACKEND_NAMES) if auto else [n.strip().lower() for n in requested]
    backends: list[Backend] = []
    notes: list[str] = []
    for name in names:
        try:
            backend = _open(name, proc=proc, sys=sys)
        except BackendUnavailable as exc:
            if not auto:
                raise
            notes.append(str(exc))
            continue
        backends.append(backend)
        notes.extend(getattr(backend, "notes", []))
    if auto and not any(b.name in ("nvidia", "amd") for b in backends):
        notes.append("no GPU telemetry on this node: GPU power, temperature and clocks are not measured here")
    return backends, notes


def _open(name: str, *, proc: str | Path, sys: str | Path) -> Backend:
    if name == "host":
        from powertrain.telemetry.host import HostBackend

        return HostBackend(proc=proc, sys=sys)
    if name == "nvidia":
        from powertrain.telemetry.nvidia import NvidiaBackend

        return NvidiaBackend()
    if name == "amd":
        from powertrain.telemetry.amd import AmdBackend

        return AmdBackend()
    raise BackendUnavailable(f"unknown backend {name}")
