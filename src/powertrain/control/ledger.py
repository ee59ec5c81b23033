"""The node-level ledger of device settings powertrain changed, so that they are always put back.

Before a run changes a device's power limit or clocks, what the device had is written here (one
entry per device: vendor, label, UUID, the settings found, the settings about to change, and the
owner: pid, process start time, host, run directory). The run removes its entries once it has
restored them (normal end, error, SIGTERM/SIGINT). A run killed with ``kill -9`` leaves them: the
next powertrain start on the node (:func:`powertrain.control.apply.restore_stale`) and
``powertrain restore`` restore every entry whose owner is gone.

The ledger is one JSON file per node, ``$POWERTRAIN_CONTROL_LEDGER`` or
``/var/tmp/powertrain/control-ledger.json`` (``/var/tmp`` is node-local and survives a reboot; after
a reboot the driver defaults are back anyway and restoring them again is harmless). Every read and
write holds an exclusive ``flock`` on a lock file beside it, and writes replace the file atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # psutil ships no type information

from powertrain.store.leftovers import remove_stale

LEDGER_ENV = "POWERTRAIN_CONTROL_LEDGER"
DEFAULT_LEDGER = Path("/var/tmp/powertrain/control-ledger.json")


def ledger_path() -> Path:
    return Path(os.environ.get(LEDGER_ENV) or DEFAULT_LEDGER)


def this_owner(run: str | None) -> dict[str, Any]:
    """The owner record of this process: pid, its start time (guards against pid reuse), host, run."""
    return {"pid": os.getpid(), "started": psutil.Process().create_time(), "host": socket.gethostname(),
            "run": run}


def owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the process that wrote an entry still runs (same pid *and* same start time)."""
    try:
        p = psutil.Process(int(owner["pid"]))
        return abs(p.create_time() - float(owner["started"])) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


class Ledger:
    """The ledger file at ``path`` (default: :func:`ledger_path`)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or ledger_path()

    @contextlib.contextmanager
    def locked(self) -> Iterator[list[dict[str, Any]]]:
        """The entries, under the ledger's lock; changes made to the list are written back."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OSError(f"control ledger {self.path}: {exc.strerror}; set ${LEDGER_ENV} to a writable "
                          "node-local file") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._read()
            before = json.dumps(entries, sort_keys=True)
            yield entries
            if json.dumps(entries, sort_keys=True) != before:
                self._write(entries)
        finally:
            os.close(fd)

    def _read(self) -> list[dict[str, Any]]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            # A damaged ledger must not be silently emptied: it may be the only record of a change.
            raise OSError(f"control ledger {self.path} cannot be read ({exc}); repair or move it, then run "
                          "`powertrain restore`") from None
        entries = raw.get("entries") if isinstance(raw, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def _write(self, entries: list[dict[str, Any]]) -> None:
        # a writer killed between write and replace left its temporary file (under this same lock)
        remove_stale(self.path.parent, [f".{self.path.name}.{{pid}}.tmp"])
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": 1, "written_ns": time.time_ns(), "entries": entries}, indent=1))
        os.replace(tmp, self.path)

    def entries(self) -> list[dict[str, Any]]:
        """The entries now, read without the lock (writes replace the file whole) and without creating
        anything: a node where no run ever set a control has no ledger, and gets none from reading."""
        return self._read()
