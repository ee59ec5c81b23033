"""MLPerf Training logs (``:::MLLOG`` JSON lines): node power readings and the run's step timing.

Inputs (any mix, files or folders; ``.gz`` is read transparently), in either layout submitters use:

* **flat** (one run): a folder with ``result_*.txt`` and ``power*/node_<N>.txt`` (``power_ac/`` is
  preferred when there are several), as in ``../shared/data/real/mlperf-v4.0-smc-h100/*``;
* **published** (MLCommons ``training_results_vX/<submitter>/results/<system>/<benchmark>/``):
  ``result_0.txt … result_9.txt`` beside ``power/result_0/node_*.txt`` and ``power/result_0/sw_*.txt``.
  :func:`benchmark_runs` lists its runs; each is one run directory (``powertrain import`` writes them
  all under ``--out`` as ``result_N``, or one with ``--result N``); the system description is taken
  from ``../../../systems/<system>.json`` when it is there.

What is read:

* power logs ``node_<N>.txt`` — ``power_reading`` (W, node-level, AC or DC side) every ~2 s between
  ``power_measurement_start`` / ``_stop``, stamped in epoch milliseconds; ``conversion_eff`` (with
  ``metadata.measurement_type``), the power-record setting MLCommons' ``result_summarizer``
  multiplies node power by. Each node becomes host ``node_<N>`` with one device ``node`` whose
  ``power_w`` is the reading × ``conversion_eff`` (the figure MLCommons counts; 1 when the log states
  none); the figures as read are kept beside the converted ones in ``run.json["mlperf"]``. Readings
  are screened (:mod:`powertrain.importers.sanity`: negative or above 3000 W × 8 per node) and cleaned
  (:func:`powertrain.core.energy.clean_readings`: exact repeats dropped, same-time readings
  averaged), with the counts in ``run.json["data_quality"]``, so a logger that writes every line
  twice neither inflates the sample rate nor weighs twice.
* switch logs ``sw_<N>.txt`` — either form the MLPerf power rules allow ("measure or estimate
  interconnects"): ``interconnect_power_est`` (W), a constant estimate, which MLCommons' score counts as
  that power × time-to-train; or **measured** ``power_reading`` lines (with ``power_measurement_start`` /
  ``_stop`` and ``conversion_eff``, as a node's log), scored as a node is (mean power by the node rule ×
  time-to-train; mlperf-logging's summarizer reads estimates only). In the run's own energy a switch is
  included only when its timestamps are on the run's clock and it covers the run's window under the edge
  rule; otherwise it is dropped from the integral with the reason stated (the SMC logs stamp it in 2022).
* time, per log in file order (:func:`powertrain.importers.sanity.screen_time`): steps back of the
  clock and gaps longer than energy bridges are counted and named in ``run.json`` ``data_quality``
  (``devices[]``, ``time``), and the energies below follow :mod:`powertrain.core.energy`'s rules for
  them (null over a window either falls in; gaps over 5 intervals up to the limit bridged and counted).
* the nodes the job had: ``number_of_nodes`` of the system description. A node without a power log is
  named (``node_<N>``, when the others' numbering says which) in ``data_quality.missing_devices`` and
  ``mlperf.nodes_missing``; the run's energy and the score are then null with that reason (the measured
  nodes' sum is ``energy_run_measured_nodes_j``), and the analysis' run-level energy too.
* the result log ``result_*.txt`` — the job's stdout, lines optionally prefixed by the Slurm rank
  (``  0: :::MLLOG {...}``). ``run_start`` / ``run_stop`` are **the run's window**
  (``run.json["window"]``, every energy / power / time figure of the run is over it) and a ``phase``
  event named ``run``; ``eval_start`` / ``eval_stop`` become ``eval`` events (with ``eval_accuracy``),
  ``tracked_stats`` ``{"train_step_timing in s": x}`` become ``step`` events (``t_end`` = the log
  time, ``t_start = t_end - x``), ``{"throughput": x}`` (Llama-2 LoRA) become ``phase`` events
  ``train_block``. All events are on rank 0: the log describes the whole job. The measured window is
  the steps inside run_start → run_stop (less the first ``warmup_steps``, default 0).
* ``system_*.json`` — ``number_of_nodes × accelerators_per_node`` is ``run.json`` ``job_device_count``.
* ``total_power.txt`` — the submitter's energy (kWh), kept for comparison.

Three energies, each named in ``run.json["mlperf"]`` (``docs/metrics.md``):

* ``energy_run_j`` — **the run's energy**: Σ over nodes (+ switch when on the clock) of the one
  integral (:mod:`powertrain.core.energy`) over run_start → run_stop; a logger that starts late or
  stops early is held at its nearest reading for up to 5 s (``edge_held_s`` per node in
  ``data_quality``), beyond that the node's energy — and so the run's — is null with the reason.
  ``summary.json`` ``energy_j`` is the same figure.
* ``measurement_window_energy_j`` — the same integral over each node's own
  power_measurement_start → power_measurement_stop.
* ``score_j`` — **the MLCommons scoring figure**, as ``mlperf_logging.result_summarizer`` computes it:
  per node, conversion_eff × (Σ reading × time since the previous reading or the start marker) ÷
  (stop − start) × time-to-train, plus per switch conversion_eff × estimate × time-to-train. A stop
  marker that is not after its start marker (the 1-node LoRA quirk, where mlperf-logging divides by
  zero) is treated as missing, which mlperf-logging itself reads as "stop = the last reading".

Quirks tolerated, with a warning (never by dropping readings): a stop marker stamped before the
start marker or before the last reading, ``"value": "null"`` strings, readings outside the markers.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from powertrain.core.energy import (
    DEFAULT_HOLD_LIMIT_S,
    Intervals,
    WindowEnergy,
    clean_readings,
    merge_intervals,
    window_energy,
    windows_energy,
)
from powertrain.core.files import require_regular_file
from powertrain.core.names import check_name
from powertrain.importers.common import (
    RunBuilder,
    SourceFormatError,
    events_table,
    iso,
    mark_window,
    open_text,
    read_text,
    set_job_devices,
    telemetry_table,
)
from powertrain.importers.sanity import screen, screen_time

MARK = ":::MLLOG"
_NODE_RE = re.compile(r"^node_(\d+)\.txt(\.gz)?$")
_RESULT_RE = re.compile(r"^result_.*\.txt(\.gz)?$")


def iter_mllog(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line number, prefix, record)`` for every ``:::MLLOG`` line of a file.

    Only lines containing the marker are JSON-decoded (the rest of a job log is skipped with one
    substring test), so a multi-MB log costs one pass.
    """
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            k = line.find(MARK)
            if k < 0:
                continue
            try:
                rec = json.loads(line[k + len(MARK):])
            except json.JSONDecodeError as exc:
                raise SourceFormatError(path, lineno, f"text after {MARK} is not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict) or "key" not in rec or "time_ms" not in rec:
                raise SourceFormatError(path, lineno, f"{MARK} record lacks 'key' or 'time_ms'")
            yield lineno, line[:k].strip().rstrip(":").strip(), rec


_SW_RE = re.compile(r"^sw_(\d+)\.txt(\.gz)?$")


def _result_stem(path: Path) -> str:
    """``result_3`` of ``result_3.txt`` (how MLCommons pairs a result log with ``power/result_3/``)."""
    return path.name.split(".")[0]


def benchmark_runs(folder: str | Path) -> list[tuple[str, list[Path]]] | None:
    """The runs of a benchmark folder laid out as MLCommons publishes results, or ``None`` for any
    other source (a flat run folder, files).

    Published layout: ``<benchmark>/result_N.txt`` beside ``<benchmark>/power/result_N/{node,sw}_*.txt``
    (also recognised without ``power/`` when several result logs share the folder). Each run is
    ``(result_N, [result log, its power folder if any, system descriptions])``; the system description
    is ``system_*.json`` in the folder or ``../../../systems/<system>.json`` of the results repo.
    """
    p = Path(folder)
    if not p.is_dir():
        return None
    results = sorted((f for f in p.iterdir() if f.is_file() and _RESULT_RE.match(f.name)),
                     key=lambda f: _natural(_result_stem(f)))
    power = p / "power"
    published = power.is_dir() and any(d.is_dir() and d.name.startswith("result_") for d in power.iterdir())
    if not results or not (published or len(results) > 1):
        return None
    systems = sorted(f for f in p.iterdir() if f.is_file() and f.name.startswith("system") and f.suffix == ".json")
    repo_system = p.parent.parent.parent / "systems" / f"{p.parent.name}.json"
    if not systems and repo_system.is_file():
        systems = [repo_system]
    runs = []
    for r in results:
        stem = _result_stem(r)
        srcs = [r, *systems]
        if (power / stem).is_dir():
            srcs.append(power / stem)
        runs.append((stem, srcs))
    return runs


def _natural(stem: str) -> tuple[int, str]:
    tail = stem.rsplit("_", 1)[-1]
    return (int(tail), stem) if tail.isdigit() else (1 << 62, stem)


def classify(paths: Sequence[str | Path], builder: RunBuilder | None = None) -> dict[str, list[Path]]:
    """Sort sources into result logs, node power logs, switch logs and submitter totals (folders are
    searched one level: a ``power*`` sub-folder is the run's power measurement)."""
    out: dict[str, list[Path]] = {"result": [], "power": [], "switch": [], "total": [], "other": []}
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(x for x in p.iterdir() if x.is_file())
            power_dirs = sorted(x for x in p.iterdir() if x.is_dir() and x.name.startswith("power"))
            if power_dirs:
                chosen = next((d for d in power_dirs if d.name == "power_ac"), power_dirs[0])
                for d in power_dirs:
                    if d != chosen and builder:
                        builder.drop(f"{d}: another power measurement of the same run (imported {chosen.name}); "
                                     "pass that folder explicitly to import it instead")
                files += sorted(x for x in chosen.iterdir() if x.is_file())
            for d in sorted(x for x in p.iterdir() if x.is_dir() and x not in power_dirs):
                if builder:
                    builder.drop(f"{d}: sub-folder not searched (another run?); import it separately")
        elif p.exists():  # a FIFO or device given is refused as what it is, not as missing
            require_regular_file(p, "the source")
            files = [p]
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
        for f in files:
            if _NODE_RE.match(f.name):
                out["power"].append(f)
            elif _SW_RE.match(f.name):
                out["switch"].append(f)
            elif _RESULT_RE.match(f.name):
                out["result"].append(f)
            elif f.name.startswith("total_power"):
                out["total"].append(f)
            else:
                out["other"].append(f)
    return out


def _number(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _record_value(v: Any) -> float | None:
    """A record's value: a number, or MLCommons' ``{"value": x}`` form."""
    if isinstance(v, dict):
        v = v.get("value")
    return _number(v)


# The record kinds a power log's scoring walk needs, by index in :class:`_Records`; the markers' value
# is None, every other kind's a number (read_power_log keeps a reading only with one)
_KEYS = ("power_reading", "interconnect_power_est", "power_measurement_start", "power_measurement_stop",
         "conversion_eff")
_VALUELESS = frozenset(i for i, k in enumerate(_KEYS) if k.startswith("power_measurement_"))


class _Records:
    """``(time_ms, key, value)`` of a log in file order, in three typed arrays: 17 bytes a record, where a
    tuple each cost ~130 bytes (a 2 GiB log of readings holds 15 million of them)."""

    def __init__(self) -> None:
        self.t, self.k, self.v = array("d"), array("b"), array("d")

    def append(self, tms: float, key: str, v: float | None) -> None:
        k = _KEYS.index(key)
        if (v is None) != (k in _VALUELESS):
            raise ValueError(f"{key} record with value {v!r}: markers have none, other records a number")
        self.t.append(tms)
        self.k.append(k)
        self.v.append(0.0 if v is None else v)  # the key says None (a NaN reading stays NaN)

    def _at(self, i: int) -> tuple[float, str, float | None]:
        k = self.k[i]
        return self.t[i], _KEYS[k], None if k in _VALUELESS else self.v[i]

    def __len__(self) -> int:
        return len(self.t)

    def __iter__(self) -> Iterator[tuple[float, str, float | None]]:
        return (self._at(i) for i in range(len(self.t)))

    def in_time_order(self) -> Iterator[tuple[float, str, float | None]]:
        """The records sorted by time, ties in file order (what ``sorted(key=time)`` gave), without a list."""
        if not self.t:
            return iter(())
        order = np.argsort(np.frombuffer(self.t, dtype=np.float64), kind="stable")
        return (self._at(int(i)) for i in order)


class _Where(Sequence[str]):
    """``file:line`` of each reading, made only when one is named (a string each cost ~100 bytes)."""

    def __init__(self, path: Path, lines: np.ndarray) -> None:
        self.path, self.lines = path, lines

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [f"{self.path}:{int(n)}" for n in self.lines[i]]
        return f"{self.path}:{int(self.lines[i])}"


@dataclass
class PowerLog:
    """One node's (or switch's) power log as written: readings as read, markers, power-record settings."""

    host: str
    path: Path
    t_ns: np.ndarray  # readings with a numeric value, time-sorted (stable)
    w: np.ndarray  # as read (W)
    where: Sequence[str]  # "file:line" of each reading (made when asked: _Where)
    start_ms: int | None = None
    stop_ms: int | None = None
    conversion_eff: float | None = None  # None: not stated (MLCommons then uses 1.0)
    measurement_type: str | None = None
    # (time_ms, key, value) in file order: what MLCommons' scoring rule walks
    records: _Records = field(default_factory=_Records)
    key: str = "power_reading"  # what its readings are: power_reading (measured) or interconnect_power_est
    # clock intervals re-lived after steps back in file order, and the median interval: core.energy's
    # rules 4 and 5 (importers.sanity.screen_time; a constant estimate has neither)
    relived: Intervals = field(default_factory=lambda: merge_intervals([], []))
    period_s: float | None = None

    @property
    def eff(self) -> float:
        return 1.0 if self.conversion_eff is None else self.conversion_eff


def read_power_log(path: Path, builder: RunBuilder, key: str = "power_reading") -> PowerLog:
    """One node's ``power_reading`` (or a switch's ``interconnect_power_est``) records, the
    measurement markers and ``conversion_eff``; markers are checked, never trusted to cut."""
    m = _NODE_RE.match(path.name) or _SW_RE.match(path.name)
    host = f"{path.name.split('_')[0]}_{m.group(1)}" if m else path.name.split(".")[0]
    check_name(host, f"{path}: host")  # it becomes telemetry/<host>.parquet
    log = PowerLog(host, path, np.empty(0, np.int64), np.empty(0), [], key=key)
    # typed arrays: 24 bytes a reading, where lists of Python ints, floats and "file:line" strings cost
    # ~330 (a gzip bomb reached the 2 GiB cap only at 5.3 GB of memory)
    t, w, lines = array("q"), array("d"), array("q")
    effs: list[float] = []
    nulls = 0
    for lineno, _, rec in iter_mllog(path):
        k, tms = rec["key"], rec["time_ms"]
        if not isinstance(tms, int | float) or isinstance(tms, bool):
            raise SourceFormatError(path, lineno, f"time_ms is not a number: {tms!r}")
        if not -_MAX_MS <= tms <= _MAX_MS:  # NaN fails too; in ns it must fit the int64 tables
            raise SourceFormatError(path, lineno, f"time_ms is not an epoch time in milliseconds: {tms!r}")
        if k == key:
            v = _record_value(rec.get("value"))
            if v is None:
                nulls += 1
                continue
            t.append(int(tms))
            w.append(v)
            lines.append(lineno)
            log.records.append(float(tms), k, v)
        elif k in ("power_measurement_start", "power_measurement_stop"):
            setattr(log, "start_ms" if k.endswith("start") else "stop_ms", int(tms))
            log.records.append(float(tms), k, None)
        elif k == "conversion_eff":
            v = _record_value(rec.get("value"))
            if v is None or not 0 < v <= 1.5:
                raise SourceFormatError(path, lineno, f"conversion_eff is not a plausible efficiency: {rec.get('value')!r}")
            effs.append(v)
            md = rec.get("metadata")
            log.measurement_type = md.get("measurement_type") if isinstance(md, dict) else log.measurement_type
            log.records.append(float(tms), k, v)
    if not t:
        raise SourceFormatError(path, None, f"no {key} lines found (is this an MLPerf power log?)")
    if nulls:
        builder.warn(f"{path}: {nulls} {key} line(s) without a numeric value were skipped")
    if len(set(effs)) > 1:
        builder.warn(f"{path}: conversion_eff changes within the log ({sorted(set(effs))}); the last one is "
                     "applied to every reading, as MLCommons' result_summarizer does")
    log.conversion_eff = effs[-1] if effs else None
    t_arr = np.frombuffer(t, dtype=np.int64)
    where = _Where(path, np.frombuffer(lines, dtype=np.int64))  # file order, for screen_time
    if log.start_ms is not None and log.stop_ms is not None and log.stop_ms <= log.start_ms:
        builder.warn(f"{path}: power_measurement_stop ({log.stop_ms}) is not after power_measurement_start "
                     f"({log.start_ms}); ignoring the stop marker and keeping all {len(t)} readings")
    elif log.stop_ms is not None and t_arr.max() > log.stop_ms:
        builder.warn(f"{path}: {(t_arr > log.stop_ms).sum()} readings after power_measurement_stop; kept")
    order = np.argsort(t_arr, kind="stable")
    if key == "power_reading":  # steps back and gaps, in file order, before the sort below
        log.relived, log.period_s = screen_time(builder, host, "switch" if _SW_RE.match(path.name) else "node",
                                                t_arr * _MS, where=where)
    elif np.any(np.diff(t_arr) < 0):
        builder.warn(f"{path}: readings are not in time order; sorted")
    log.t_ns = t_arr[order] * _MS
    log.w = np.frombuffer(w, dtype=np.float64)[order]
    log.where = _Where(path, where.lines[order])
    return log


_SWITCH_KEYS = ("interconnect_power_est", "power_reading")


def _read_switch(path: Path, builder: RunBuilder) -> PowerLog:
    """A switch's log in either form the MLPerf power rules allow ("measure or estimate interconnects"):
    an estimate (``interconnect_power_est``: a constant, what MLCommons' summarizer reads) or measured
    readings (``power_reading`` lines with their measurement markers, as a node's log). The form is the
    first of the two keys the log holds."""
    key = next((r["key"] for _, _, r in iter_mllog(path) if r["key"] in _SWITCH_KEYS), None)
    if key is None:
        raise SourceFormatError(path, None, "no interconnect_power_est or power_reading lines found (is this an "
                                            "MLPerf switch power log?)")
    builder.add_source(path, role="switch power estimate" if key == "interconnect_power_est" else "switch power")
    return read_power_log(path, builder, key=key)


def read_result_log(path: Path, builder: RunBuilder) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Events (rank 0) and run facts from a result log (first rank prefix that logs run_start)."""
    recs = _first_rank_records(path)
    facts: dict[str, Any] = {}
    for _, r in recs:
        if r.get("event_type") == "POINT_IN_TIME" and r["key"] not in ("tracked_stats", "eval_accuracy", "cache_clear"):
            facts.setdefault(r["key"], r.get("value"))
    events, run_start, run_stop, status = _run_phases(path, recs, builder)
    steps = _StepCounter(_number(facts.get("max_sequence_length")), _number(facts.get("global_batch_size")))
    events += _timeline_events(path, recs, run_start, run_stop, steps)
    facts.update(run_start_ms=run_start, run_stop_ms=run_stop, status=status, result_log=str(path),
                 train_steps=steps.n_step)
    facts["facts"] = {k: v for k, v in facts.items() if isinstance(v, int | float | str) and len(str(v)) < 200}
    return events, facts


def _first_rank_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of the first rank prefix that logs ``run_start`` (the other ranks
    repeat rank 0's records)."""
    recs = list(iter_mllog(path))
    if not recs:
        raise SourceFormatError(path, None, f"no {MARK} lines found (is this an MLPerf result log?)")
    starters = [pre for _, pre, r in recs if r["key"] == "run_start"]
    if not starters:
        raise SourceFormatError(path, None, "no run_start record: the log ends before training started")
    prefix = starters[0]
    return [(ln, r) for ln, pre, r in recs if pre == prefix]


def _run_phases(path: Path, recs: list[tuple[int, dict[str, Any]]],
                builder: RunBuilder) -> tuple[list[dict[str, Any]], Any, Any, Any]:
    """The ``run`` phase (run_start → run_stop, or the last record) and the ``init`` phase when logged;
    also returns run_start, run_stop (ms, as logged) and the run's status."""
    events: list[dict[str, Any]] = []
    run_start = next(r["time_ms"] for _, r in recs if r["key"] == "run_start")
    run_stop = next((r["time_ms"] for _, r in recs if r["key"] == "run_stop"), None)
    status = next((r.get("metadata", {}).get("status") for _, r in recs if r["key"] == "run_stop"), None)
    if run_stop is None:
        builder.warn(f"{path}: no run_stop record (the run did not finish); the run window ends at the last record")
        run_stop = recs[-1][1]["time_ms"]
    events.append({"rank": 0, "kind": "phase", "name": "run", "t_start_ns": run_start * _MS,
                   "t_end_ns": run_stop * _MS, "attrs": {"status": status, "source": "run_start/run_stop"}})
    init_start = next((r["time_ms"] for _, r in recs if r["key"] == "init_start"), None)
    init_stop = next((r["time_ms"] for _, r in recs if r["key"] == "init_stop"), None)
    if init_start is not None and init_stop is not None:
        events.append({"rank": 0, "kind": "phase", "name": "init", "t_start_ns": init_start * _MS,
                       "t_end_ns": init_stop * _MS, "attrs": {"source": "init_start/init_stop"}})
    return events, run_start, run_stop, status


_MS = 1_000_000  # ns per ms
_MAX_MS = (2**63 - 1) // _MS  # the latest time_ms whose ns fits an int64 (the year 2262)


@dataclass
class _StepCounter:
    """Step numbers and tokens of ``tracked_stats`` records, whose ``metadata.step`` is cumulative
    (tokens = sequence length × global batch × step, or samples)."""

    seq: float | None
    gbs: float | None
    prev_cum: float | None = None
    n_step: int = 0

    def advance(self, cum: float | None) -> tuple[int, float | None]:
        """``(step, tokens of this step or None)`` of the next timed record."""
        self.n_step += 1
        per_step = cum - self.prev_cum if cum is not None and self.prev_cum is not None else None
        tokens_per_step = self.seq * self.gbs if self.seq and self.gbs else None
        if cum is not None and tokens_per_step is not None and cum % tokens_per_step == 0:
            if per_step is None:
                per_step = tokens_per_step
            step = int(cum // tokens_per_step)
        else:
            step = self.n_step
        self.prev_cum = cum
        return step, per_step


def _timeline_events(path: Path, recs: list[tuple[int, dict[str, Any]]], run_start: Any, run_stop: Any,
                     steps: _StepCounter) -> list[dict[str, Any]]:
    """``eval`` events, ``step`` events of ``train_step_timing`` records and ``train_block`` phases of
    ``throughput`` records, in log order."""
    events: list[dict[str, Any]] = []
    eval_open: tuple[int, dict[str, Any]] | None = None
    last_point = run_start
    last_samples: float | None = None
    seq, gbs = steps.seq, steps.gbs
    for lineno, r in recs:
        key, tms, md = r["key"], r["time_ms"], r.get("metadata") or {}
        md = md if isinstance(md, dict) else {}
        if key == "eval_start":
            eval_open = (tms, {"epoch_num": md.get("epoch_num")})
        elif key == "eval_accuracy" and eval_open is not None:
            eval_open[1]["eval_accuracy"] = _number(r.get("value"))
        elif key == "eval_stop" and eval_open is not None:
            events.append({"rank": 0, "kind": "eval", "name": "eval", "t_start_ns": eval_open[0] * _MS,
                           "t_end_ns": tms * _MS, "attrs": eval_open[1]})
            eval_open = None
        elif key == "tracked_stats":
            value = r.get("value")
            if not isinstance(value, dict):
                raise SourceFormatError(path, lineno, f"tracked_stats value is not an object: {value!r}")
            timing = _number(value.get("train_step_timing in s"))
            cum = _number(md.get("step"))
            if timing is not None:
                step, per_step = steps.advance(cum)
                events.append({
                    "rank": 0, "kind": "step", "name": "train_step", "step": step,
                    "t_start_ns": round((tms - timing * 1000.0) * _MS), "t_end_ns": tms * _MS,
                    "window": None,  # set by mark_window; steps outside run_start → run_stop stay null
                    "tokens": int(per_step) if per_step is not None and seq else None,
                    "samples": int(gbs) if gbs else None,
                    "attrs": {"train_step_timing_s": timing, "mlperf_step": cum, "tokens_scope": "job",
                              "source_line": lineno,
                              **({} if run_start <= tms <= run_stop else {"outside_run_window": True})},
                })
            elif "validation_step_timing in s" in value:
                pass  # inside an eval window; the eval event already covers it
            elif "throughput" in value:
                samples = cum
                events.append({
                    "rank": 0, "kind": "phase", "name": "train_block", "t_start_ns": last_point * _MS,
                    "t_end_ns": tms * _MS,
                    "samples": int(samples - last_samples) if samples is not None and last_samples is not None else None,
                    "attrs": {"throughput": _number(value["throughput"]), "mlperf_step": cum, "source_line": lineno},
                })
                last_samples = samples
            last_point = tms
    return events


def read_total(path: Path) -> float | None:
    """The submitter's energy in kWh from ``total_power.txt`` (``Total Power Usage: 415.22 kWh``)."""
    m = re.search(r"([0-9.]+)\s*kWh", read_text(path))
    return float(m.group(1)) if m else None


def read_system(path: Path) -> int | None:
    """Accelerators of the job from an MLPerf system description (``system_*.json``):
    ``number_of_nodes × accelerators_per_node``; ``None`` when either is missing or not a number."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise SourceFormatError(path, exc.lineno, f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise SourceFormatError(path, 1, "an MLPerf system description is a JSON object")
    nodes, per_node = _number(data.get("number_of_nodes")), _number(data.get("accelerators_per_node"))
    return int(nodes * per_node) if nodes and per_node else None


def _expand_benchmark(paths: Sequence[str | Path], result: str | int | None) -> list[Path]:
    """The sources of one run: a published benchmark folder is replaced by the files of its one run
    (or of ``result``); several runs without ``result`` are refused, naming them."""
    out = [Path(p) for p in paths]
    runs = benchmark_runs(out[0]) if len(out) == 1 else None
    if runs is None:
        if result is not None:
            raise ValueError(f"--result {result} applies to a benchmark folder laid out as MLCommons publishes "
                             "results (result_N.txt beside power/result_N/); these sources are one run")
        return out
    names = [n for n, _ in runs]
    if result is None:
        if len(runs) > 1:
            raise ValueError(f"{out[0]} holds {len(runs)} runs ({', '.join(names)}): import them all with "
                             "`powertrain import mlperf FOLDER --out DIR` (one run directory each), or pick one "
                             "with --result N")
        return runs[0][1]
    want = str(result) if str(result).startswith("result_") else f"result_{result}"
    for n, srcs in runs:
        if n == want:
            return srcs
    raise ValueError(f"{out[0]} has no {want}: its runs are {', '.join(names)}")


def import_mlperf(paths: Sequence[str | Path], name: str | None = None, warmup_steps: int | None = None,
                  result: str | int | None = None,
                  hold_limit_s: float = DEFAULT_HOLD_LIMIT_S) -> RunBuilder:
    """Parse MLPerf power and result logs of one run into a :class:`RunBuilder` (call ``.write(out)``).

    ``paths``: files, a flat run folder, or a published benchmark folder (with ``result`` naming the
    run, ``N`` or ``result_N``, when it holds several). The run's window is run_start → run_stop;
    energies are over it on :mod:`powertrain.core.energy`'s edge rule (``hold_limit_s``).
    """
    srcs = _expand_benchmark(paths, result)
    b = RunBuilder(format="mlperf", name=name)
    groups = classify(srcs, b)
    if not groups["power"] and not groups["result"]:
        raise SourceFormatError(srcs[0], None, "no MLPerf node_<N>.txt power log or result_*.txt log found")
    if len(groups["result"]) > 1:
        raise SourceFormatError(groups["result"][1], None, "more than one result log: import one run at a time")
    per_node, job_nodes = _system(b, groups["other"])
    nodes = _read_nodes(groups["power"], b, per_node)
    switches = [_read_switch(f, b) for f in groups["switch"]]
    reported = None
    for f in groups["total"]:
        b.add_source(f, role="reported_total")
        reported = read_total(f)
    summary: dict[str, Any] = {"nodes": len(nodes), "switches": len(switches), "reported_energy_kwh": reported}
    _missing_nodes(b, nodes, job_nodes, groups["power"], summary)
    events: list[dict[str, Any]] = []
    for f in groups["result"]:
        b.add_source(f, role="result")
        ev, facts = read_result_log(f, b)
        events += ev
        summary.update({k: facts.get(k) for k in ("run_start_ms", "run_stop_ms", "status", "train_steps",
                                                   "global_batch_size", "max_sequence_length",
                                                   "submission_benchmark", "submission_division", "facts")})
        b.mapped.update({"run_start/run_stop": "run.json window; events phase 'run' (rank 0)",
                         "eval_start/eval_stop + eval_accuracy": "events eval (rank 0)",
                         "tracked_stats train_step_timing": "events step (rank 0): t_end = log time, "
                                                            "t_start = t_end - timing; attrs.energy_j"})
        b.drop("init burst of every rank and per-rank duplicates of rank-0 records (only the first rank "
               "that logs run_start is read); configuration records are kept in run.json mlperf.facts")
    window = _set_run_window(b, summary, nodes)
    if not nodes:
        where = srcs[0].parent if srcs[0].is_file() else srcs[0]
        summary["energy_run_j"] = None
        summary["why_null"] = {"energy_run_j": f"no MLPerf power logs (node_*.txt) among the sources in {where}"}
        b.warn(f"{where}: no MLPerf power logs (node_*.txt) found: imported the run's timing only, no energy")
    elif window is not None:
        _energies(events, nodes, switches, window, summary, b, hold_limit_s)
    mark_window([e for e in events if not e["attrs"].get("outside_run_window")], warmup_steps, b,
                declared="MLPerf run_start → run_stop")
    b.add_events(events_table(events))
    b.info["mlperf"] = summary
    return b


def _system(b: RunBuilder, others: list[Path]) -> tuple[int | None, tuple[int, str] | None]:
    """Job device count from ``system_*.json`` (run.json); returns accelerators per node when stated,
    and the job's node count with the files that state it (None: not stated, or they disagree)."""
    devices: dict[str, int | None] = {}
    per_node: set[int] = set()
    job_nodes: dict[str, int] = {}
    for f in others:
        if f.name.startswith("system") or (f.suffix == ".json" and f.parent.name == "systems"):
            b.add_source(f, role="system description")
            devices[f.name] = read_system(f)
            data = json.loads(read_text(f))
            apn = _number(data.get("accelerators_per_node"))
            if apn:
                per_node.add(int(apn))
            n_nodes = _number(data.get("number_of_nodes"))
            if n_nodes:
                job_nodes[f.name] = int(n_nodes)
        elif f.suffix not in (".json", ".md"):
            b.drop(f"{f.name}: not an MLPerf power or result log")
    counts = set(devices.values())
    if len(counts) == 1 and None not in counts:
        set_job_devices(b, counts.pop(), f"MLPerf {', '.join(sorted(devices))}: number_of_nodes × accelerators_per_node")
    elif len(counts) > 1:
        b.warn(f"MLPerf system descriptions disagree on the device count ({devices}); per-device throughput unknown")
        set_job_devices(b, None, f"MLPerf system descriptions disagree: {devices}")
    else:
        set_job_devices(b, None, "no MLPerf system_*.json (number_of_nodes × accelerators_per_node) among the "
                                 "sources: pass the submission's run folder or that file to know it")
    stated = set(job_nodes.values())
    nodes = (stated.pop(), f"{', '.join(sorted(job_nodes))} number_of_nodes") if len(stated) == 1 else None
    return (max(per_node) if per_node else None), nodes


def _missing_nodes(b: RunBuilder, nodes: dict[str, _Node], job_nodes: tuple[int, str] | None, files: list[Path],
                   summary: dict[str, Any]) -> None:
    """Nodes the job had (the system description's ``number_of_nodes``) without a power log, named
    when the logs' numbering says which (``node_0``… or ``node_1``…, as the others), in ``run.json``
    ``data_quality.missing_devices`` and ``mlperf.nodes_missing``; the run's energy is then unknown."""
    if job_nodes is None or not nodes:
        return
    expected, source = job_nodes
    summary["nodes_expected"] = expected
    if len(nodes) >= expected:
        if len(nodes) > expected:
            b.warn(f"{len(nodes)} node power logs but {source} says the job had {expected} nodes")
        return
    idx = sorted(int(m.group(1)) for f in files if (m := _NODE_RE.match(f.name)))
    base = 0 if idx and idx[0] == 0 else 1
    names = [f"node_{i}" for i in range(base, base + expected) if i not in set(idx)]
    if len(names) != expected - len(nodes):
        names = []  # the numbering does not say which: only how many
    what = ", ".join(names) if names else f"{expected - len(nodes)} node(s) (the logs' numbering does not say which)"
    why = (f"{what} without a power log: the job had {expected} nodes ({source}), {len(nodes)} were measured")
    summary["nodes_missing"] = names or expected - len(nodes)
    b.data_quality["missing_devices"] = {"unit": "node", "expected": expected, "found": len(nodes),
                                         "names": names, "source": source, "why": why}
    b.warn(f"{why}; the run's energy is unknown (the measured nodes' sum is energy_run_measured_nodes_j)")


# A node's power: what 3 x a 1 kW accelerator's TDP allows per accelerator slot (at least 8 slots).
_W_PER_ACCELERATOR_MAX = 3000.0


@dataclass
class _Node:
    log: PowerLog
    t_ns: np.ndarray  # cleaned (screened, de-duplicated) reading times
    as_read_w: np.ndarray
    quality: dict[str, int]

    @property
    def converted_w(self) -> np.ndarray:
        return self.as_read_w * self.log.eff


def _read_nodes(files: list[Path], b: RunBuilder, per_node: int | None) -> dict[str, _Node]:
    """Read, screen and clean every node's readings; telemetry ``power_w`` = reading × conversion_eff."""
    limit = _W_PER_ACCELERATOR_MAX * max(per_node or 8, 8)
    nodes: dict[str, _Node] = {}
    effs: dict[str, float | None] = {}
    for f in files:
        b.add_source(f, role="power")
        log = read_power_log(f, b)
        if log.host in nodes:
            raise SourceFormatError(f, None, f"a second power log for {log.host}; import one run at a time")
        # screen only takes len() of and indexes its ``where`` (annotated list | ndarray): the lazy labels do
        w = screen(b, "power_w", log.w, where=cast("list[str]", log.where), limits=(0.0, limit))
        r = clean_readings(log.t_ns, w)
        node = _Node(log, r.t_ns, r.value, r.quality)
        nodes[log.host] = node
        effs[log.host] = log.conversion_eff
        b.add_telemetry(telemetry_table(node.t_ns, log.host, "node", {"power_w": node.converted_w}))
        b.add_device(log.host, "node", kind="node", vendor=None, name="node power meter",
                     conversion_eff=log.conversion_eff, measurement_type=log.measurement_type)
        b.device_quality(log.host, "node", readings_in_log=int(log.t_ns.size), **r.quality)
        for k, v in r.quality.items():
            b.count_quality(k, v)
    if nodes:
        stated = {h: e for h, e in effs.items() if e is not None}
        b.mapped["power_reading (W, node)"] = (
            "telemetry.power_w on device 'node' of host node_<N>, × conversion_eff of that log"
            + (f" ({', '.join(f'{h} {e:g}' for h, e in sorted(stated.items()))})" if stated
               else " (not stated in any log: 1, as MLCommons assumes)"))
    return nodes


def _set_run_window(b: RunBuilder, summary: dict[str, Any], nodes: dict[str, _Node]) -> tuple[int, int] | None:
    """run_start → run_stop (the result log); without one, the power logs' own measurement window."""
    if summary.get("run_start_ms") is not None:
        t0, t1 = int(summary["run_start_ms"]) * _MS, int(summary["run_stop_ms"]) * _MS
        source = "MLPerf run_start → run_stop" + ("" if summary.get("status") else " (no run_stop: last record)")
    elif nodes:
        spans = [_measurement_span(n.log) for n in nodes.values()]
        t0, t1 = min(s[0] for s in spans), max(s[1] for s in spans)
        source = "MLPerf power_measurement_start → power_measurement_stop (no result log among the sources)"
    else:
        return None
    b.set_window(t0, t1, source)
    summary["window"] = {"t0_ns": t0, "t1_ns": t1, "source": source, "seconds": (t1 - t0) / 1e9}
    return t0, t1


def _measurement_span(log: PowerLog) -> tuple[int, int]:
    """A log's power_measurement_start → _stop (ns); a missing or not-later stop marker is the last
    reading (mlperf-logging's rule for a missing stop), a missing start the first reading."""
    start = log.start_ms * _MS if log.start_ms is not None else int(log.t_ns[0])
    stop_ok = log.stop_ms is not None and (log.start_ms is None or log.stop_ms > log.start_ms)
    stop = log.stop_ms * _MS if stop_ok and log.stop_ms is not None else int(log.t_ns[-1])
    return start, max(stop, start)


def _energies(events: list[dict[str, Any]], nodes: dict[str, _Node], switches: list[PowerLog],
              window: tuple[int, int], summary: dict[str, Any], b: RunBuilder, hold_limit_s: float) -> None:
    """The run's energy (run window), per-step energy, the measurement-window energy and the score."""
    t0, t1 = window
    why: dict[str, str] = summary.setdefault("why_null", {})
    per_node: dict[str, dict[str, Any]] = {}
    node_total: float | None = 0.0
    as_read_total: float | None = 0.0
    for host, n in nodes.items():
        we = window_energy(n.t_ns, n.converted_w, t0, t1, hold_limit_s=hold_limit_s, **_time_rules(n.log))
        raw = window_energy(n.t_ns, n.as_read_w, t0, t1, hold_limit_s=hold_limit_s, **_time_rules(n.log))
        per_node[host] = _node_entry(we, raw, n)
        b.device_quality(host, "node", edge_held_s=we.edge_held_s, held_start_s=we.held_start_s,
                         held_end_s=we.held_end_s, energy_why_null=we.why_null)
        node_total = None if node_total is None or we.energy_j is None else node_total + we.energy_j
        as_read_total = None if as_read_total is None or raw.energy_j is None else as_read_total + raw.energy_j
    nulls = {h: e["why_null"] for h, e in per_node.items() if e["why_null"]}
    if nulls:
        why["energy_run_nodes_j"] = "; ".join(f"{h}: {r}" for h, r in sorted(nulls.items()))
        b.warn(f"run energy unknown: {len(nulls)} node(s) do not cover run_start → run_stop within the "
               f"{hold_limit_s:g} s an edge may be held ({why['energy_run_nodes_j'][:200]})")
    held = {h: e["edge_held_s"] for h, e in per_node.items() if e["edge_held_s"]}
    switch_j = _switch_run_energy(switches, t0, t1, b, why, hold_limit_s)
    total = None if node_total is None else node_total + (switch_j or 0.0)
    missing = b.data_quality.get("missing_devices")
    if missing and total is not None:
        why["energy_run_j"] = f"{missing['why']}: the run's energy is unknown (energy_run_measured_nodes_j)"
        total = None
    summary.update({
        "energy_run_j": total, "energy_run_kwh": None if total is None else total / 3.6e6,
        "energy_run_parts_j": {"nodes": node_total, "switch": switch_j},
        "energy_run_nodes_as_read_j": as_read_total,
        "energy_run_nodes_j": None if missing else node_total,
        "energy_run_measured_nodes_j": node_total,  # the nodes with a power log (all of them when none is missing)
        "energy_run_nodes_kwh": None if node_total is None or missing else node_total / 3.6e6,
        "edge_held_s": {"max": max(held.values()) if held else 0.0, "nodes_held": len(held)},
        "per_node": per_node,
        "integration": "powertrain.core.energy.window_energy per node over run_start → run_stop (trapezoid, "
                       f"interpolated edges, nearest reading held up to {hold_limit_s:g} s), summed over nodes",
    })
    if total is None:
        why.setdefault("energy_run_j", why.get("energy_run_nodes_j", "unknown"))
    if node_total is not None and summary.get("reported_energy_kwh") and not missing:
        summary["energy_vs_reported_rel"] = node_total / 3.6e6 / summary["reported_energy_kwh"] - 1.0
    run = next((e for e in events if e["kind"] == "phase" and e["name"] == "run"), None)
    if run is not None:
        run["attrs"]["energy_j"] = total
    _step_energy(events, nodes, window, summary, hold_limit_s)
    _measurement_window_energy(nodes, summary, hold_limit_s)
    _score(nodes, switches, summary, b)


def _time_rules(log: PowerLog) -> dict[str, Any]:
    """What core.energy needs to apply its time rules to a log's sorted readings: the median interval
    (the gap limit) and the intervals steps back re-lived, both found in file order."""
    return {"period_s": log.period_s, "relived": log.relived}


def _node_entry(we: WindowEnergy, raw: WindowEnergy, n: _Node) -> dict[str, Any]:
    return {"energy_j": we.energy_j, "energy_as_read_j": raw.energy_j, "conversion_eff": n.log.conversion_eff,
            "mean_power_w": we.mean_power_w, "held_start_s": we.held_start_s, "held_end_s": we.held_end_s,
            "edge_held_s": we.edge_held_s, "readings": we.readings, "why_null": we.why_null, **n.quality}


def _switch_run_energy(switches: list[PowerLog], t0: int, t1: int, b: RunBuilder, why: dict[str, str],
                       hold_limit_s: float) -> float | None:
    """Switch power in the run's energy: only a log on the run's clock that covers the window under the
    edge rule is included (as telemetry host ``sw_<N>``); otherwise dropped with the reason."""
    if not switches:
        why["energy_run_switch_j"] = "no switch power log (sw_*.txt) among the sources"
        return None
    total = 0.0
    reasons = []
    reason: str | None
    for sw in switches:
        slack = int(hold_limit_s * 1e9)
        lo, hi = int(sw.t_ns[0]), int(sw.t_ns[-1])
        if hi < t0 - slack or lo > t1 + slack:
            reason = (f"{sw.path.name}: its timestamps ({iso(lo)} … {iso(hi)}) are not on the run's clock "
                      f"(run_start {iso(t0)}); it counts in the MLCommons score only")
        else:
            we = window_energy(sw.t_ns, sw.w * sw.eff, t0, t1, hold_limit_s=hold_limit_s, **_time_rules(sw))
            reason = None if we.energy_j is not None else f"{sw.path.name}: {we.why_null}"
            if we.energy_j is not None:
                total += we.energy_j
                b.add_telemetry(telemetry_table(sw.t_ns, sw.host, "switch", {"power_w": sw.w * sw.eff}))
                b.add_device(sw.host, "switch", kind="switch", vendor=None,
                             name="interconnect power estimate" if sw.key == "interconnect_power_est"
                             else "interconnect power meter")
        if reason:
            reasons.append(reason)
            b.drop(f"{reason} (not in the run's energy)")
    if reasons:
        why["energy_run_switch_j"] = "; ".join(reasons)
        return None if len(reasons) == len(switches) else total
    return total


def _step_energy(events: list[dict[str, Any]], nodes: dict[str, _Node], window: tuple[int, int],
                 summary: dict[str, Any], hold_limit_s: float) -> None:
    """Energy of every step: Σ over nodes of the one integral over the step, edges held as the run's."""
    steps = [e for e in events if e["kind"] == "step"]
    if not steps:
        return
    a = np.array([e["t_start_ns"] for e in steps], dtype=np.int64)
    z = np.array([e["t_end_ns"] for e in steps], dtype=np.int64)
    lo, hi = min(window[0], int(a.min())), max(window[1], int(z.max()))
    step_e = np.zeros(len(steps))
    for n in nodes.values():
        e_node, _ = windows_energy(n.t_ns, n.converted_w, a, z, span=(lo, hi), hold_limit_s=hold_limit_s,
                                   **_time_rules(n.log))
        step_e += e_node
    for e, v in zip(steps, step_e, strict=True):
        e["attrs"]["energy_j"] = None if np.isnan(v) else float(v)
    if np.isfinite(step_e).any():
        summary["step_energy_j"] = {"count": len(steps), "mean": float(np.nanmean(step_e)),
                                    "min": float(np.nanmin(step_e)), "max": float(np.nanmax(step_e)),
                                    "sum": float(np.nansum(step_e))}


def _measurement_window_energy(nodes: dict[str, _Node], summary: dict[str, Any], hold_limit_s: float) -> None:
    """Σ over nodes of the one integral over each node's power_measurement_start → _stop."""
    total: float | None = 0.0
    notes = []
    for host, n in nodes.items():
        t0, t1 = _measurement_span(n.log)
        if n.log.start_ms is None or n.log.stop_ms is None or n.log.stop_ms <= n.log.start_ms:
            notes.append(f"{host}: marker missing or stop not after start, the readings' extent stands in")
        we = window_energy(n.t_ns, n.converted_w, t0, t1, hold_limit_s=hold_limit_s, **_time_rules(n.log))
        total = None if total is None or we.energy_j is None else total + we.energy_j
        if we.why_null:
            summary.setdefault("why_null", {})["measurement_window_energy_j"] = f"{host}: {we.why_null}"
    summary["measurement_window_energy_j"] = total
    summary["measurement_window_energy_kwh"] = None if total is None else total / 3.6e6
    summary["measurement_window_rule"] = ("nodes only, each over its own power_measurement_start → "
                                          "power_measurement_stop" + (f" ({'; '.join(notes)})" if notes else ""))


def mlcommons_node_power_w(log: PowerLog) -> tuple[float | None, str | None]:
    """A node's mean power as MLCommons' ``result_summarizer._compute_power_node`` computes it
    (before conversion_eff): records sorted by time (stable); from power_measurement_start to
    power_measurement_stop every reading weighs the time since the previous reading (or the start
    marker); the sum ÷ (stop − start). No stop marker, or one not after the start (where
    mlperf-logging divides by zero), is read as mlperf-logging reads a missing stop: the last reading."""
    recs = log.records.in_time_order()
    bogus_stop = log.start_ms is not None and log.stop_ms is not None and log.stop_ms <= log.start_ms
    agg = prev = last = start = 0.0
    start_found = stop_found = False
    stop: float | None = None
    for tms, key, v in recs:
        if key == "power_measurement_start":
            start, prev, start_found = tms, tms, True
        elif key == "power_reading" and start_found and not stop_found and v is not None:
            agg += v * (tms - prev)
            prev, last = tms, max(last, tms)
        elif key == "power_measurement_stop" and not bogus_stop:
            stop, stop_found = tms, True
    if not start_found:
        return None, f"{log.path.name}: no power_measurement_start (MLCommons' rule needs it)"
    stop = last if stop is None else stop
    if stop <= start:
        return None, f"{log.path.name}: no reading after power_measurement_start"
    return agg / (stop - start), None


def _score(nodes: dict[str, _Node], switches: list[PowerLog], summary: dict[str, Any], b: RunBuilder) -> None:
    """The MLCommons scoring figure: Σ nodes conversion_eff × mean power × time-to-train, plus Σ
    switches conversion_eff × estimate × time-to-train (``mlperf_logging.result_summarizer``)."""
    why = summary.setdefault("why_null", {})
    if summary.get("run_start_ms") is None or not summary.get("status"):
        why["score_j"] = "no run_start → run_stop in a result log: the time-to-train is unknown"
        summary["score_j"] = None
        return
    ttt_s = (float(summary["run_stop_ms"]) - float(summary["run_start_ms"])) / 1000.0
    per_node: dict[str, float | None] = {}
    for host, n in nodes.items():
        mean, reason = mlcommons_node_power_w(n.log)
        per_node[host] = None if mean is None else n.log.eff * mean * ttt_s
        if reason:
            why["score_nodes_j"] = reason
    known = [v for v in per_node.values() if v is not None]
    nodes_j = sum(known) if len(known) == len(per_node) else None
    switch_j = _score_switches(switches, ttt_s, why)
    total = None if nodes_j is None or (switches and switch_j is None) else nodes_j + (switch_j or 0.0)
    missing = b.data_quality.get("missing_devices")
    if missing and total is not None:
        why["score_j"] = f"{missing['why']}: the score would count the measured nodes only"
        total = None
    summary.update({
        "time_to_train_s": ttt_s,
        "score_j": total, "score_kwh": None if total is None else total / 3.6e6,
        "score_parts_j": {"nodes": nodes_j, "switch": switch_j},
        "score_nodes_j": per_node,
        "score_rule": "MLCommons result_summarizer: Σ nodes conversion_eff × mean power over "
                      "power_measurement_start → stop (each reading × time since the previous) × time-to-train"
                      " + Σ switches conversion_eff × interconnect_power_est × time-to-train (a measured "
                      "switch, power_reading lines, is scored as a node is: the summarizer reads estimates only)",
    })
    if nodes_j is not None and summary.get("reported_energy_kwh"):
        summary["score_nodes_vs_reported_rel"] = nodes_j / 3.6e6 / summary["reported_energy_kwh"] - 1.0


def _score_switches(switches: list[PowerLog], ttt_s: float, why: dict[str, str]) -> float | None:
    """The switches' part of the score: an estimate's first value (in file order, as mlperf-logging
    takes it) × conversion_eff × time-to-train; a measured switch's mean power by the node rule × the
    same. None (with the reason) when there is no switch log or one's part is unknown."""
    if not switches:
        why["score_switch_j"] = "no switch power log (sw_*.txt): the score counts the nodes only, as MLCommons does"
        return None
    total = 0.0
    for sw in switches:
        if sw.key == "interconnect_power_est":
            est = next(v for _, k, v in sw.records if k == "interconnect_power_est" and v is not None)
            total += sw.eff * est * ttt_s
            continue
        mean, reason = mlcommons_node_power_w(sw)
        if mean is None:
            why["score_switch_j"] = f"measured switch: {reason}"
            return None
        total += sw.eff * mean * ttt_s
    return total
