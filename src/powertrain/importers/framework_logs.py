"""Training logs of popular engines → ``step`` events (one parser per engine, sniffed per file).

* **Megatron-LM** ``iteration N/M | consumed samples: … | elapsed time per iteration (ms): … |
  throughput per GPU (TFLOP/s/GPU): … | global batch size: … | lm loss: … |`` (optionally prefixed
  by ``[YYYY-MM-DD HH:MM:SS[.ffffff]]``). A line reports the *average* over the iterations since the
  previous line (``--log-interval``). A line covering one iteration becomes a ``step`` event; a line
  covering ``k > 1`` iterations becomes a ``phase`` event ``train_interval`` with
  ``attrs.iterations = k`` and ``attrs.step_time_s`` = the reported average: per-step positions are
  not in the log, and inventing them would fake the step-time spread. ``using world size: N`` gives
  the job's device count.
* **torchtitan** ``[titan] 2025-01-01 12:00:00,123 - root - INFO - step: 10  loss: 7.1  memory:
  30.12GiB(38.1%)  tps: 6,123  tflops: 123.4  mfu: 39.6%`` (ANSI colours stripped). The window of a
  line runs from the previous line's time; same one-step / interval rule as Megatron. ``memory`` is
  the peak reserved memory (→ ``mem_peak_bytes``), ``tps`` tokens/s per GPU. The trainer's start
  line (``… global batch size 16, … sequence length 2048 …``) gives the tokens of a step.
* **NeMo / Lightning** progress bars ``global_step=49.0, …, train_step_timing in s=2.54`` (tqdm,
  ``\\r``-separated) and NeMo 2 ``ProgressPrinter`` lines (``| global_step: 1 | … | train_step_timing
  in s: 2.008``). Each distinct ``global_step`` is one ``step`` event of the given duration. The
  lines carry no wall-clock time: steps are placed back to back from ``anchor_ns`` (``--anchor``),
  which such a log requires.
* **MLPerf** result logs: ``tracked_stats`` via :mod:`powertrain.importers.mlperf`.

Times in logs are local wall-clock of the logging machine (``tz``). A ``[rankN]:`` prefix sets the
rank; otherwise events go to rank 0. Every step is in the measured window except the first
``warmup_steps`` (default 0; :func:`powertrain.importers.common.mark_window`). Batch counts in these
logs are the whole job's, so per-device throughput needs the job's device count (``run.json``
``job_device_count``, null when the log does not state it).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from powertrain.core.engine_logs import ANSI, RANK_PREFIX, TITAN_FIELDS, TITAN_TIME, number, parse_step_line
from powertrain.importers.common import (
    ANCHOR_HELP,
    RunBuilder,
    SourceFormatError,
    events_table,
    iso,
    mark_window,
    open_text,
    resolve_zone,
    set_job_devices,
)

_MEG_TS = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,6}))?\]")
_MEG_WORLD = re.compile(r"(?:using world size:|^\s*world_size\s*\.+)\s*(\d+)")
_TITAN_BATCH = re.compile(r"global batch size (\d+),.*?sequence length (\d+)")


def sniff(path: Path) -> str | None:
    """``megatron`` | ``torchtitan`` | ``nemo`` | ``mlperf`` | ``None`` from the first 2 MB."""
    with open_text(path) as f:
        head = f.read(2_000_000)
    if ":::MLLOG" in head and "run_start" in head:
        return "mlperf"
    if "elapsed time per iteration (ms)" in head:
        return "megatron"
    if "train_step_timing in s" in head:
        return "nemo"
    if re.search(r"step:\s*\d+\s+loss:", ANSI.sub("", head)):
        return "torchtitan"
    return None


def _ts(text: str, tz: dt.tzinfo, frac: str | None = None) -> int:
    d = dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=tz)
    ns = int(((frac or "") + "000000000")[:9])
    return int(d.timestamp()) * 1_000_000_000 + ns


def _interval_event(rank: int, step: int, k: int, t_end: int, dur_ns: int, **cols: Any) -> dict[str, Any]:
    attrs = cols.pop("attrs", {})
    if k == 1:
        return {"rank": rank, "kind": "step", "name": "train_step", "step": step, "t_start_ns": t_end - dur_ns,
                "t_end_ns": t_end, **cols, "attrs": attrs}
    return {"rank": rank, "kind": "phase", "name": "train_interval", "step": step, "t_start_ns": t_end - dur_ns,
            "t_end_ns": t_end, **cols, "attrs": {**attrs, "iterations": k, "first_step": step - k + 1}}


def parse_megatron(path: Path, b: RunBuilder, tz: dt.tzinfo, seq_len: int | None,
                   anchor_ns: int | None) -> tuple[list[dict[str, Any]], bool]:
    """Step events of a Megatron log and whether ``anchor_ns`` placed them (the log had no times)."""
    events: list[dict[str, Any]] = []
    prev_iter = 0
    t_rel = 0
    timed = None
    with open_text(path) as f:
        for lineno, raw in enumerate(f, 1):
            if "elapsed time per iteration (ms)" not in raw:
                if "world size" in raw or "world_size" in raw:
                    _world_size(raw, b)
                continue
            line = ANSI.sub("", raw)
            rank = int(m.group(1)) if (m := RANK_PREFIX.match(line)) else 0
            fields = _megatron_fields(line)
            try:
                it = int(fields["iteration"])
                ms = float(fields["elapsed time per iteration (ms)"])
            except (KeyError, ValueError):
                raise SourceFormatError(path, lineno, "Megatron iteration line without a readable "
                                                      "'iteration N/M' or 'elapsed time per iteration (ms)'") from None
            k = max(it - prev_iter, 1)
            prev_iter = it
            ts = _MEG_TS.search(line)
            if timed is None:
                timed = ts is not None
                if not timed:
                    t_rel = _need_anchor(path, anchor_ns)
            dur = round(ms * 1e6 * k)
            if ts:
                t_end = _ts(ts.group(1), tz, ts.group(2))
            else:
                t_rel += dur
                t_end = t_rel
            gbs = number(fields.get("global batch size"))
            loss = number(fields.get("lm loss"))
            attrs = {"step_time_s": ms / 1000.0, "tflops_per_gpu": number(fields.get("throughput per gpu (tflop/s/gpu)")),
                     "learning_rate": number(fields.get("learning rate")), "grad_norm": number(fields.get("grad norm")),
                     "consumed_samples": number(fields.get("consumed samples")), "source_line": lineno}
            samples = int(gbs * k) if gbs else None
            events.append(_interval_event(rank, it, k, t_end, dur, loss=loss, samples=samples,
                                          tokens=samples * seq_len if samples and seq_len else None,
                                          window=None, attrs={k2: v for k2, v in attrs.items() if v is not None}))
    if not events:
        raise SourceFormatError(path, None, "no Megatron iteration lines found")
    b.mapped.update({"Megatron elapsed time per iteration (ms)": "step duration (× iterations in the line)",
                     "Megatron lm loss": "events.loss", "Megatron global batch size": "events.samples (the job's)",
                     "Megatron throughput per GPU (TFLOP/s/GPU)": "attrs.tflops_per_gpu"})
    if not timed:
        _anchored(b, path, anchor_ns)
    if seq_len is None:
        b.drop("Megatron tokens: the log has no sequence length; pass --seq-len to fill events.tokens")
    return events, not timed


def _megatron_fields(line: str) -> dict[str, str]:
    """``key: value`` cells of a Megatron iteration line (keys lower case), ``iteration`` = N of ``N/M``."""
    fields: dict[str, str] = {}
    for part in line.split("|"):
        if "iteration" in part and "/" in part and "elapsed" not in part:
            m_it = re.search(r"iteration\s+(\d+)\s*/\s*(\d+)", part)
            if m_it:
                fields["iteration"] = m_it.group(1)
        elif ":" in part:
            key, _, v = part.rpartition(":")
            fields[key.strip().lower()] = v.strip()
    return fields


def _world_size(line: str, b: RunBuilder) -> None:
    """Megatron's ``using world size: N, …`` / ``world_size …… N`` argument dump: the job's device count."""
    m = _MEG_WORLD.search(ANSI.sub("", line))
    if m and "job_device_count" not in b.info:
        set_job_devices(b, int(m.group(1)), "Megatron log: world size (one rank per device)")


def parse_torchtitan(path: Path, b: RunBuilder, tz: dt.tzinfo, seq_len: int | None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    prev: tuple[int, int] | None = None
    tokens_per_step: int | None = None
    with open_text(path) as f:
        for lineno, raw in enumerate(f, 1):
            if "global batch size" in raw and (mb := _TITAN_BATCH.search(ANSI.sub("", raw))):
                # the trainer's start line states the job's batch: tokens of one step, all ranks together
                gbs, log_seq = int(mb.group(1)), int(mb.group(2))
                if seq_len is not None and seq_len != log_seq:
                    raise SourceFormatError(path, lineno, f"the log says sequence length {log_seq}, --seq-len says "
                                                          f"{seq_len}: drop --seq-len or fix it")
                tokens_per_step = gbs * log_seq
                b.info.setdefault("torchtitan", {}).update(global_batch_size=gbs, seq_len=log_seq, source_line=lineno)
                continue
            if "step:" not in raw or "loss:" not in raw:
                continue
            line = ANSI.sub("", raw)
            m = TITAN_FIELDS.search(line)
            if not m:
                continue
            ts = TITAN_TIME.search(line)
            if not ts:
                raise SourceFormatError(path, lineno, "torchtitan step line without a timestamp "
                                                      "(expected '[titan] YYYY-MM-DD HH:MM:SS,mmm - ...')")
            rank = int(r.group(1)) if (r := RANK_PREFIX.match(line)) else 0
            t = _ts(ts.group(1), tz, ts.group(2))
            step = int(m.group("step"))
            if prev is None:
                prev = (step, t)
                b.drop(f"{path.name}: first logged step {step}: no earlier line to start its window")
                continue
            k = step - prev[0]
            if k <= 0:
                raise SourceFormatError(path, lineno, f"step {step} does not follow step {prev[0]}")
            mem = number(m.group("mem"))
            attrs = {"tps_per_gpu": number(m.group("tps")), "tflops_per_gpu": number(m.group("tflops")),
                     "mfu_pct": number(m.group("mfu")), "source_line": lineno}
            events.append(_interval_event(rank, step, k, t, t - prev[1], loss=number(m.group("loss")),
                                          mem_peak_bytes=int(mem * (1 << 30)) if mem is not None else None,
                                          tokens=tokens_per_step * k if tokens_per_step else None,
                                          attrs={a: v for a, v in attrs.items() if v is not None}))
            prev = (step, t)
    if not events:
        raise SourceFormatError(path, None, "fewer than two torchtitan step lines: no step window can be formed")
    b.mapped.update({"torchtitan step/loss": "events step (window = previous line to this one)",
                     "torchtitan memory (GiB, max reserved)": "events.mem_peak_bytes",
                     "torchtitan tps/tflops/mfu": "attrs.tps_per_gpu / tflops_per_gpu / mfu_pct"})
    if tokens_per_step:
        b.mapped["torchtitan global batch size × sequence length"] = "events.tokens (the job's, per step)"
    else:
        b.drop("torchtitan tokens: no 'global batch size …, sequence length …' start line in the log")
    return events


def parse_nemo(path: Path, b: RunBuilder, anchor_ns: int | None, seq_len: int | None) -> list[dict[str, Any]]:
    """NeMo 1 progress bars and NeMo 2 ``ProgressPrinter`` lines: durations only, placed from the anchor."""
    events: list[dict[str, Any]] = []
    seen: set[int] = set()
    with open_text(path) as f:
        text = f.read()
    t = 0
    consumed: dict[int, float] = {}
    lineno = 1
    for chunk in re.split(r"(\r|\n)", text):
        if chunk == "\n":
            lineno += 1
            continue
        if "train_step_timing in s" not in chunk:
            continue
        fields = parse_step_line("nemo", chunk)
        if fields is None or "step" not in fields or "step_time_s" not in fields:
            raise SourceFormatError(path, lineno, "progress line with train_step_timing but no global_step")
        step = int(fields["step"])
        if step in seen:
            continue
        if not seen:
            t = _need_anchor(path, anchor_ns)
        seen.add(step)
        dur = round(float(fields["step_time_s"]) * 1e9)
        if "consumed_samples" in fields:
            consumed[step] = float(fields["consumed_samples"])
        gbs = fields.get("global_batch_size")
        if gbs is None and step in consumed and step - 1 in consumed:
            gbs = consumed[step] - consumed[step - 1]  # NeMo 1 bars carry only the running total
        samples = int(gbs) if gbs else None
        events.append({"rank": 0, "kind": "step", "name": "train_step", "step": step, "t_start_ns": t,
                       "t_end_ns": t + dur, "loss": fields.get("loss"), "samples": samples,
                       "tokens": samples * seq_len if samples and seq_len else None,
                       "attrs": {"train_step_timing_s": dur / 1e9, "source_line": lineno,
                                 "consumed_samples": fields.get("consumed_samples")}})
        t += dur
    if not events:
        raise SourceFormatError(path, None, "no NeMo/Lightning progress line with train_step_timing")
    b.mapped["NeMo train_step_timing in s"] = "events step, back to back from --anchor"
    b.mapped["NeMo global_batch_size (or consumed_samples difference)"] = "events.samples (the job's)"
    _anchored(b, path, anchor_ns)
    return events


def _need_anchor(path: Path, anchor_ns: int | None) -> int:
    """The anchor of a log without wall-clock times, or the one-line refusal naming ``--anchor``."""
    if anchor_ns is None:
        raise SourceFormatError(path, None, f"the log has no wall-clock times: {ANCHOR_HELP} for when its first "
                                            "step started")
    return anchor_ns


def _anchored(b: RunBuilder, path: Path, anchor_ns: int | None) -> None:
    b.info["time_origin"] = (f"{path.name} has no wall-clock times: its steps are placed back to back from "
                             f"--anchor {iso(anchor_ns)} (the first step's start)")


def import_framework_log(
    paths: Sequence[str | Path],
    tz: str | None = None,
    seq_len: int | None = None,
    anchor_ns: int | None = None,
    warmup_steps: int | None = None,
    name: str | None = None,
) -> RunBuilder:
    """Import training logs (engine sniffed per file) as step events.

    ``anchor_ns`` (epoch ns) places the first step of a log without wall-clock times (NeMo progress
    bars, Megatron without stamps); such a log without it is refused, and an anchor no log needs is
    refused too. The first ``warmup_steps`` steps are the warm-up window, the rest measured.
    """
    tzinfo, tzname = resolve_zone(tz)
    b = RunBuilder(format="framework_log", name=name)
    b.info["import_timezone"] = {"zone": tzname, "note": "log times are local wall-clock"}
    events: list[dict[str, Any]] = []
    engines = []
    anchor_used = False
    declared = None
    for p in map(Path, paths):
        engine = sniff(p)
        if engine is None:
            raise SourceFormatError(p, None, "no Megatron iteration line, torchtitan step line, NeMo "
                                             "train_step_timing or MLPerf :::MLLOG run found")
        b.add_source(p, role=f"{engine} log")
        engines.append(engine)
        if engine == "megatron":
            ev, used = parse_megatron(p, b, tzinfo, seq_len, anchor_ns)
            events += ev
            anchor_used |= used
            if used:
                b.times_without_zone(p, "Megatron lines without [date] stamps hold durations only, placed by --anchor")
            else:
                b.read_local_times = True
        elif engine == "torchtitan":
            events += parse_torchtitan(p, b, tzinfo, seq_len)
            b.read_local_times = True  # every step line is stamped in local time
        elif engine == "nemo":
            events += parse_nemo(p, b, anchor_ns, seq_len)
            anchor_used = True
            b.times_without_zone(p, "NeMo progress lines hold durations only, placed by --anchor")
        else:
            from powertrain.importers.mlperf import read_result_log

            ev, facts = read_result_log(p, b)
            events += ev
            b.times_without_zone(p, "MLLOG time_ms is epoch milliseconds")
            declared = "MLPerf run_start → run_stop"
            b.info["mlperf"] = {k: facts.get(k) for k in ("run_start_ms", "run_stop_ms", "status", "train_steps")}
    if anchor_ns is not None and not anchor_used:
        raise ValueError("--anchor is only for logs without wall-clock times, and every log given has its own: "
                         "drop --anchor")
    # only the format's own measured steps (MLPerf: inside run_start → run_stop) take part in the window
    mark_window([e for e in events if not (e.get("attrs") or {}).get("outside_run_window")],
                warmup_steps, b, declared=declared)
    if "job_device_count" not in b.info:
        set_job_devices(b, None, f"{'/'.join(sorted(set(engines)))} log states no world size: per-device "
                                 "throughput unknown")
    b.info["engines"] = engines
    _set_run_window(b, events, declared)
    b.add_events(events_table(events))
    return b


def _set_run_window(b: RunBuilder, events: list[dict[str, Any]], declared: str | None) -> None:
    """``run.json["window"]``: MLPerf's run_start → run_stop when a result log declares it, else the
    measured steps' extent (first measured step start → last measured step end)."""
    ml = b.info.get("mlperf") or {}
    if declared and ml.get("run_start_ms") is not None and ml.get("run_stop_ms") is not None \
            and ml["run_stop_ms"] > ml["run_start_ms"]:
        b.set_window(int(ml["run_start_ms"]) * 1_000_000, int(ml["run_stop_ms"]) * 1_000_000, declared)
        return
    measured = [e for e in events if e.get("kind") == "step" and e.get("window") == "measured"]
    if measured:
        b.set_window(min(e["t_start_ns"] for e in measured), max(e["t_end_ns"] for e in measured),
                     "framework log: first measured step start → last measured step end")
