"""Exit without the interpreter's last full garbage collection.

At exit CPython collects every container object it tracks. After ``import torch`` that is about a
million objects (operator registrations, meta kernels, FX and dynamo tables) and costs 2–3 s of CPU
on a small host — per process: the CLI, the launcher and each rank of a run pay it, and a run ends
only when they have. Freezing the heap at exit (:func:`gc.freeze` as an ``atexit`` handler, which
runs before the interpreter's final collection; handlers registered earlier, such as logging's
flush, still run after it) moves those objects out of the collector's reach, so the interpreter
frees what reference counting frees and skips the walk. Nothing is flushed or closed differently:
files, Parquet writers and process groups are closed by the code that owns them before exit.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_final_collection() -> None:
    """Register the exit-time heap freeze once per process (idempotent)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
