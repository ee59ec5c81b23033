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

File modes (one policy, docs/reliability.md): run directories and their folders ``0750``, files
``0640`` — JSON and Parquet alike — each narrowed by the user's umask when it is stricter
(:func:`file_mode`, :func:`dir_mode`). Sweep folders and calibration profiles take the same modes,
through :func:`write_text_atomic` and :func:`open_append`, which also never write through a link.

A host becomes a file name (``telemetry/<host>.parquet``, ``<host>.meta.json``): :meth:`RunDir.telemetry_file`
and :meth:`RunDir.telemetry_meta` refuse one that is not a single path component
(:func:`powertrain.core.names.check_name`: ``--host ../../x`` would write outside the run), whoever asks —
the sampler, an importer, a test. :func:`read_json` reads regular files only (a FIFO would hang it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import operator
import os
import socket
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

from powertrain.core.files import read_regular_bytes
from powertrain.core.names import check_name
from powertrain.store.leftovers import pid_alive, remove_stale
from powertrain.store.targets import WriteRefused, refuse_link
from powertrain.store.validate import DamagedRun, parse_run_json

STATUSES = ("running", "ok", "failed")
DIR_MODE = 0o750
FILE_MODE = 0o640


def current_umask() -> int:
    """This process's umask, read without changing it (``/proc``); set-and-restore where /proc lacks it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # not thread-safe, hence only the fallback
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of every file powertrain writes into a run: 0640, or stricter where the umask is."""
    return FILE_MODE & ~current_umask()


def dir_mode() -> int:
    """Mode of every folder powertrain creates for a run: 0750, or stricter where the umask is."""
    return DIR_MODE & ~current_umask()


def set_file_mode(path: str | os.PathLike[str]) -> None:
    """Give a file powertrain wrote the policy's mode (call before renaming it into place)."""
    os.chmod(path, file_mode())


def make_dir(path: str | os.PathLike[str]) -> Path:
    """Create a folder (and missing parents) with the policy's mode; an existing folder is left as it is."""
    p = Path(path)
    if p.is_dir():
        return p
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        p.mkdir(mode=0o700)
    except FileExistsError:
        if not p.is_dir():
            raise
        return p
    os.chmod(p, dir_mode())
    return p


@contextlib.contextmanager
def _replaced_atomically(path: Path) -> Iterator[IO[str]]:
    """A text file to write that replaces ``path`` when the block ends (never half of one), with the
    policy's mode; on any error the temporary file is removed and ``path`` is left as it was. What a
    killed write of ``path`` left (``.NAME.XXXXXXXX.tmp``) is removed first (:func:`_remove_own_leftovers`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_own_leftovers(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# (folder, name) whose leftovers this process has removed: a file rewritten every few seconds (a host's
# meta.json) lists its folder once, not at every write
_CLEANED: set[tuple[str, str]] = set()
_CLEANED_MAX = 10_000
# a sweep's folders of one file per run, whose leftovers the sweep removes under its lock (launch.sweep)
_SWEEP_PER_RUN = (".specs", ".launch")


def _remove_own_leftovers(path: Path) -> None:
    """Remove the temporary files of killed writes of ``path``: ``.NAME.`` + mkstemp's 8 characters +
    ``.tmp`` (no pid: :func:`~powertrain.store.leftovers.remove_stale` removes one untouched for an hour;
    a live write fills its file in milliseconds, so none is a live writer's). Once per file and process.

    Not in a sweep's ``.specs``/``.launch`` folders: the sweep removes those under its lock whatever
    their age, and listing a folder of one file per run at each run's write would make a sweep quadratic
    in its runs (30 000 entries: 23 ms a listing)."""
    key = (str(path.parent), path.name)
    if key in _CLEANED or path.parent.name in _SWEEP_PER_RUN:
        return
    if len(_CLEANED) >= _CLEANED_MAX:
        _CLEANED.clear()
    _CLEANED.add(key)
    remove_stale(path.parent, [f".{path.name}.????????.tmp"])


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so readers see the old file or the new one, never half of one."""
    with _replaced_atomically(path) as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
        f.write("\n")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` at ``path`` as :func:`write_json_atomic` writes JSON (the policy's mode whatever the
    umask, all or nothing); a symbolic link at ``path`` is refused (:class:`WriteRefused`), its target
    untouched."""
    p = refuse_link(path)
    with _replaced_atomically(p) as f:
        f.write(text)
    return p


def open_append(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a log at ``path`` for appending, created with the policy's mode. A symbolic link, a FIFO or
    anything but a regular file there is refused (:class:`WriteRefused`): ``O_NOFOLLOW`` means not even a
    link planted after a check is followed, and a FIFO would block the writer."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, file_mode())
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(path)
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # ENXIO: a FIFO nobody reads
            raise WriteRefused(f"{path} is not a regular file; remove it (the log is written afresh)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WriteRefused(f"{path} is not a regular file; remove it (the log is written afresh)")
    os.set_blocking(fd, True)
    with contextlib.suppress(PermissionError):  # a log an older powertrain created under another umask
        os.fchmod(fd, file_mode())
    return os.fdopen(fd, "ab")


def read_json(path: Path) -> Any:
    """The JSON document in the regular file ``path`` (a FIFO or device there: ``NotRegularFile``)."""
    return json.loads(read_regular_bytes(path))


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
        """``telemetry/<host>.parquet``; a host that is not one path component is ``BadName``."""
        return self.telemetry_dir / f"{check_name(host, 'host')}.parquet"

    def telemetry_meta(self, host: str) -> Path:
        """``telemetry/<host>.meta.json``; a host that is not one path component is ``BadName``."""
        return self.telemetry_dir / f"{check_name(host, 'host')}.meta.json"

    def events_file(self, rank: int) -> Path:
        """``events/rank-<r>.parquet``; a rank is an integer (``operator.index``: text such as ``../x`` is a
        ``TypeError``, never part of a path)."""
        return self.events_dir / f"rank-{operator.index(rank)}.parquet"

    def create(self) -> RunDir:
        for d in (self.path, self.telemetry_dir, self.events_dir, self.logs_dir):
            make_dir(d)
        return self

    def exists(self) -> bool:
        return self.run_json.is_file()

    def read(self) -> dict[str, Any]:
        """``run.json``, checked (:func:`powertrain.store.validate.parse_run_json`): a damaged one is a
        :class:`~powertrain.store.validate.DamagedRun` (``RUN: run.json: problem``)."""
        if not self.run_json.exists():
            raise FileNotFoundError(
                f"{self.path} is not a run directory (no run.json). "
                "Point at a folder written by `powertrain monitor`, `run`, `sweep` or `import`."
            )
        info, problems = parse_run_json(self.run_json)
        if info is None:
            raise DamagedRun(self.path, problems)
        return info

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
        owner_gone = owner.get("host") == default_host() and owner.get("pid") and not pid_alive(int(owner["pid"]))
        if status == "running" and owner_gone:
            return "failed"
        return status


