"""Crash-safe streaming of rows to Parquet, and the readers that see through it.

A writer appends rows in memory and, every ``flush_s``, rewrites the *current segment*
``<name>.parts/seg-NNNNNN.parquet`` (write to a temporary file, then rename), so at any moment every
file on disk is a complete Parquet file and a ``kill -9`` loses at most the rows since the last flush.
A new segment starts every ``segment_s`` so the rewrite stays small. ``close()`` (or
:func:`finalize`, for a writer that was killed) compacts the segments into ``<name>.parquet`` and
removes the part folder. Readers prefer the compacted file and fall back to the segments.

Readers open regular files only: a FIFO, device or socket where a stream's file belongs is a
:class:`~powertrain.core.files.NotRegularFile` (opening a FIFO would wait for a writer for ever), and
one among the segments is skipped as a torn segment is. ``store.validate`` names either as damage first.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from powertrain.core.files import is_regular_file, require_regular_file
from powertrain.core.names import check_name
from powertrain.schema import ADDED_LATER, EVENTS_SCHEMA, POWER_SAMPLES_SCHEMA, TELEMETRY_SCHEMA
from powertrain.store.leftovers import remove_stale
from powertrain.store.rundir import set_file_mode


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        set_file_mode(tmp)  # the one mode policy (store.rundir): 0640 less the umask, as JSON
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left taking space
        tmp.unlink(missing_ok=True)
        raise


class StreamingTableWriter:
    """Append rows of a fixed schema to ``<base>.parquet`` crash-safely (see module doc)."""

    def __init__(self, base: Path, schema: pa.Schema, flush_s: float = 1.0, segment_s: float = 15.0) -> None:
        self.base = Path(base)
        self.schema = schema
        self.flush_s = flush_s
        self.segment_s = segment_s
        self.parts = self.base.with_name(self.base.name + ".parts")
        self.parts.mkdir(parents=True, exist_ok=True)
        # a killed writer's temporary segment, whichever segment it was: done once here, not in
        # _write_atomic (each flush, every second, would list a folder of up to 5 760 segments a day)
        remove_stale(self.parts, [".seg-*.parquet.{pid}.tmp"])
        existing = sorted(self.parts.glob("seg-*.parquet"))
        self._seg_index = int(existing[-1].stem.split("-")[1]) + 1 if existing else 0
        self._seg_batches: list[pa.RecordBatch] = []
        self._pending: list[Mapping[str, Any]] = []
        self._seg_started = time.monotonic()
        self._last_flush = time.monotonic()
        self.rows_written = 0

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._pending.extend(rows)

    def maybe_flush(self) -> bool:
        """Flush if ``flush_s`` has passed since the last flush; returns whether it did."""
        if time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        now = time.monotonic()
        self._last_flush = now
        if self._pending:
            self._seg_batches.append(pa.RecordBatch.from_pylist(self._pending, schema=self.schema))
            self.rows_written += len(self._pending)
            self._pending = []
            table = pa.Table.from_batches(self._seg_batches, schema=self.schema)
            _write_atomic(table, self.parts / f"seg-{self._seg_index:06d}.parquet")
        if self._seg_batches and now - self._seg_started >= self.segment_s:
            self._seg_index += 1
            self._seg_batches = []
            self._seg_started = now

    def close(self) -> Path:
        self.flush()
        return finalize(self.base, self.schema)


# Rows per row group of a compacted file: a few segments' worth, so compaction holds at most this
# many rows (plus one segment) in memory however long the run was.
COMPACT_ROW_GROUP_ROWS = 1 << 16


def finalize(base: Path, schema: pa.Schema) -> Path:
    """Compact ``<base>.parts/`` into ``<base>.parquet`` (idempotent; safe after a crash).

    Streams: an earlier compacted file is copied one row group at a time and each segment (one
    ``segment_s`` of rows) is read, appended and dropped in turn, so memory stays bounded by a row
    group and a segment, not by the run's length."""
    base = Path(base)
    final = base.with_name(base.name + ".parquet") if base.suffix != ".parquet" else base
    parts = final.with_name(final.name.removesuffix(".parquet") + ".parts")
    if not parts.is_dir():
        return final
    segments = sorted(parts.glob("seg-*.parquet"))
    remove_stale(final.parent, [f".{final.name}.{{pid}}.tmp"])  # a compaction that was killed
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            buffer = _RowGroupBuffer(writer, schema)
            if _present(final):  # an earlier finalize ran but died before removing the parts
                pf = pq.ParquetFile(final)
                for i in range(pf.num_row_groups):
                    buffer.add(pf.read_row_group(i))
            for seg in segments:
                t = _read_readable(seg)
                if t is not None:
                    buffer.add(t)
            buffer.flush()
        set_file_mode(tmp)  # the one mode policy (store.rundir), as _write_atomic
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    shutil.rmtree(parts, ignore_errors=True)
    return final


class _RowGroupBuffer:
    """Collects tables of ``schema`` and writes them as row groups of ``COMPACT_ROW_GROUP_ROWS`` rows."""

    def __init__(self, writer: pq.ParquetWriter, schema: pa.Schema) -> None:
        self.writer, self.schema = writer, schema
        self.tables: list[pa.Table] = []
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        self.tables.append(conform(table, self.schema))
        self.rows += table.num_rows
        if self.rows >= COMPACT_ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.tables:
            self.writer.write_table(pa.concat_tables(self.tables), row_group_size=COMPACT_ROW_GROUP_ROWS)
        self.tables, self.rows = [], 0


def _present(path: Path) -> bool:
    """Whether a stream's compacted file is there to read: True for a regular file, False for nothing
    (or a folder, which ``store.validate`` names); a FIFO, device or socket is :class:`NotRegularFile`."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False  # missing, or not reachable: as Path.is_file() said before
    if stat.S_ISDIR(mode):
        return False
    require_regular_file(path)
    return True


def _read_file(path: Path) -> pa.Table:
    """One Parquet file, whole. Not ``pq.read_table``: that goes through Arrow's dataset layer,
    whose import alone costs about a second of CPU in every short-lived CLI process."""
    require_regular_file(path)  # before Arrow opens it: a FIFO's open would block
    return pq.ParquetFile(path).read()


def _read_readable(path: Path) -> pa.Table | None:
    if not is_regular_file(path):
        return None  # a FIFO or device among the segments: skipped unopened (store.validate names it)
    try:
        return _read_file(path)
    except (OSError, pa.ArrowInvalid):
        return None  # a torn temporary never gets renamed; a torn segment is skipped, not fatal


def read_stream(base: Path, schema: pa.Schema) -> pa.Table:
    """Rows of one stream, whether finalized or still in segments."""
    final = Path(str(base).removesuffix(".parquet") + ".parquet")
    parts = final.with_name(final.name.removesuffix(".parquet") + ".parts")
    tables = []
    if _present(final):
        tables.append(_read_file(final))
    if parts.is_dir():
        tables += [t for t in (_read_readable(p) for p in sorted(parts.glob("seg-*.parquet"))) if t is not None]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables([conform(t, schema) for t in tables])


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as ``schema``: its columns in schema order, cast; a column the file predates
    (:data:`powertrain.schema.ADDED_LATER`: ``power_repeat`` in telemetry written before it existed) is
    all null — unknown, as its contract says. Any other missing column is still an error."""
    for f in schema:
        if f.name not in table.column_names and f.nullable and f.name in ADDED_LATER:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(schema.names).cast(schema)


def _streams(folder: Path) -> list[Path]:
    names = {p.name.removesuffix(".parquet") for p in folder.glob("*.parquet")}
    names |= {p.name.removesuffix(".parts") for p in folder.glob("*.parts")}
    return [folder / n for n in sorted(names)]


def telemetry_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The readable Parquet files of a run's telemetry, in :func:`read_telemetry`'s order: per host
    stream its compacted file, then its segments (a run still streaming, or left so by a crash). A
    torn segment (no readable footer) is skipped, as the readers skip it. Nothing is loaded: for
    scanners (DuckDB, Arrow datasets) that stream the rows."""
    return _stream_files(Path(run_dir) / "telemetry")


def power_samples_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The readable Parquet files of a run's buffered power samples (``telemetry/power-samples/``), as
    :func:`telemetry_files` gives the telemetry's: for scanners, nothing loaded."""
    return _stream_files(Path(run_dir) / "telemetry" / POWER_SAMPLES_DIR)


def _stream_files(folder: Path) -> list[Path]:
    """Per stream in ``folder`` its compacted file, then its segments with a readable footer."""
    out: list[Path] = []
    for stream in _streams(folder) if folder.is_dir() else []:
        final = stream.with_name(stream.name + ".parquet")
        if _present(final):
            out.append(final)
        out += [p for p in sorted(stream.with_name(stream.name + ".parts").glob("seg-*.parquet")) if _has_footer(p)]
    return out


def _has_footer(path: Path) -> bool:
    if not is_regular_file(path):
        return False  # never opened: a FIFO would block
    try:
        pq.read_metadata(path)
    except (OSError, pa.ArrowInvalid):
        return False
    return True


def read_telemetry(run_dir: str | os.PathLike[str]) -> pa.Table:
    """All telemetry rows of a run (every host), sorted by time then device."""
    folder = Path(run_dir) / "telemetry"
    tables = [read_stream(s, TELEMETRY_SCHEMA) for s in _streams(folder)] if folder.is_dir() else []
    if not tables:
        return TELEMETRY_SCHEMA.empty_table()
    return pa.concat_tables(tables).sort_by([("t_ns", "ascending"), ("host", "ascending"), ("device", "ascending")])


def read_events(run_dir: str | os.PathLike[str]) -> pa.Table:
    """All event rows of a run (every rank), sorted by rank then start time."""
    folder = Path(run_dir) / "events"
    tables = [read_stream(s, EVENTS_SCHEMA) for s in _streams(folder)] if folder.is_dir() else []
    if not tables:
        return EVENTS_SCHEMA.empty_table()
    return pa.concat_tables(tables).sort_by([("rank", "ascending"), ("t_start_ns", "ascending")])


def events_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The readable Parquet files of a run's events, in the order :func:`read_events` concatenates
    them before its sort (per stream, by name: its compacted file, then its segments; a torn segment
    skipped), so a scanner that breaks ties by (position in this list, row in the file) orders the
    rows as :func:`read_events` does. Nothing is loaded."""
    folder = Path(run_dir) / "events"
    out: list[Path] = []
    for stream in _streams(folder) if folder.is_dir() else []:
        final = stream.with_name(stream.name + ".parquet")
        if _present(final):  # as read_stream: a FIFO where the file belongs is refused, never opened
            out.append(final)
        out += [p for p in sorted(stream.with_name(stream.name + ".parts").glob("seg-*.parquet")) if _has_footer(p)]
    return out


def finalize_run_streams(run_dir: str | os.PathLike[str]) -> None:
    """Compact every unfinished telemetry and events stream of a run (after a crash)."""
    run_dir = Path(run_dir)
    for sub, schema in (("telemetry", TELEMETRY_SCHEMA), ("events", EVENTS_SCHEMA)):
        for parts in sorted((run_dir / sub).glob("*.parts")):
            finalize(parts.with_name(parts.name.removesuffix(".parts")), schema)


# The driver's buffered power samples: telemetry/power-samples/<host>.parquet (POWER_SAMPLES_SCHEMA). A
# folder of their own, not telemetry/<host>.power-samples.parquet: every reader of telemetry/*.parquet
# (read_telemetry, RunDir.hosts, store.validate, the compaction after a crash) takes a file there for
# a host's telemetry rows.
POWER_SAMPLES_DIR = "power-samples"


def power_samples_base(run_dir: str | os.PathLike[str], host: str) -> Path:
    """The base of ``host``'s power-samples stream (``.parquet`` once compacted, ``.parts/`` while written);
    a host that is not one path component is ``BadName``."""
    return Path(run_dir) / "telemetry" / POWER_SAMPLES_DIR / check_name(host, "host")


def read_power_samples(run_dir: str | os.PathLike[str]) -> pa.Table | None:
    """The driver's buffered power samples of a run (every host), sorted by time, host, device; None when
    the run has no such stream (the buffer was not offered or not used, or the run predates it)."""
    folder = Path(run_dir) / "telemetry" / POWER_SAMPLES_DIR
    streams = _streams(folder) if folder.is_dir() else []
    if not streams:
        return None
    table = pa.concat_tables([read_stream(s, POWER_SAMPLES_SCHEMA) for s in streams])
    return table.sort_by([("t_ns", "ascending"), ("host", "ascending"), ("device", "ascending")])


def finalize_power_samples(run_dir: str | os.PathLike[str]) -> None:
    """Compact every unfinished power-samples stream of a run (after a sampler crash; the sampler compacts
    its own when it stops)."""
    folder = Path(run_dir) / "telemetry" / POWER_SAMPLES_DIR
    for parts in sorted(folder.glob("*.parts")) if folder.is_dir() else []:
        finalize(parts.with_name(parts.name.removesuffix(".parts")), POWER_SAMPLES_SCHEMA)
