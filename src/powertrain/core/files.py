"""Regular files only where a file is expected.

Opening a FIFO for reading waits until something writes to it — for ever, when nothing does — and a
character device (``/dev/zero``, a terminal) or a socket is no file of data either: a spec, a run's
``run.json``, a telemetry or events Parquet file that is one of those would hang the command, or read
without end. :func:`require_regular_file` looks first, with ``os.stat`` (which opens nothing: a link is
judged by what it points to), and refuses anything but a regular file with one line naming the file and
what it is (``is a FIFO, not a regular file``). :func:`open_regular` opens without blocking and checks the
open file itself, so a FIFO put in place between a check and the open is refused too.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISLNK, "a symbolic link"))


class NotRegularFile(OSError, ValueError):
    """A path where a regular file was expected holds something else; ``str()`` is one line naming it.

    An ``OSError`` (what a failed open raises) and a ``ValueError`` (what refusing bad input raises), so
    either handler of a caller catches it."""


def file_kind(mode: int) -> str:
    """``a FIFO (named pipe)``, ``a character device``, … or ``a regular file`` for an ``st_mode``."""
    return next((word for test, word in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode)
                else "not a file")


def _refusal(path: str | os.PathLike[str], mode: int, what: str | None) -> NotRegularFile:
    hint = f"; give {what} as a regular file" if what else ""
    return NotRegularFile(f"{path}: is {file_kind(mode)}, not a regular file{hint}")


def require_regular_file(path: str | os.PathLike[str], what: str | None = None) -> os.stat_result:
    """``path``'s ``os.stat`` when it is a regular file (or a link to one); else :class:`NotRegularFile`,
    whose line ends ``give WHAT as a regular file`` when ``what`` is given.

    Nothing is opened. A missing file is the ``FileNotFoundError`` of ``os.stat``."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refusal(path, st.st_mode, what)
    return st


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (or a link to one); False when missing or unreadable."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def open_regular(path: str | os.PathLike[str], what: str | None = None) -> BinaryIO:
    """``path`` opened for reading (binary) when it is a regular file; else :class:`NotRegularFile`.

    Opened with ``O_NONBLOCK`` (a FIFO's open returns at once instead of waiting for a writer) and
    checked with ``fstat`` on the open file; blocking reads are restored for the regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket cannot be opened at all
            raise _refusal(path, os.stat(path).st_mode, what) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refusal(path, mode, what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(path: str | os.PathLike[str], what: str | None = None, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit + 1`` when ``limit`` is given, so a caller
    can tell that it is over); anything but a regular file is :class:`NotRegularFile`."""
    with open_regular(path, what) as f:
        return f.read() if limit is None else f.read(limit + 1)


def read_regular_text(path: str | os.PathLike[str], what: str | None = None, encoding: str = "utf-8") -> str:
    """:func:`read_regular_bytes` decoded (a ``UnicodeDecodeError`` names the byte)."""
    return read_regular_bytes(path, what).decode(encoding)
