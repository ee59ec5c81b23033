"""Space held back for the last words of a run on a full disk.

A run writes its final ``run.json`` (and each sampler its final meta) after everything else; when the
command's own output has filled the disk, those small files could not be written and the run would
stay ``running`` with no reason. So a small file of random bytes (not zeros: compressing or
deduplicating filesystems would not allocate those) is written when the run starts and deleted just
before the final writes, giving them its space back.
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_RESERVE_BYTES = 256 * 1024  # run.json with devices, rank map and notes is far smaller
SAMPLER_RESERVE_BYTES = 64 * 1024


def reserve_path(folder: Path, owner: str = "run") -> Path:
    return Path(folder) / f".{owner}.reserve"


def hold_space(path: Path, size: int) -> None:
    """Write ``size`` bytes to ``path``; raises ``OSError`` (and leaves no file) when the disk cannot hold them."""
    try:
        with open(path, "wb") as f:
            f.write(os.urandom(size))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def release_space(path: Path) -> None:
    """Give the held space back (nothing happens when none was held)."""
    path.unlink(missing_ok=True)
