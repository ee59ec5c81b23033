"""A run's step and phase events where they lie: DuckDB queries over ``events/*.parquet``.

:func:`powertrain.store.tables.read_events` loads every rank's events as one table; a day of 2 s
steps on 8 ranks with forward / backward / optimizer phases is 1.38M rows (+474 MiB to read). The
analysis, the report and the trace instead open the files as a :class:`RunEvents` and ask for what
they need: aggregates (counts, extremes, the impossible step events), one rank's step events at a
time, or one rank's events in time order a chunk at a time (:meth:`RunEvents.rank_chunks`), so what
they hold is bounded by a chunk and by what they compute per step, not by the run's events.

Row order is :func:`read_events`'s, which every definition of :mod:`powertrain.analyze.steps` was
written against: by rank, then start time, and rows that tie keep their place in the files (the
streams by name, each its compacted file then its segments: :func:`powertrain.store.tables.events_files`),
which the view's ``_file`` and ``_row`` columns carry. A table given instead (:meth:`RunEvents.from_table`,
the tests' and the library's own callers) keeps its own row order (``_row``), as the definitions
applied to it did.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from powertrain.schema import EVENTS_SCHEMA
from powertrain.store.tables import events_files

# Rows of one rank read per query by the time-ordered walks (phase self times, the pipeline view,
# the trace): about 10 MB of Python rows, whatever the run's length.
CHUNK_ROWS = 1 << 15
_SQL_TYPES = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.string(): "VARCHAR", pa.float64(): "DOUBLE"}
# No training step lasts a week (steps.MAX_STEP_S is this in seconds): stated here in ns, for SQL.
MAX_STEP_NS = 7 * 24 * 3600 * 1_000_000_000
# A step event's duration in ns, as a HUGEINT: hostile stamps cannot overflow int64 here.
DUR_NS = "(CAST(t_end_ns AS HUGEINT) - CAST(t_start_ns AS HUGEINT))"
# The step events steps.screen_steps keeps (its reasons to drop one, negated), as SQL over view ev.
KEPT_STEP = (f"kind = 'step' AND t_start_ns IS NOT NULL AND t_end_ns IS NOT NULL AND {DUR_NS} > 0 "
             f"AND {DUR_NS} <= {MAX_STEP_NS}")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class RunEvents:
    """The events of one run (or of a table), queried in place. Holds a DuckDB connection: :meth:`close`
    it (a ``with`` block does)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, *, table_order: bool, where: str = "") -> None:
        self.con = con
        # a given table keeps its own order (``_row``); a run's files are read_events' order
        self.table_order = table_order
        self.where = where  # the source, for messages and reprs
        self._n: int | None = None

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    def open(cls, run_dir: str | os.PathLike[str]) -> RunEvents:
        """The events of the run directory ``run_dir`` (every readable file of ``events/``); nothing is read."""
        con = _connect()
        files = [str(p) for p in events_files(run_dir)]
        if not files:
            _register(con, EVENTS_SCHEMA.empty_table())
            return cls(con, table_order=False, where=str(Path(run_dir) / "events"))
        con.register("_files", pa.table({"path": pa.array(files, pa.string()),
                                          "idx": pa.array(np.arange(len(files)), pa.int32())}))
        flist = "[" + ", ".join(_quote(f) for f in files) + "]"
        scan = f"read_parquet({flist}, union_by_name=true, filename=true, file_row_number=true)"
        present = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()}
        cols = [f'CAST(p."{f.name}" AS {_SQL_TYPES[f.type]}) AS "{f.name}"' if f.name in present
                else f'CAST(NULL AS {_SQL_TYPES[f.type]}) AS "{f.name}"' for f in EVENTS_SCHEMA]
        con.execute(f"CREATE VIEW ev AS SELECT {', '.join(cols)}, f.idx AS _file, p.file_row_number AS _row "
                    f"FROM {scan} p JOIN _files f ON p.filename = f.path")
        return cls(con, table_order=False, where=str(Path(run_dir) / "events"))

    @classmethod
    def from_table(cls, table: pa.Table) -> RunEvents:
        """Events held in a table of :data:`powertrain.schema.EVENTS_SCHEMA` (its row order is kept)."""
        con = _connect()
        _register(con, table)
        return cls(con, table_order=True, where="events table")

    def close(self) -> None:
        self.con.close()

    def __repr__(self) -> str:
        return f"RunEvents({self.where})"

    def __enter__(self) -> RunEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ------------------------------------------------------------------------------------

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, list(params or [])).fetchall()

    def one(self, sql: str, params: Sequence[Any] | None = None) -> tuple[Any, ...]:
        rows = self.con.execute(sql, list(params or [])).fetchall()  # fetchone would leave the result open
        return rows[0]

    def arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        return self.con.sql(sql, params=list(params or [])).to_arrow_table()  # a relation: no extra copy

    @property
    def order(self) -> str:
        """ORDER BY terms of the table's order (see the module doc)."""
        return "_row" if self.table_order else "rank NULLS LAST, t_start_ns NULLS LAST, _file, _row"

    @property
    def num_rows(self) -> int:
        if self._n is None:
            self._n = int(self.one("SELECT count(*) FROM ev")[0])
        return self._n

    def ranks(self, where: str = "TRUE", params: Sequence[Any] | None = None) -> list[int]:
        """The ranks with an event matching ``where``, in order."""
        return [int(r[0]) for r in self.rows(f"SELECT DISTINCT rank FROM ev WHERE rank IS NOT NULL AND ({where}) "
                                             "ORDER BY rank", params)]

    def ranks_seen(self) -> int:
        """How many ranks recorded events."""
        return int(self.one("SELECT count(DISTINCT rank) FROM ev")[0] or 0)

    def mem_peak_max(self) -> int | None:
        """The largest ``mem_peak_bytes`` of any event (None when no event carries one)."""
        v = self.one("SELECT max(mem_peak_bytes) FROM ev")[0]
        return None if v is None else int(v)

    def register_steps(self, table: str, values: np.ndarray) -> None:
        """Register ``values`` (int64) as the one-column table ``table`` (column ``step``) for ``IN`` lists."""
        self.con.register(table, pa.table({"step": pa.array(values, pa.int64())}))

    def rank_chunks(self, rank: int, where: str, columns: str, order: str, params: Sequence[Any] | None = None,
                    chunk_rows: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """One rank's events matching ``where`` (``columns``), ordered by start time, then ``order``, then
        their place in the files; a chunk of about ``chunk_rows`` rows at a time. Chunks are ranges of
        start time, so rows that start together stay in one chunk and the chunks follow each other in
        that order (``chunk_rows``: :data:`CHUNK_ROWS` when not given)."""
        p = list(params or [])
        base = f"FROM ev WHERE rank = ? AND t_start_ns IS NOT NULL AND t_end_ns IS NOT NULL AND ({where})"
        n, lo, hi = self.one(f"SELECT count(*), min(t_start_ns), max(t_start_ns) {base}", [rank, *p])
        if not n:
            return
        lo, hi = int(lo), int(hi)
        chunk_rows = chunk_rows or CHUNK_ROWS
        width = max(1, -(-(hi - lo + 1) * chunk_rows // int(n)))  # ceil: a whole number of ns
        sql = (f"SELECT {columns} {base} AND t_start_ns BETWEEN ? AND ? "
               f"ORDER BY t_start_ns, {order + ', ' if order else ''}_file, _row")
        a = lo
        while a <= hi:
            b = min(a + width - 1, hi)  # inclusive: never past the int64 the stamps are
            rows = self.rows(sql, [rank, *p, a, b])
            if rows:
                yield rows
            a = b + 1


def _connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    # the walks query the files once per chunk: keep each file's footer instead of parsing it again
    con.execute("SET parquet_metadata_cache = true")
    return con


def _register(con: duckdb.DuckDBPyConnection, table: pa.Table) -> None:
    cols: dict[str, pa.Array | pa.ChunkedArray] = {}
    for f in EVENTS_SCHEMA:
        col = table[f.name] if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        cols[f.name] = col.cast(f.type)
    cols["_file"] = pa.array(np.zeros(table.num_rows, dtype=np.int32))
    cols["_row"] = pa.array(np.arange(table.num_rows, dtype=np.int64))
    con.register("ev", pa.table(cols))


def as_events(events: RunEvents | pa.Table) -> RunEvents:
    """``events`` as a :class:`RunEvents` (a table is wrapped; close what this returns only if it is new)."""
    return events if isinstance(events, RunEvents) else RunEvents.from_table(events)
