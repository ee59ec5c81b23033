"""Waiting for files that other processes, possibly on other nodes, write into a run directory on
a shared filesystem (``run.json``, samplers' final meta, exit records). Polling only: no locks."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from powertrain.store.rundir import RunDir, read_json


def wait_for_file(path: Path, timeout_s: float) -> bool:
    """True once ``path`` is a file; False if it has not appeared within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for_records(paths: Sequence[Path], timeout_s: float) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """The JSON records among ``paths`` (by index) once all exist or ``timeout_s`` has passed, and the
    indices of those still missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = {i: read_json(p) for i, p in enumerate(paths) if p.is_file()}
        missing = [i for i in range(len(paths)) if i not in done]
        if not missing or time.monotonic() > deadline:
            return done, missing
        time.sleep(0.1)


def wait_node_samplers(run: RunDir, nnodes: int, timeout_s: float = 30.0) -> None:
    """Give the other nodes' samplers time to write their final meta before the run is closed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metas = [read_json(m) for m in run.telemetry_dir.glob("*.meta.json")]
        if sum(1 for m in metas if m.get("finished")) >= nnodes - 1:
            return
        time.sleep(0.1)
