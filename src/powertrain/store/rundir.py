"""The run directory layout (DESIGN.md "Data contracts") and its ``run.json``.

::

    <run>/run.json                   resolved spec, status, times, hosts, devices, versions, rank map
    <run>/telemetry/<host>.parquet   one row per (sample, device); while running: <host>.parts/seg-*.parquet
    <run>/telemetry/<host>.meta.json what that host's sampler found (devices, supported fields, notes)
    <run>/events/rank-<r>.parquet    one row per interval of rank r (while running: rank-<r>.parts/)
    <run>/summary.json               derived metrics
    <run>/logs/                      stdout/stderr of every rank and of the samplers

Statuses: ``running`` → ``ok`` | ``failed`` (with ``reason``). A run whose ``run.json`` still says
``running`` but whose owner process is gone is reported as failed by :meth:`RunDir.effective_status`.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUSES = ("running", "ok", "failed")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def default_host() -> str:
    """The host label used in file names and rows (short host name, no domain)."""
    return socket.gethostname().split(".")[0] or "localhost"


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory; creating one does not touch the disk."""

    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def summary_json(self) -> Path:
        return self.path / "summary.json"

    @property
    def telemetry_dir(self) -> Path:
        return self.path / "telemetry"

    @property
    def events_dir(self) -> Path:
        return self.path / "events"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    def telemetry_file(self, host: str) -> Path:
        return self.telemetry_dir / f"{host}.parquet"

    def telemetry_meta(self, host: str) -> Path:
        return self.telemetry_dir / f"{host}.meta.json"

    def events_file(self, rank: int) -> Path:
        return self.events_dir / f"rank-{rank}.parquet"

    def create(self) -> RunDir:
        for d in (self.path, self.telemetry_dir, self.events_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        return self

    def exists(self) -> bool:
        return self.run_json.is_file()

    def read(self) -> dict[str, Any]:
        if not self.run_json.is_file():
            raise FileNotFoundError(
                f"{self.path} is not a run directory (no run.json). "
                "Point at a folder written by `powertrain monitor`, `run`, `sweep` or `import`."
            )
        return read_json(self.run_json)

    def write(self, info: dict[str, Any]) -> None:
        write_json_atomic(self.run_json, info)

    def update(self, **fields: Any) -> dict[str, Any]:
        info = self.read() if self.exists() else {}
        info.update(fields)
        self.write(info)
        return info

    def hosts(self) -> list[str]:
        """Hosts that wrote telemetry (finished files or unfinished part folders)."""
        names = {p.name.removesuffix(".parquet") for p in self.telemetry_dir.glob("*.parquet")}
        names |= {p.name.removesuffix(".parts") for p in self.telemetry_dir.glob("*.parts")}
        return sorted(names)

    def effective_status(self) -> str:
        """``run.json``'s status, except that a ``running`` run whose owner is gone counts as failed."""
        info = self.read()
        status = info.get("status", "failed")
        owner = info.get("owner") or {}
        owner_gone = owner.get("host") == default_host() and owner.get("pid") and not _pid_alive(int(owner["pid"]))
        if status == "running" and owner_gone:
            return "failed"
        return status


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
