"""Which importer reads which kind of source, and how one import of several sources is put together.

:func:`build` groups the sources by kind (detected per source for ``auto``), runs each kind's importer
with the options it reads, joins the results (:func:`merge`), runs the power-timeline detector where
only telemetry came along, and checks an ``--anchor`` against the telemetry. See :mod:`powertrain.importers`.

A user's window (``--window START,END``, :func:`parse_window`; ``window_ns=(t0, t1)`` in Python) is
written to ``run.json["window"]`` with source ``"user --window"`` and replaces the window a format
declares (that one is kept as ``run.json["window_from_source"]``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from powertrain.importers.common import RunBuilder, SourceFormatError, events_table, iso, parse_anchor
from powertrain.importers.detect import detect_kind

KINDS = ("nvsmi", "mlperf", "zeus", "powertraces", "study_csv", "framework_log", "kineto")
# Kinds whose telemetry may hide checkpoint dips / stalls worth detecting when no step log came along.
_TELEMETRY_KINDS = ("nvsmi", "powertraces", "study_csv")


def _importer(kind: str) -> Callable[..., RunBuilder]:
    f: Callable[..., RunBuilder]  # each kind's import function takes its own keyword options (_OPTIONS)
    if kind == "nvsmi":
        from powertrain.importers.nvsmi import import_nvsmi as f
    elif kind == "mlperf":
        from powertrain.importers.mlperf import import_mlperf as f
    elif kind == "zeus":
        from powertrain.importers.zeus import import_zeus as f
    elif kind == "powertraces":
        from powertrain.importers.powertraces import import_powertraces as f
    elif kind == "study_csv":
        from powertrain.importers.study_csv import import_study_csv as f
    elif kind == "framework_log":
        from powertrain.importers.framework_logs import import_framework_log as f
    elif kind == "kineto":
        from powertrain.importers.kineto import import_kineto as f
    else:
        raise ValueError(f"unknown import kind {kind!r}; choose one of: auto, {', '.join(KINDS)}")
    return f


_OPTIONS = {  # which keyword options each importer takes
    "nvsmi": ("tz", "gpus", "hosts"),
    "mlperf": ("warmup_steps",),
    "zeus": ("tz", "anchor_ns", "warmup_steps"),
    "powertraces": ("tz",),
    "study_csv": ("gpus_per_node",),
    "framework_log": ("tz", "seq_len", "anchor_ns", "warmup_steps"),
    "kineto": ("hta", "warmup_steps"),
}
# Options that only some kinds read: given for an import where no source reads them, they are refused
# rather than silently ignored.
_REFUSED_UNLESS_READ = {"anchor_ns": "--anchor", "warmup_steps": "--warmup-steps", "seq_len": "--seq-len",
                        "gpus": "--gpus", "hosts": "--host", "gpus_per_node": "--gpus-per-node", "hta": "--hta",
                        "tz": "--tz"}


# Kinds whose importer reads files only: each file is one run (a folder of them is usually several runs).
_FILE_KINDS = ("nvsmi", "powertraces", "framework_log")


def _folder_of_runs(folder: Path, kind: str | None) -> SourceFormatError | None:
    """The error for a folder given where ``kind`` (None: any file-only kind) reads files, one run each:
    which files it holds and the command for one of them; None when the folder is not that."""
    files = sorted(x for x in folder.iterdir() if x.is_file())
    found = {k: [x for x in files if detect_kind(x) == k] for k in ((kind,) if kind else _FILE_KINDS)}
    found = {k: v for k, v in found.items() if v}
    if len(found) != 1:
        return None
    (k, hits), = found.items()
    shown = ", ".join(x.name for x in hits[:3]) + (f" and {len(hits) - 3} more" if len(hits) > 3 else "")
    return SourceFormatError(folder, None, f"a folder of {len(hits)} {k} file(s) ({shown}); each {k} file is a run "
                                           f"of its own: import one per run, e.g. powertrain import {k} "
                                           f"{hits[0]} --out DIR (several files of one run: name them all)")


def group_sources(kind: str, sources: Sequence[str | os.PathLike[str]]) -> dict[str, list[Path]]:
    """Sources per kind; for ``auto`` each source is detected, and an undetectable one is an error."""
    paths = [Path(s) for s in sources]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or folder")
    if kind != "auto":
        _importer(kind)
        for p in paths:
            if kind in _FILE_KINDS and p.is_dir():
                raise _folder_of_runs(p, kind) or SourceFormatError(
                    p, None, f"a folder, and {kind} sources are files (one run each): name the file(s)")
        return {kind: paths}
    groups: dict[str, list[Path]] = {}
    for p in paths:
        k = detect_kind(p)
        if k is None:
            raise (_folder_of_runs(p, None) if p.is_dir() else None) or SourceFormatError(
                p, None, f"cannot tell which format this is; name it: powertrain import KIND ... with KIND one of "
                         f"{', '.join(KINDS)}")
        groups.setdefault(k, []).append(p)
    return groups


USER_WINDOW_SOURCE = "user --window"


def parse_window(text: str, tz: str | None = None) -> tuple[int, int]:
    """``--window START,END`` → ``(t0_ns, t1_ns)``; each time ISO-8601 or epoch seconds (like ``--anchor``;
    an ISO time without a zone is read in ``tz``)."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise ValueError(f"--window {text!r}: give START,END (ISO-8601 or epoch seconds, e.g. "
                         "2024-05-01T10:00:00,2024-05-01T11:00:00 or 1714557600,1714561200)")
    try:
        t0, t1 = (parse_anchor(p, tz) for p in parts)
    except ValueError as exc:
        raise ValueError(str(exc).replace("--anchor", "--window")) from None
    if t1 <= t0:
        raise ValueError(f"--window {text!r} ends before it starts")
    return t0, t1


def set_user_window(b: RunBuilder, window_ns: tuple[int, int]) -> None:
    """Record a user's window in ``run.json["window"]``; a window the format declared is kept beside it."""
    declared = b.info.get("window")
    if declared is not None and declared.get("source") != USER_WINDOW_SOURCE:
        b.info["window_from_source"] = declared
    b.set_window(int(window_ns[0]), int(window_ns[1]), USER_WINDOW_SOURCE)


def build(kind: str, sources: Sequence[str | os.PathLike[str]], *, detect_events: bool = True,
          name: str | None = None, window_ns: tuple[int, int] | None = None, zone_of_options: bool = False,
          **options: Any) -> RunBuilder:
    """Parse ``sources`` (see module doc) into one :class:`RunBuilder`, without writing anything.

    ``tz`` is refused (ValueError, one line) when no source holds a local wall-clock time it would place,
    unless ``zone_of_options``: the caller read a time of its own in it (the CLI's ``--anchor`` /
    ``--window`` without a zone)."""
    groups = group_sources(kind, sources)
    refused = []  # (flag, who reads it): all named in one line, not one per attempt
    for opt, flag in _REFUSED_UNLESS_READ.items():
        if options.get(opt) is None or any(opt in _OPTIONS[k] for k in groups):
            continue
        readers = ", ".join(k for k, o in _OPTIONS.items() if opt in o)
        if opt == "tz":
            if zone_of_options:
                continue
            readers += ", and the times of --anchor and --window without a zone"
        refused.append((flag, readers))
    if len(refused) == 1:
        (flag, readers), = refused
        raise ValueError(f"{flag} does not apply to {', '.join(groups)} sources (only to {readers}): drop it")
    if refused:
        raise ValueError(f"{', '.join(f'{f} (only {r})' for f, r in refused)} do not apply to "
                         f"{', '.join(groups)} sources: drop them")
    builders = []
    for k, paths in groups.items():
        opts = {o: v for o, v in options.items() if o in _OPTIONS[k] and v is not None}
        builders.append(_importer(k)(paths, name=name, **opts))
    b = merge(builders) if len(builders) > 1 else builders[0]
    if options.get("tz") is not None and not b.read_local_times and not zone_of_options:
        # the importers that take --tz read it only for stamps without a zone; these sources have none
        raise ValueError(f"--tz does not apply: no time in these sources is local wall-clock "
                         f"({'; '.join(b.no_local_times) or 'none holds a time stamp'}): drop --tz")
    if detect_events and any(k in _TELEMETRY_KINDS for k in groups):
        add_detected_events(b)
    if options.get("anchor_ns") is not None:
        check_anchor(b)
    if window_ns is not None:
        set_user_window(b, window_ns)
    return b


def check_anchor(b: RunBuilder) -> None:
    """Warn when steps placed by ``--anchor`` miss the telemetry imported with them (a wrong anchor)."""
    tel, ev = b.telemetry(), b.events()
    steps = ev.filter(pc.equal(ev.column("kind"), "step")) if ev.num_rows else ev
    if tel.num_rows == 0 or steps.num_rows == 0:
        return
    t0, t1 = pc.min(tel.column("t_ns")).as_py(), pc.max(tel.column("t_ns")).as_py()
    s0, s1 = pc.min(steps.column("t_start_ns")).as_py(), pc.max(steps.column("t_end_ns")).as_py()
    if s0 < t0 or s1 > t1:
        b.warn(f"the anchored steps ({iso(s0)} → {iso(s1)}) are not inside the telemetry ({iso(t0)} → {iso(t1)}): "
               "check --anchor (and --tz)")


def import_sources(kind: str, sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                   **options: Any) -> Path:
    """Import ``sources`` of ``kind`` (or ``auto``) into the run directory ``out``; returns its path."""
    return build(kind, sources, **options).write(out)


def merge(builders: Sequence[RunBuilder]) -> RunBuilder:
    """Join several imports of one job (e.g. telemetry + step log) into one run."""
    m = RunBuilder(format="+".join(b.format for b in builders), name=builders[0].name)
    for b in builders:
        m.sources += b.sources
        m.mapped.update({f"{b.format}: {k}": v for k, v in b.mapped.items()})
        m.dropped += [f"{b.format}: {d}" for d in b.dropped]
        m.warnings += b.warnings
        m.devices += b.devices
        m.read_local_times |= b.read_local_times
        m.no_local_times += b.no_local_times
        for k, v in b.info.items():
            m.info.setdefault(k, v)
        if b.info.get("job_device_count") is not None and m.info.get("job_device_count") is None:
            # a source that knows the job's device count wins over one that does not
            m.info["job_device_count"] = b.info["job_device_count"]
            m.info["job_device_count_source"] = b.info.get("job_device_count_source")
        m.add_telemetry(b.telemetry())
        m.add_events(b.events())
    return m


def add_detected_events(b: RunBuilder) -> None:
    """Run the power-timeline detector (checkpoint dips, stalls, end of activity) when there is no
    step log; events go on the pseudo-rank ``-1`` and into ``run.json["detected_events"]``."""
    from powertrain.importers.detect_events import DETECTED_RANK, detect_power_events, summarize

    ev = b.events()
    if ev.num_rows and "step" in set(ev.column("kind").to_pylist()):
        b.info["detected_events"] = []
        b.info["detected_events_note"] = "not run: the import has a step log"
        return
    found = detect_power_events(b.telemetry())
    b.add_events(events_table(found))
    b.info["detected_events"] = summarize(found)
    b.info["detected_events_rank"] = DETECTED_RANK
    b.info["detected_events_method"] = "powertrain.importers.detect_events (summed host power dips)"

