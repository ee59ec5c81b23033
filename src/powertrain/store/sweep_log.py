"""A sweep folder's state on disk: ``sweep.json`` (the plan, written whole) and ``sweep.state.jsonl``
(every change since, one JSON line each), read back as one record.

A sweep of 100 000 points has a ``sweep.json`` of hundreds of MB; rewriting it after every run made the
sweep quadratic in its size. So the plan and the statuses it started with are written once
(:func:`write_compacted`), each later change is one appended line (:func:`append_change`, a few hundred
bytes, fsynced), and :func:`read_sweep` replays the lines onto ``sweep.json``. The writer compacts (writes
``sweep.json`` with the changes folded in and drops the log) when it starts and when it ends.

A line is ``{"gen": G, "id": RUN, "set": {...}}`` (fields of one run) or ``{"gen": G, "top": {...}}``
(keys of the sweep record, such as ``idle_baseline``); ``sweep.json`` holds ``log_generation: G``, and
only lines of its generation are replayed: a compaction writes ``G + 1`` before it removes the log, so a
crash between the two never replays changes already folded in. A torn last line (a crash mid-append, a
full disk) is skipped with a warning, and the next append first cuts it off: earlier lines are never
lost, and only the change being written when the crash came is.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import IO, Any, BinaryIO

from powertrain.store.rundir import _replaced_atomically as replaced_atomically
from powertrain.store.rundir import open_append, read_json, write_json_atomic
from powertrain.store.targets import refuse_link

log = logging.getLogger(__name__)

STATE_FILE = "sweep.json"
LOG_FILE = "sweep.state.jsonl"
GENERATION = "log_generation"
# a plan of more runs than this is written one run per line, not indented: read by programs, a third of
# the size, and written by the C encoder
INDENT_MAX_RUNS = 2000


def _replay_line(data: dict[str, Any], index: dict[str, dict[str, Any]], change: Any, gen: int) -> bool:
    """Apply one change to ``data``; False when it is not a change of this generation's shape."""
    if not isinstance(change, dict) or change.get("gen") != gen:
        return False
    if isinstance(change.get("top"), dict):
        data.update(change["top"])
    elif isinstance(change.get("set"), dict) and change.get("id") in index:
        index[change["id"]].update(change["set"])
    else:
        return False
    if isinstance(change.get("updated"), str):
        data["updated"] = change["updated"]
    return True


def _open_log(path: Path) -> BinaryIO | None:
    """The log for reading, or None when there is none; a link, FIFO or anything but a regular file
    there is skipped with a warning (reading a FIFO would block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: not read (%s); the sweep's state is the one in sweep.json", path, exc.strerror)
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        log.warning("%s: not a regular file, not read; the sweep's state is the one in sweep.json", path)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def replay(folder: Path, data: dict[str, Any]) -> int:
    """Apply the changes logged in ``folder`` since ``data`` (its ``sweep.json``) was written; returns how
    many. A line that cannot be read is skipped with a warning naming it."""
    path = folder / LOG_FILE
    f = _open_log(path)
    if f is None:
        return 0
    gen = data.get(GENERATION, 0)
    index: dict[str, dict[str, Any]] = {str(r.get("id")): r for r in data.get("runs", []) if isinstance(r, dict)}
    applied = 0
    with f:
        for n, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                log.warning("%s:%d: a torn last line (the sweep stopped while writing it) is ignored", path, n)
                break
            try:
                change = json.loads(raw)
            except ValueError:
                log.warning("%s:%d: not a JSON line, ignored", path, n)
                continue
            if _replay_line(data, index, change, gen):
                applied += 1
    return applied


def read_sweep(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sweep record of ``folder`` — ``sweep.json`` with its logged changes applied — or None when
    the folder holds no ``sweep.json``."""
    folder = Path(folder)
    path = folder / STATE_FILE
    if not path.is_file():
        return None
    data = read_json(path)
    if isinstance(data, dict):
        replay(folder, data)
    return data


def _write_lines(f: IO[str], data: dict[str, Any]) -> None:
    """``data`` as JSON with one run per line: a big plan is written run by run (never one string of all
    of it) by the C encoder, which an indented dump does not use."""
    top = {k: v for k, v in data.items() if k != "runs"}
    f.write(json.dumps(top, default=str)[:-1] + (", " if top else "") + '"runs": [\n')
    for i, run in enumerate(data.get("runs", [])):
        f.write((",\n" if i else "") + json.dumps(run, default=str))
    f.write("\n]}\n")


def write_compacted(folder: Path, data: dict[str, Any]) -> None:
    """Write ``data`` whole as ``sweep.json`` (atomically, a link refused, the project's mode) under a
    new log generation, then drop the log whose changes it holds."""
    data[GENERATION] = int(data.get(GENERATION, 0)) + 1
    path = refuse_link(folder / STATE_FILE)
    if len(data.get("runs", ())) <= INDENT_MAX_RUNS:
        write_json_atomic(path, data)
    else:
        with replaced_atomically(path) as f:
            _write_lines(f, data)
    # removing a link planted here would not write through it: no refusal needed
    (folder / LOG_FILE).unlink(missing_ok=True)


def _cut_torn_tail(path: Path, fd: int) -> None:
    """A log whose last line has no newline ends in a torn write: cut it off (through ``fd``, the log open
    for appending) before a line goes after it."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    rfd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # the append fd cannot read
    try:
        tail = os.pread(rfd, min(size, 1 << 16), max(0, size - (1 << 16)))
    finally:
        os.close(rfd)
    if tail.endswith(b"\n"):
        return
    keep = size - len(tail) + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
    log.warning("%s: a torn last line (the sweep stopped while writing it) is cut off", path)
    os.ftruncate(fd, keep)


def append_change(folder: Path, change: dict[str, Any], gen: int) -> None:
    """Append one change (one line, fsynced) to the folder's log; a link or FIFO there is refused."""
    path = folder / LOG_FILE
    line = json.dumps({"gen": gen, **change}, default=str, separators=(",", ":")) + "\n"
    with open_append(path) as f:
        _cut_torn_tail(path, f.fileno())
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())
