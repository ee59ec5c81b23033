"""What every importer shares: the error it raises, column building, and writing a run directory.

An importer parses its source files into Arrow tables in memory, then hands them to
:class:`RunBuilder`, which writes a *standard* run directory (DESIGN.md "Data contracts")::

    <out>/run.json                   kind "import", status "ok", provenance (sources + sha256,
                                     what was mapped to which column, what was dropped, warnings)
    <out>/telemetry/<host>.parquet   TELEMETRY_SCHEMA rows, sorted by time then device
    <out>/telemetry/<host>.meta.json devices and supported fields of that host (as a sampler writes)
    <out>/events/rank-<r>.parquet    EVENTS_SCHEMA rows
    <out>/logs/                      empty (the sources stay where they are)

The directory is built in a hidden temporary sibling folder and renamed into place at the very end,
so a failure at any point (a malformed line, a full disk, Ctrl-C) never leaves a half run directory;
what a killed import left there (``.OUT.importing-*``) is removed by the next import to ``OUT``.

Every source is read through :func:`open_text` / :func:`open_binary` / :func:`read_text` /
:func:`sha256_of`, which refuse anything but a regular file before opening it (a FIFO would hang the
open, ``/dev/zero`` never end: "is a character device, not a regular file") and stop at a size cap
(:data:`DEFAULT_MAX_BYTES`, 2 GiB per source, set with :func:`byte_cap` / ``powertrain import
--max-bytes``) counted *while reading* — decompressed bytes for ``.gz`` — and at a line longer than
:data:`MAX_LINE_CHARS`. Either is a :class:`SourceTooLarge` naming the file.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import hashlib
import importlib.metadata
import io
import json
import logging
import math
import os
import platform
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from powertrain.core.files import NotRegularFile, require_regular_file
from powertrain.schema import EVENTS_SCHEMA, TELEMETRY_FIELDS, TELEMETRY_SCHEMA
from powertrain.store.leftovers import DEFAULT_MAX_AGE_S, remove_stale
from powertrain.store.rundir import RunDir, dir_mode, set_file_mode, write_json_atomic
from powertrain.store.targets import check_run_target

log = logging.getLogger(__name__)


class SourceFormatError(ValueError):
    """A source file is not what its importer expects; names the file, the line and the problem.

    ``line`` is 1-based (``None`` when the problem is not tied to one line, e.g. an empty file).
    """

    def __init__(self, path: str | os.PathLike[str], line: int | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


class ImportWarning_(UserWarning):
    """A tolerated quirk of a source (kept data, but the user should know)."""


# ---------------------------------------------------------------------------------------------
# Column helpers


def _masked(values: Any, typ: pa.DataType) -> pa.Array:
    """An Arrow array from a list (``None`` = null) or a float ndarray (NaN = null)."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.cast(typ)
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        mask = np.isnan(values)
        if pa.types.is_integer(typ):
            return pa.array(np.where(mask, 0, values).astype(np.int64), type=typ, mask=mask)
        return pa.array(values, type=typ, mask=mask)
    if isinstance(values, np.ndarray):
        return pa.array(values, type=typ)
    return pa.array(list(values), type=typ)


def telemetry_table(
    t_ns: Sequence[int] | np.ndarray,
    host: str | Sequence[str],
    device: str | Sequence[str],
    fields: Mapping[str, Any],
) -> pa.Table:
    """Build TELEMETRY_SCHEMA rows column-wise; fields not given are null; NaN/None are null."""
    t = np.asarray(t_ns, dtype=np.int64)
    n = len(t)
    unknown = set(fields) - set(TELEMETRY_FIELDS)
    if unknown:
        raise ValueError(f"not telemetry fields: {sorted(unknown)}")
    cols: list[pa.Array] = [pa.array(t, type=pa.int64())]
    for value in (host, device):
        cols.append(pa.array([value] * n, pa.string()) if isinstance(value, str) else _masked(value, pa.string()))
    for name, typ in TELEMETRY_FIELDS.items():
        cols.append(_masked(fields[name], typ) if name in fields else pa.nulls(n, typ))
    return pa.Table.from_arrays(cols, schema=TELEMETRY_SCHEMA)


def events_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """EVENTS_SCHEMA rows from dicts (missing keys are null; ``attrs`` dicts become JSON)."""
    out = []
    for r in rows:
        r = dict(r)
        if isinstance(r.get("attrs"), dict):
            r["attrs"] = json.dumps(r["attrs"], sort_keys=True)
        out.append(r)
    return pa.Table.from_pylist(out, schema=EVENTS_SCHEMA) if out else EVENTS_SCHEMA.empty_table()


def parse_float(text: str) -> float | None:
    """A number from a log cell; ``None`` for the ways tools write "unknown"."""
    s = text.strip()
    if not s or s.strip("[]").lower() in NULL_WORDS:
        return None
    return float(s)


NULL_WORDS = frozenset({"n/a", "na", "not supported", "unknown", "null", "none", "nan", "-", "insufficient permissions"})


DEFAULT_MAX_BYTES = 2 * 2**30  # per source file (decompressed), ``powertrain import --max-bytes``
MAX_LINE_CHARS = 64 * 2**20  # one line of a text source
_max_bytes: contextvars.ContextVar[int] = contextvars.ContextVar("powertrain_import_max_bytes",
                                                                 default=DEFAULT_MAX_BYTES)


class SourceTooLarge(SourceFormatError):
    """A source over the size cap (or a line over :data:`MAX_LINE_CHARS`); names the file and the cap."""


def _size_text(n: int) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.4g} {unit}"
    return f"{n} bytes"


def max_bytes() -> int:
    """The size cap per source now in force (bytes)."""
    return _max_bytes.get()


@contextlib.contextmanager
def byte_cap(limit: int | None) -> Iterator[int]:
    """Within the block, every source read stops at ``limit`` bytes (``None``: the default cap)."""
    n = DEFAULT_MAX_BYTES if limit is None else int(limit)
    if n <= 0:
        raise ValueError(f"--max-bytes must be positive, got {n}")
    token = _max_bytes.set(n)
    try:
        yield n
    finally:
        _max_bytes.reset(token)


def _too_large(path: Path, read: int) -> SourceTooLarge:
    cap = max_bytes()
    return SourceTooLarge(path, None, f"larger than the import size cap of {_size_text(cap)} ({cap} bytes; "
                                      f"stopped after reading {read} bytes): pass --max-bytes N to raise it")


class _CappedReader(io.RawIOBase):
    """A binary stream that raises :class:`SourceTooLarge` once more than the cap has been read."""

    def __init__(self, raw: Any, path: Path) -> None:
        super().__init__()
        self._raw = raw
        self._path = path
        self._cap = max_bytes()
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            data = self._raw.read(min(len(b), self._cap + 1 - self.count) or 1)
        except EOFError as exc:  # a truncated .gz
            raise SourceFormatError(self._path, None, f"truncated compressed file ({exc})") from None
        except OSError as exc:  # not gzip at all (gzip.BadGzipFile), or an I/O error
            what = "not a gzip file" if self._path.suffix == ".gz" and exc.errno is None else "unreadable"
            raise SourceFormatError(self._path, None, f"{what} ({exc.strerror or exc})") from None
        n = len(data)
        b[:n] = data
        self.count += n
        if self.count > self._cap:
            raise _too_large(self._path, self.count)
        return n

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def _require_regular(path: Path) -> None:
    """A FIFO, device or socket source is a :class:`SourceFormatError` naming what it is: not only the
    ``OSError`` :func:`~powertrain.core.files.require_regular_file` raises, which a format sniffer reads
    as "cannot open, so not this format" and reports as the wrong problem."""
    try:
        require_regular_file(path, "the source")
    except NotRegularFile as exc:
        raise SourceFormatError(path, None, str(exc).removeprefix(f"{path}: ")) from None


def open_binary(path: Path) -> io.BufferedReader:
    """Open a source as bytes (un-gzipping ``*.gz``), capped at :func:`max_bytes` while reading; anything
    but a regular file is refused first (a FIFO would hang the open, a device never end)."""
    _require_regular(path)
    if path.suffix == ".gz":
        import gzip

        raw: Any = gzip.open(path, "rb")  # noqa: SIM115 — closed by the wrapper
    else:
        raw = open(path, "rb")  # noqa: SIM115 — closed by the wrapper
    return io.BufferedReader(_CappedReader(raw, path), buffer_size=1 << 20)


class _CappedText(io.TextIOWrapper):
    """Text over :func:`open_binary`; a line longer than :data:`MAX_LINE_CHARS` is :class:`SourceTooLarge`."""

    def __init__(self, path: Path) -> None:
        super().__init__(open_binary(path), encoding="utf-8", errors="replace", newline="")
        self._path = path
        self._line = 0

    def readline(self, size: int | None = -1, /) -> str:  # type: ignore[override]
        limit = MAX_LINE_CHARS if size is None or size < 0 else min(size, MAX_LINE_CHARS)
        line = super().readline(limit)
        self._line += 1
        if len(line) >= MAX_LINE_CHARS and not line.endswith(("\n", "\r")) and (size is None or size < 0):
            raise SourceTooLarge(self._path, self._line, f"a line longer than {_size_text(MAX_LINE_CHARS)}: "
                                                         "not a text log of a format powertrain reads")
        return line

    def __next__(self) -> str:  # type: ignore[override]
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __iter__(self) -> _CappedText:  # type: ignore[override]
        return self


def open_text(path: Path) -> io.TextIOWrapper:
    """Open a source as text, transparently un-gzipping ``*.gz``; capped (see the module doc)."""
    return _CappedText(Path(path))


def read_text(path: Path) -> str:
    """The whole source as text (undecodable bytes replaced), capped at :func:`max_bytes`."""
    with open_binary(Path(path)) as f:
        return f.read().decode("utf-8", errors="replace")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open_binary(Path(path)) if Path(path).suffix != ".gz" else _raw_capped(Path(path)) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _raw_capped(path: Path) -> io.BufferedReader:
    """The file's own bytes (a ``.gz`` not decompressed: its sha256 is of the file), capped."""
    _require_regular(path)
    return io.BufferedReader(_CappedReader(open(path, "rb"), path), buffer_size=1 << 20)


def local_zone_name() -> str:
    """The machine's time zone, as an IANA name where it can be found (else the abbreviation)."""
    tz = os.environ.get("TZ")
    if tz and not tz.lstrip(":").startswith("/"):
        return tz.lstrip(":")
    # TZ=":/etc/localtime" (POSIX: a zone file's path) names a file like /etc/localtime itself
    zone_file = tz.lstrip(":") if tz else "/etc/localtime"
    try:
        link = os.path.realpath(zone_file)
        if "zoneinfo/" in link:
            return link.split("zoneinfo/", 1)[1]
    except OSError:
        pass
    try:
        return Path("/etc/timezone").read_text().strip() or "UTC"
    except OSError:
        return time.tzname[0] or "UTC"


def resolve_zone(name: str | None) -> tuple[dt.tzinfo, str]:
    """``(tzinfo, name)`` for ``--tz`` (IANA name, ``UTC`` or ``+HH:MM``); ``None`` = this machine's."""
    import zoneinfo

    label = name or local_zone_name()
    origin = "" if name else (f" (from $TZ={os.environ['TZ']!r}; pass --tz, or set TZ to an IANA name)"
                              if os.environ.get("TZ") else " (this machine's zone; pass --tz)")
    if label.upper() in ("UTC", "Z", "GMT"):
        return dt.UTC, "UTC"
    if label[:1] in "+-" and ":" in label:
        sign = 1 if label[0] == "+" else -1
        hh, mm = label[1:].split(":")
        return dt.timezone(sign * dt.timedelta(hours=int(hh), minutes=int(mm))), label
    try:
        return zoneinfo.ZoneInfo(label), label
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {label!r}{origin}: use an IANA name like Europe/Berlin, UTC or "
                         "+02:00") from exc


def iso(t_ns: int | None) -> str | None:
    if t_ns is None:
        return None
    return dt.datetime.fromtimestamp(t_ns / 1e9, tz=dt.UTC).isoformat()


ANCHOR_HELP = "pass --anchor TIME (ISO-8601 such as 2024-05-01T10:00:00, or epoch seconds; anchor_ns= in Python)"


def parse_anchor(text: str, tz: str | None = None) -> int:
    """``--anchor`` text → epoch ns: epoch seconds, or ISO-8601 (a time without a zone is read in ``tz``,
    the same zone as the other sources' local stamps)."""
    s = text.strip()
    try:
        sec = float(s)
    except ValueError:
        try:
            d = dt.datetime.fromisoformat(s)
        except ValueError:
            raise ValueError(f"--anchor {text!r} is neither ISO-8601 (2024-05-01T10:00:00[+02:00]) "
                             "nor epoch seconds") from None
        if d.tzinfo is None:
            d = d.replace(tzinfo=resolve_zone(tz)[0])
        t_ns = (d - _EPOCH) // dt.timedelta(microseconds=1) * 1000
    else:
        if not math.isfinite(sec):
            raise ValueError(f"--anchor {text!r} is not a time: give ISO-8601 or epoch seconds")
        t_ns = round(sec * 1e9)
    if t_ns < _Y2001_NS:  # an anchor in 1970 is the very mistake --anchor exists to avoid
        raise ValueError(f"--anchor {text!r} is before 2001: give epoch seconds (like 1714557600) or ISO-8601")
    return t_ns


def reads_zone(text: str) -> bool:
    """Whether :func:`parse_anchor` reads ``text`` in its ``tz``: an ISO-8601 time without a zone of its own
    (epoch seconds and a time with a zone need none)."""
    s = text.strip()
    try:
        float(s)
    except ValueError:
        try:
            return dt.datetime.fromisoformat(s).tzinfo is None
        except ValueError:
            return False
    return False


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_Y2001_NS = 978_307_200 * 1_000_000_000


def mark_window(events: list[dict[str, Any]], warmup_steps: int | None, b: RunBuilder, *,
                declared: str | None = None) -> None:
    """Mark the measurement protocol's windows on imported events, as the built-in trainer does
    (``powertrain.workload.run_loop``): the first ``warmup_steps`` distinct step indices are
    ``window="warmup"``, every later one ``"measured"``. Every event that carries a step index (the
    step itself, its phases, its collectives) takes its step's window; events without one (the whole
    run, evals) stay outside the protocol (null). ``declared`` names the window the format itself
    declares, when the caller passed only the events inside it (e.g. MLPerf's run_start → run_stop).
    Records what was done in ``run.json["measured_window"]``; a warm-up that leaves no measured step
    is refused."""
    n = 0 if warmup_steps is None else int(warmup_steps)
    if n < 0:
        raise ValueError(f"--warmup-steps must be 0 or more, got {n}")
    steps = sorted({int(e["step"]) for e in events if e.get("kind") == "step" and e.get("step") is not None})
    if not steps:
        return
    if n >= len(steps):
        raise ValueError(f"--warmup-steps {n} leaves no measured step: the import has {len(steps)} step(s); "
                         "pass a smaller --warmup-steps")
    last_warm = steps[n - 1] if n else None
    for e in events:
        if e.get("step") is None:
            continue
        e["window"] = "warmup" if last_warm is not None and int(e["step"]) <= last_warm else "measured"
    b.info["warmup_steps"] = n  # the run's declared warm-up, the key powertrain.analyze.steps reads
    b.info["measured_window"] = {
        "warmup_steps": n,
        "measured_steps": len(steps) - n,
        "first_measured_step": steps[n],
        "rule": "import: every logged step is measured except the first --warmup-steps (default 0)"
                + (f"; only steps inside {declared}" if declared else ""),
    }


def set_job_devices(b: RunBuilder, count: int | None, source: str) -> None:
    """Record the job's device count (what per-device throughput divides by) in ``run.json``.

    ``None`` with a ``source`` saying why: per-device figures of this import are then unknown, not
    the job's total divided by the few ranks that happened to log."""
    b.info["job_device_count"] = count
    b.info["job_device_count_source"] = source


# ---------------------------------------------------------------------------------------------
# The run directory builder


@dataclass
class Source:
    path: str
    sha256: str
    bytes: int
    role: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes, "role": self.role}


@dataclass
class RunBuilder:
    """Collects what an importer parsed, then writes one run directory atomically (:meth:`write`)."""

    format: str
    name: str | None = None
    sources: list[Source] = field(default_factory=list)
    mapped: dict[str, str] = field(default_factory=dict)  # source field -> column / event mapping
    dropped: list[str] = field(default_factory=list)  # what was in the source and not imported, and why
    warnings: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # extra run.json fields (summaries, detected events)
    devices: list[dict[str, Any]] = field(default_factory=list)
    # Whether a time was read in the import's zone (a stamp without its own zone), and for each source
    # that has none, why: --tz is refused when no source reads it (registry.build).
    read_local_times: bool = False
    no_local_times: list[str] = field(default_factory=list)
    _telemetry: dict[str, list[pa.Table]] = field(default_factory=dict)
    _events: list[pa.Table] = field(default_factory=list)

    def add_source(self, path: str | os.PathLike[str], role: str = "data") -> Path:
        p = Path(path)
        digest = sha256_of(p)
        self.sources.append(Source(str(p.resolve()), digest, p.stat().st_size, role))
        return p

    def warn(self, message: str) -> None:
        """Record a tolerated quirk in run.json and show it as a Python warning."""
        self.warnings.append(message)
        warnings.warn(message, ImportWarning_, stacklevel=2)

    def times_without_zone(self, path: str | os.PathLike[str], why: str) -> None:
        """Record that ``path`` holds no local wall-clock time (``why``: what its times are instead)."""
        self.no_local_times.append(f"{Path(path).name}: {why}")

    def drop(self, what: str) -> None:
        if what not in self.dropped:
            self.dropped.append(what)

    def add_telemetry(self, table: pa.Table) -> None:
        """Add telemetry rows (any hosts); rows are split into one file per host on write."""
        if table.num_rows == 0:
            return
        for host in table.column("host").unique().to_pylist():
            part = table.filter(pc.equal(table.column("host"), host))
            self._telemetry.setdefault(host, []).append(part)

    def add_events(self, table: pa.Table) -> None:
        if table.num_rows:
            self._events.append(table)

    def add_device(self, host: str, device: str, kind: str = "gpu", vendor: str | None = None, **extra: Any) -> None:
        self.devices.append({"host": host, "device": device, "kind": kind, "vendor": vendor, **extra})

    # -- the run's window and data quality (run.json "window", "data_quality") -------------------
    def set_window(self, t0_ns: int, t1_ns: int, source: str) -> None:
        """Record the run's own measurement window: ``run.json["window"] = {t0_ns, t1_ns, source}``.

        ``source`` says in human words where the window comes from (``"MLPerf run_start → run_stop"``);
        every energy, power and time figure of the run (import, summarize, report) is over it."""
        t0, t1 = int(t0_ns), int(t1_ns)
        if t1 < t0:
            raise ValueError(f"window ends before it starts ({t0} > {t1}): {source}")
        if not source:
            raise ValueError("a window needs a source: say where its start and stop come from")
        self.info["window"] = {"t0_ns": t0, "t1_ns": t1, "source": source}

    @property
    def data_quality(self) -> dict[str, Any]:
        """``run.json["data_quality"]`` (created on first use): what cleaning removed, per field and device."""
        dq: dict[str, Any] = self.info.setdefault("data_quality", {})
        return dq

    def count_quality(self, key: str, n: int, *, section: str = "readings") -> None:
        """Add ``n`` to ``data_quality[section][key]`` (e.g. duplicate readings dropped); 0 is recorded too."""
        sec = self.data_quality.setdefault(section, {})
        sec[key] = int(sec.get(key, 0)) + int(n)

    def device_quality(self, host: str, device: str, **values: Any) -> dict[str, Any]:
        """The ``data_quality["devices"]`` entry of one device, updated with ``values``: integer counts
        add up over calls, anything else (``edge_held_s``, ``why_null``) is set."""
        devs: list[dict[str, Any]] = self.data_quality.setdefault("devices", [])
        entry = next((d for d in devs if d["host"] == host and d["device"] == device), None)
        if entry is None:
            entry = {"host": host, "device": device}
            devs.append(entry)
        for k, v in values.items():
            if isinstance(v, int) and not isinstance(v, bool) and isinstance(entry.get(k), int):
                entry[k] += v
            else:
                entry[k] = v
        return entry

    # -- results ------------------------------------------------------------------------------
    def telemetry(self) -> pa.Table:
        tables = [t for ts in self._telemetry.values() for t in ts]
        return pa.concat_tables(tables) if tables else TELEMETRY_SCHEMA.empty_table()

    def events(self) -> pa.Table:
        return pa.concat_tables(self._events) if self._events else EVENTS_SCHEMA.empty_table()

    def write(self, out: str | os.PathLike[str], *, force: bool = False) -> Path:
        """Write the run directory at ``out`` atomically; refuses to overwrite an existing run.

        ``force`` replaces an earlier *import* there (never a measured run or a prediction), and
        never a folder inside another run (:func:`powertrain.store.targets.check_run_target`). What a
        killed import left beside ``out`` is cleaned first (:func:`powertrain.store.leftovers.remove_stale`),
        and an import it was replacing put back."""
        out = Path(out).absolute()
        _restore_replaced(out)  # before the check: the import put back is what --force is asked about
        check_run_target(out, "import", force=force)
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out.parent, [f".{out.name}.importing-*", f".{out.name}.replaced-*"])  # of a killed import
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.importing-"))
        old = None
        try:
            os.chmod(tmp, dir_mode())
            self._write_into(RunDir(tmp).create(), final_path=out)
            if out.exists():  # empty, or an import replaced with force (checked above)
                old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.replaced-"))
                os.rename(out, old / "run")
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and not out.exists():
                os.rename(old / "run", out)  # put the replaced import back
            raise
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        return out

    def _write_into(self, run: RunDir, final_path: Path) -> None:
        t_min: int | None = None
        t_max: int | None = None
        host_devices: dict[str, list[dict[str, Any]]] = {}
        fields_supported: set[str] = set()
        for host, tables in sorted(self._telemetry.items()):
            table = pa.concat_tables(tables).sort_by([("t_ns", "ascending"), ("device", "ascending")])
            pq.write_table(table, run.telemetry_file(host), compression="zstd")
            set_file_mode(run.telemetry_file(host))
            t = table.column("t_ns")
            lo, hi = pc.min(t).as_py(), pc.max(t).as_py()
            t_min = lo if t_min is None else min(t_min, lo)
            t_max = hi if t_max is None else max(t_max, hi)
            present = [f for f in TELEMETRY_FIELDS if table.column(f).null_count < table.num_rows]
            fields_supported.update(present)
            devs = []
            for dev in sorted(table.column("device").unique().to_pylist()):
                sub = table.filter(pc.equal(table.column("device"), dev))
                known = next((d for d in self.devices if d["host"] == host and d["device"] == dev), {})
                dev_info = {k: v for k, v in known.items() if k != "host"}
                dev_info.setdefault("device", dev)
                dev_info.setdefault("kind", "gpu" if dev.startswith("gpu") else dev)
                dev_info["supported"] = [f for f in present if sub.column(f).null_count < sub.num_rows]
                dev_info["samples"] = sub.num_rows
                devs.append(dev_info)
            host_devices[host] = devs
            write_json_atomic(run.telemetry_meta(host), {
                "host": host, "source": f"import:{self.format}", "devices": devs, "notes": [],
                "samples": table.num_rows, "t_first_ns": lo, "t_last_ns": hi, "finished": True,
                "incidents": [],
            })
        events = self.events()
        for rank in sorted(set(events.column("rank").to_pylist())) if events.num_rows else []:
            sub = events.filter(pc.equal(events.column("rank"), rank))
            sub = sub.sort_by([("t_start_ns", "ascending")])
            pq.write_table(sub, run.events_file(rank), compression="zstd")
            set_file_mode(run.events_file(rank))
            lo, hi = pc.min(sub.column("t_start_ns")).as_py(), pc.max(sub.column("t_end_ns")).as_py()
            t_min = lo if t_min is None else min(t_min, lo)
            t_max = hi if t_max is None else max(t_max, hi)
        now = time.time_ns()
        info: dict[str, Any] = {
            "schema": "powertrain.run/1",
            "kind": "import",
            "name": self.name or final_path.name,
            "status": "ok",
            "reason": None,
            "start_ns": t_min,
            "start": iso(t_min),
            "end_ns": t_max,
            "end": iso(t_max),
            "hosts": sorted(self._telemetry),
            "devices": [{"host": h, **d} for h, ds in host_devices.items() for d in ds],
            "fields_supported": [f for f in TELEMETRY_FIELDS if f in fields_supported],
            "ranks": sorted(set(events.column("rank").to_pylist())) if events.num_rows else [],
            "import": {
                "format": self.format,
                "imported_ns": now,
                "imported": iso(now),
                "sources": [s.to_dict() for s in self.sources],
                "mapped": self.mapped,
                "dropped": self.dropped,
                "warnings": self.warnings,
                "telemetry_rows": sum(t.num_rows for ts in self._telemetry.values() for t in ts),
                "event_rows": events.num_rows,
                "software": _versions(),
            },
            "platform": {"os": platform.platform(), "machine": platform.machine()},
        }
        info.update(self.info)
        run.write(info)


def _restore_replaced(out: Path) -> None:
    """Put back an import that a ``--force`` import killed between its two renames left in
    ``.OUT.replaced-*/run`` (``out`` itself then missing), before :func:`remove_stale` would remove it as a
    leftover. Only one untouched for :data:`~powertrain.store.leftovers.DEFAULT_MAX_AGE_S`: a live import
    holds that state for the instant between two renames."""
    if out.exists() or out.is_symlink() or not out.parent.is_dir():
        return
    prefix = f".{out.name}.replaced-"
    for old in sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix)):
        try:
            stale = time.time() - os.lstat(old).st_mtime >= DEFAULT_MAX_AGE_S
            if stale and (old / "run").is_dir() and not (old / "run").is_symlink():
                os.rename(old / "run", out)
                with contextlib.suppress(OSError):
                    old.rmdir()
                log.warning("put back %s from %s, left there by an import that was killed while replacing it",
                            out, old)
                return
        except OSError as exc:
            log.warning("could not put back %s from %s: %s", out, old, exc)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("powertrain", "pyarrow", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out
