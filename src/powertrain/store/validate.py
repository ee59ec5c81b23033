"""One check of a run directory before anything reads it: ``run.json`` and every Parquet file's schema.

Every reader of run directories (``summarize``, ``report``, ``trace``, ``compare``, ``calibrate``, the
API) goes through :func:`validate_run` / :func:`check_run`, so a damaged run is reported the same way
everywhere, in one line::

    runs/x: telemetry/node0.parquet: not a Parquet file (truncated or garbage: Parquet magic bytes not found …)

What counts as damage (each is a :class:`Problem`):

* a file the readers would open that is not a regular file — a FIFO (opening it would wait for a writer
  for ever), a device, a socket — wherever it is, segments included (refused before anything opens it);
* ``run.json`` unreadable (permissions, a directory in its place), not UTF-8, not JSON, not a JSON
  object, or a known key of the wrong type (``status`` not one of running / ok / failed, ``devices``
  not a list, ``config`` not an object, …);
* a finished ``telemetry/*.parquet`` or ``events/*.parquet`` that cannot be opened (truncated,
  garbage, unreadable) or whose schema lacks a column of the table contract
  (:data:`powertrain.schema.TELEMETRY_SCHEMA` / ``EVENTS_SCHEMA``) or has it with a type that does
  not convert;
* a segment of an unfinished stream (``*.parts/seg-*.parquet``) with a wrong schema. A segment that
  cannot be opened is *not* damage: the writer renames only complete files, so a torn segment is the
  expected trace of a ``kill -9`` and readers skip it;
* a prediction without a readable ``summary.json`` (its summary is its data);
* a ``run.json`` whose ``schema`` is a newer ``powertrain.run/N`` than :data:`RUN_SCHEMA_VERSION`: a later
  powertrain wrote it, and what its keys mean may have changed, so it is refused rather than half-read.
  (A ``run.json`` without ``schema`` — predictions, older runs — is read as version 1.)

Only the Parquet footers are read (cheap: no row data), so checking a long run costs milliseconds.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from powertrain.core.files import NotRegularFile, file_kind, read_regular_bytes
from powertrain.schema import ADDED_LATER, EVENTS_SCHEMA, TELEMETRY_SCHEMA

RUN_STATUSES = ("running", "ok", "failed")
RUN_SCHEMA_VERSION = 1  # the run.json layout this code reads and writes
RUN_SCHEMA = f"powertrain.run/{RUN_SCHEMA_VERSION}"

# known run.json keys and the JSON types their readers expect (None is always allowed)
_KEY_TYPES: dict[str, tuple[type, ...]] = {
    "schema": (str,), "status": (str,), "kind": (str,), "name": (str,), "reason": (str,),
    "config": (dict,), "owner": (dict,), "window": (dict,), "data_quality": (dict,), "import": (dict,),
    "measured_window": (dict,),
    "devices": (list,), "hosts": (list,), "fields_supported": (list,), "rank_map": (list,), "ranks": (list,),
    "incidents": (list,), "telemetry_notes": (list,), "not_measured": (list,),
    "start_ns": (int,), "end_ns": (int,),
}
_TYPE_WORDS = {str: "a string", dict: "an object", list: "a list", int: "an integer"}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one file of a run directory (``file`` relative to the run)."""

    file: str
    problem: str

    def line(self, run: str | os.PathLike[str]) -> str:
        return f"{run}: {self.file}: {self.problem}"


class DamagedRun(ValueError):
    """A run directory that cannot be read as one; ``str()`` is ``RUN: file: problem`` (one line)."""

    def __init__(self, run: str | os.PathLike[str], problems: list[Problem]) -> None:
        self.run = str(run)
        self.problems = list(problems)
        first = self.problems[0].line(self.run) if self.problems else f"{self.run}: damaged"
        more = f" (and {len(self.problems) - 1} more problem(s))" if len(self.problems) > 1 else ""
        super().__init__(first + more)


def _one_line(text: str, limit: int = 160) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _os_problem(exc: OSError) -> str:
    return f"unreadable ({_one_line(exc.strerror or str(exc))})"


def parse_run_json(path: Path) -> tuple[dict[str, Any] | None, list[Problem]]:
    """``run.json`` of a run as a dict, or ``None`` with the problems that make it unreadable."""
    name = "run.json"
    try:
        raw = read_regular_bytes(path, "run.json")  # a FIFO here would hang every reader of the run
    except NotRegularFile:
        return None, [Problem(name, _kind_problem(path) or "unreadable (a directory, expected a file)")]
    except OSError as exc:
        return None, [Problem(name, _os_problem(exc))]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [Problem(name, f"not UTF-8 text (byte {exc.start})")]
    if not text.strip():
        return None, [Problem(name, "empty file")]
    try:
        info = json.loads(text)
    except ValueError as exc:
        return None, [Problem(name, f"not JSON ({_one_line(str(exc))})")]
    if not isinstance(info, dict):
        return None, [Problem(name, f"not a JSON object (a {type(info).__name__})")]
    problems = []
    for key, types in _KEY_TYPES.items():
        v = info.get(key)
        if v is None:
            continue
        if not isinstance(v, types) or (int in types and isinstance(v, bool)):
            problems.append(Problem(name, f"{key} is {type(v).__name__} {_one_line(repr(v), 40)}, expected "
                                          f"{_TYPE_WORDS[types[0]]}"))
    status = info.get("status")
    if isinstance(status, str) and status not in RUN_STATUSES:
        problems.append(Problem(name, f"status {status!r} is not one of {', '.join(RUN_STATUSES)}"))
    schema = info.get("schema")
    if isinstance(schema, str):
        why = run_schema_problem(schema)
        if why:
            problems.append(Problem(name, why))
    return (None if problems else info), problems


def run_schema_problem(schema: str) -> str | None:
    """Why a ``run.json`` of ``schema`` cannot be read here (a newer ``powertrain.run/N``), else None."""
    family, _, version = schema.partition("/")
    if family != "powertrain.run":
        return None  # not ours to judge: the keys above are checked all the same
    if not version.isdigit():
        return f"schema {_one_line(schema, 40)!r} has no version number (expected {RUN_SCHEMA})"
    if int(version) > RUN_SCHEMA_VERSION:
        return (f"schema {schema} is newer than this powertrain reads (up to {RUN_SCHEMA}); read it with the "
                "powertrain version that wrote it, or upgrade this one")
    return None


def _schema_problem(schema: pa.Schema, want: pa.Schema) -> str | None:
    missing = [f.name for f in want if f.name not in schema.names and f.name not in ADDED_LATER]
    if missing:
        return f"wrong schema: no column {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}"
    for f in want:
        if f.name not in schema.names:  # a column added later (ADDED_LATER): read as null
            continue
        got = schema.field(f.name).type
        if not _converts(got, f.type):
            return f"wrong schema: column {f.name} is {got}, expected {f.type}"
    return None


def _converts(got: pa.DataType, want: pa.DataType) -> bool:
    """Whether every value of type ``got`` converts to ``want`` as the readers cast (same family only:
    a string column that an empty cast would pass still fails on its first value)."""
    t = pa.types
    if got == want or t.is_null(got):
        return True
    if t.is_dictionary(got):
        got = got.value_type
    if t.is_integer(want):
        return t.is_integer(got)
    if t.is_floating(want):
        return t.is_integer(got) or t.is_floating(got)
    if t.is_string(want) or t.is_large_string(want):
        return t.is_string(got) or t.is_large_string(got)
    return bool(got == want)


def _kind_problem(path: Path) -> str | None:
    """Why ``path`` is no regular file — ``a FIFO (named pipe), not a regular file`` — looked at with
    ``os.stat``, which opens nothing; None for a regular file, or one that cannot be looked at."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # missing or unreadable: the open that follows names it
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"is {file_kind(mode)}, not a regular file"


def parquet_problem(path: Path, want: pa.Schema) -> tuple[str | None, bool]:
    """(problem, opened): why ``path`` is not a readable Parquet file of schema ``want`` (None if fine)."""
    if path.is_dir():
        return "unreadable (a directory, expected a Parquet file)", False
    kind = _kind_problem(path)
    if kind:
        return kind, True  # no torn segment a writer left: damage wherever it is
    try:
        schema = pq.read_schema(path)
    except OSError as exc:
        if exc.errno is not None:
            return _os_problem(exc), False
        return f"not a Parquet file (truncated or garbage: {_one_line(str(exc), 100)})", False
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        return f"not a Parquet file (truncated or garbage: {_one_line(str(exc), 100)})", False
    return _schema_problem(schema, want), True


def _streams(run: Path) -> Iterator[tuple[Path, pa.Schema, bool]]:
    """(file, schema, is_segment) for every Parquet file the readers would open."""
    for sub, schema in (("telemetry", TELEMETRY_SCHEMA), ("events", EVENTS_SCHEMA)):
        folder = run / sub
        if not folder.is_dir():
            continue
        for p in sorted(folder.glob("*.parquet")):
            yield p, schema, False
        for parts in sorted(folder.glob("*.parts")):
            for p in sorted(parts.glob("seg-*.parquet")):
                yield p, schema, True


def validate_run(path: str | os.PathLike[str]) -> list[Problem]:
    """Everything wrong with the run directory ``path`` (empty list: readable). See the module doc.

    A folder without ``run.json`` is not a run directory at all: that is a ``FileNotFoundError``
    from :meth:`powertrain.store.RunDir.read`, not a problem listed here.
    """
    run = Path(path)
    if not (run / "run.json").exists() and not (run / "run.json").is_symlink():
        raise FileNotFoundError(f"{run} is not a run directory (no run.json)")
    problems: list[Problem] = []
    info, bad = parse_run_json(run / "run.json")
    problems += bad
    for sub in ("telemetry", "events"):
        p = run / sub
        if p.exists() and not p.is_dir():
            problems.append(Problem(sub, "not a directory"))
        elif p.is_dir() and not os.access(p, os.R_OK | os.X_OK):
            problems.append(Problem(sub + "/", "unreadable (permission denied)"))
    for file, schema, segment in _streams(run):
        why, opened = parquet_problem(file, schema)
        if why is not None and (opened or not segment):
            problems.append(Problem(str(file.relative_to(run)), why))
    if info is not None and info.get("kind") == "prediction":
        _, bad_summary = _json_object(run / "summary.json", "summary.json")
        problems += bad_summary
    return problems


def _json_object(path: Path, name: str) -> tuple[dict[str, Any] | None, list[Problem]]:
    try:
        data = json.loads(read_regular_bytes(path, name).decode("utf-8"))
    except FileNotFoundError:
        return None, [Problem(name, "missing")]
    except NotRegularFile:
        return None, [Problem(name, _kind_problem(path) or "unreadable (a directory, expected a file)")]
    except OSError as exc:
        return None, [Problem(name, _os_problem(exc))]
    except (UnicodeDecodeError, ValueError) as exc:
        return None, [Problem(name, f"not JSON ({_one_line(str(exc))})")]
    if not isinstance(data, dict):
        return None, [Problem(name, f"not a JSON object (a {type(data).__name__})")]
    return data, []


def check_run(path: str | os.PathLike[str]) -> None:
    """Raise :class:`DamagedRun` (``RUN: file: problem``) when :func:`validate_run` finds anything."""
    problems = validate_run(path)
    if problems:
        raise DamagedRun(path, problems)
