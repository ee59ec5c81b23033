"""Temporary files and folders of a killed command, removed by the next run of it.

Every command that writes builds its output beside the target under a hidden temporary name and
renames it into place (reports in ``.NAME.building-XXXX``, imports in ``.NAME.importing-XXXX``, JSON
and traces in ``.NAME.XXXXXXXX.tmp``, Parquet tables in ``.NAME.PID.tmp``, …). A ``kill -9`` leaves
that name behind; :func:`remove_stale` is called by the next run, before it writes, and removes such
leftovers — and nothing else.

The rule, honest about what can be known:

* only entries directly in ``parent`` whose name matches one of the caller's own patterns are
  considered; a pattern is a glob (``*``, ``?``) that must name a hidden entry (``.``) or end in
  ``.tmp``, so no pattern reaches a user's file; ``{pid}`` in a pattern stands for a process id;
* **a pid in the name**: removed when no process with that pid runs on this host, and the entry has
  not been modified for :data:`PID_GRACE_S` — the grace keeps a file another node of a shared
  filesystem is writing now (its pid means nothing here). A pid that was reused by a new process
  keeps the entry (the safe side; the next run after that process ends removes it);
* **no pid in the name** (``mkstemp``/``mkdtemp`` names): removed when nothing in it has been modified
  for ``max_age_s`` (default :data:`DEFAULT_MAX_AGE_S`, one hour; a folder's age is its newest
  entry's): a live command touches its staging folder as it fills it, and none of powertrain's
  commands works an hour without writing. A caller that holds the lock every writer of ``parent``
  takes (the sweep under its ``.lock``) passes ``max_age_s=0``: nobody else can be writing there.

Links are removed as links (never followed); anything that cannot be removed is logged and left.
Each removal is logged (INFO) with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_AGE_S = 3600.0
PID_GRACE_S = 120.0
_WALK_LIMIT = 10_000  # entries looked at when dating a folder: a huge leftover is dated by a sample


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists on this host (one of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:  # more digits than any pid: not a process
        return False
    return True


def _compile(pattern: str) -> re.Pattern[str]:
    """A glob with an optional ``{pid}`` as a regex (group ``pid``); refused unless it names our own kind."""
    if "/" in pattern or os.sep in pattern or not pattern or pattern in (".", ".."):
        raise ValueError(f"leftover pattern {pattern!r}: one name in the folder, without a path")
    if not (pattern.startswith(".") or pattern.endswith(".tmp")):
        raise ValueError(f"leftover pattern {pattern!r}: must name a hidden entry or end in .tmp (a temporary name)")
    parts = []
    for piece in re.split(r"(\{pid\}|\*|\?)", pattern):
        parts.append({"{pid}": r"(?P<pid>\d{1,10})", "*": r".*", "?": r"."}.get(piece, re.escape(piece)))
    return re.compile("".join(parts), re.DOTALL)


def _newest_mtime(path: Path, st: os.stat_result) -> float:
    """The newest modification time of ``path`` and, for a folder, of what it holds (links not followed)."""
    newest = st.st_mtime
    if not stat.S_ISDIR(st.st_mode):
        return newest
    seen = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            seen += 1
            if seen >= _WALK_LIMIT:
                return newest
    return newest


def _why_stale(path: Path, st: os.stat_result, pid: int | None, max_age_s: float, now: float) -> str | None:
    """Why ``path`` is a leftover of a dead command (one phrase), or None to keep it."""
    age = now - _newest_mtime(path, st)
    if pid is not None:
        if pid_alive(pid) or age < PID_GRACE_S:
            return None
        return f"its process {pid} no longer runs"
    if age < max_age_s:
        return None
    return f"untouched for {age / 60:.0f} min" if max_age_s > 0 else "no other writer holds the folder's lock"


def _remove(path: Path, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def remove_stale(parent: str | os.PathLike[str], prefix_patterns: Iterable[str], *,
                 max_age_s: float = DEFAULT_MAX_AGE_S, now: float | None = None) -> list[Path]:
    """Remove the leftovers of killed commands in ``parent`` that match ``prefix_patterns`` (see the
    module doc for the rule); returns what was removed, each logged. A missing ``parent`` is no error."""
    # a pid pattern first: ``.x.{pid}.tmp`` and ``.x.*.tmp`` both match ``.x.123.tmp``, whose pid decides
    regexes = sorted((_compile(p) for p in prefix_patterns), key=lambda rx: "pid" not in rx.groupindex)
    folder = Path(parent)
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    now = time.time() if now is None else now
    removed: list[Path] = []
    for name in names:
        match = next((m for rx in regexes if (m := rx.fullmatch(name))), None)
        if match is None:
            continue
        path = folder / name
        try:
            st = os.lstat(path)
            pid = int(match["pid"]) if "pid" in match.re.groupindex else None
            why = _why_stale(path, st, pid, max_age_s, now)
            if why is None:
                continue
            _remove(path, st)
        except FileNotFoundError:  # removed meanwhile (by its owner finishing, or another cleaner)
            continue
        except OSError as exc:
            log.warning("left %s in place: it looks like a leftover of a killed command, but removing it "
                        "failed: %s", path, exc)
            continue
        log.info("removed %s, left by a killed command (%s)", path, why)
        removed.append(path)
    return removed
