"""Live step events from an engine's printed log lines (``powertrain monitor --parse ENGINE``).

Engines that cannot be edited (Megatron-LM, torchtitan, NeMo) already print one line per logged
step. :class:`LiveStepParser` reads the command's output as it streams past, turns each step line
into an ``events`` row (:data:`powertrain.schema.EVENTS_SCHEMA`) and streams it to
``<run>/events/rank-<r>.parquet``. The line fields are read by
:func:`powertrain.core.engine_logs.parse_step_line`, the same rules as ``powertrain import``.

Timing rules (why each is the honest choice):

* an event **ends when its line arrives** (``CLOCK_REALTIME``, the sampler's clock), so steps line up
  with telemetry without trusting the log's own clock or time zone;
* **Megatron** / **NeMo** report a step duration: the event starts that long before it ends. A
  Megatron line covering ``k > 1`` iterations (``--log-interval k``) becomes one ``phase`` event
  ``train_interval`` (``attrs.iterations = k``), not ``k`` invented steps;
* **torchtitan** reports no duration: a line's window runs from the previous step line (measured
  with the lines' own millisecond stamps when both carry one, otherwise their arrival times); the
  first line only opens the first window.

Throughput: ``samples`` = global batch size × iterations of the line (Megatron, NeMo 2), ``tokens``
= samples × ``seq_len`` when given; per-GPU rates the engine prints (``tps``, TFLOP/s, MFU) go to
``attrs``. The first ``warmup_steps`` events of each rank are marked ``warmup``, the rest ``measured``.
A ``[rankN]:`` prefix (torchrun ``--tee``) sends the row to rank N's file; other lines go to
``default_rank``.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from powertrain.core.engine_logs import ENGINES, parse_step_line
from powertrain.hooks import Recorder

_STAMP_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")


def _stamp_s(text: str | None) -> float | None:
    """Seconds of a log's wall-clock stamp (naive: only differences between stamps are used)."""
    if not text:
        return None
    for fmt in _STAMP_FORMATS:
        try:
            return dt.datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    return None


class LiveStepParser:
    """Turns an engine's output, fed chunk by chunk, into step events of a run directory.

    Args:
        engine: ``megatron``, ``torchtitan`` or ``nemo``.
        run_dir: the run directory the events go to.
        seq_len: tokens per sample, to fill ``tokens`` (the logs print no sequence length).
        warmup_steps: leading events (per rank) marked ``window = "warmup"``; later ones ``"measured"``.
        default_rank: the rank of lines without a ``[rankN]:`` prefix.
        clock: arrival timestamps (``time.time_ns``; replaceable in tests).
    """

    def __init__(self, engine: str, run_dir: str | os.PathLike[str], *, seq_len: int | None = None,
                 warmup_steps: int = 1, default_rank: int = 0,
                 clock: Callable[[], int] = time.time_ns) -> None:
        if engine not in ENGINES:
            raise ValueError(f"--parse: unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        # a negative one gave negative tokens/s; 0 a null with a reason that hid the cause
        if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
            raise ValueError(f"--seq-len must be a whole number of tokens per sample >= 1, got {seq_len!r}; "
                             "give the model's sequence length, or leave it out (tokens stay unknown)")
        self.engine = engine
        self.run_dir = Path(run_dir)
        self.seq_len = seq_len
        self.warmup_steps = warmup_steps
        self.default_rank = default_rank
        self.clock = clock
        self.steps = 0  # step (or interval) events written
        self.lines = 0  # step lines recognised
        self._bufs: dict[str, str] = {}
        self._lock = threading.Lock()
        self._recorders: dict[int, Recorder] = {}
        self._prev: dict[int, tuple[int, int, float | None]] = {}  # rank -> (step, arrival ns, stamp s)
        self._seen: dict[int, set[int]] = {}
        self._count: dict[int, int] = {}  # events written per rank
        self._last_flush = time.monotonic()

    # -- input -------------------------------------------------------------------------------------
    def feed(self, data: bytes | str, stream: str = "stdout") -> None:
        """Feed raw output of one ``stream``; complete lines (``\\n`` or tqdm's ``\\r``) are parsed as
        they arrive. Thread-safe: stdout and stderr may be fed from two threads."""
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        with self._lock:
            buf = self._bufs.get(stream, "") + text
            *lines, self._bufs[stream] = buf.replace("\r", "\n").split("\n")
            now = self.clock()
            for line in lines:
                self._feed_line(line, now)
            if time.monotonic() - self._last_flush >= 1.0:
                self.flush()

    def feed_line(self, line: str, t_ns: int | None = None) -> dict[str, Any] | None:
        """Parse one line that arrived at ``t_ns``; returns the event row written, if any."""
        with self._lock:
            return self._feed_line(line, t_ns)

    def _feed_line(self, line: str, t_ns: int | None = None) -> dict[str, Any] | None:
        fields = parse_step_line(self.engine, line)
        if not fields:
            return None
        self.lines += 1
        t_end = t_ns if t_ns is not None else self.clock()
        rank = int(fields.get("rank", self.default_rank))
        step = int(fields["step"])
        seen = self._seen.setdefault(rank, set())
        if step in seen:  # a progress bar redraws the same step
            return None
        seen.add(step)
        prev = self._prev.get(rank)
        stamp = _stamp_s(fields.get("log_time"))
        self._prev[rank] = (step, t_end, stamp)
        k = step - prev[0] if prev is not None else (step if self.engine == "megatron" else 1)
        k = max(k, 1)
        if self.engine == "torchtitan":
            if prev is None:
                return None  # opens the first window; nothing measured yet
            dur_ns = (round((stamp - prev[2]) * 1e9) if stamp is not None and prev[2] is not None
                      else t_end - prev[1])
            step_time_s = dur_ns / 1e9 / k
        else:
            step_time_s = float(fields["step_time_s"])
            dur_ns = round(step_time_s * 1e9 * (k if self.engine == "megatron" else 1))
            if self.engine == "nemo":
                k = 1
        gbs = fields.get("global_batch_size")
        samples = int(gbs * k) if gbs else None
        tokens = samples * self.seq_len if samples and self.seq_len else None
        mem = fields.get("mem_gib")
        attrs: dict[str, Any] = {"source": f"log:{self.engine}", "step_time_s": step_time_s}
        for key in ("tps_per_gpu", "tflops_per_gpu", "mfu_pct", "consumed_samples"):
            if key in fields:
                attrs[key] = fields[key]
        if k > 1:
            kind, name = "phase", "train_interval"
            attrs.update(iterations=k, first_step=step - k + 1)
        else:
            kind, name = "step", "train_step"
        rec = self._recorder(rank)
        n = self._count.get(rank, 0)
        self._count[rank] = n + 1
        rec.set_window("warmup" if n < self.warmup_steps else "measured")
        t_start = t_end - dur_ns
        loss = fields.get("loss")
        mem_bytes = int(mem * (1 << 30)) if mem is not None else None
        row = {"kind": kind, "name": name, "step": step, "t_start_ns": t_start, "t_end_ns": t_end,
               "tokens": tokens, "samples": samples, "loss": loss, "mem_peak_bytes": mem_bytes}
        rec.record(kind, t_start, t_end, name=name, step=step, tokens=tokens, samples=samples,
                   loss=loss, mem_peak_bytes=mem_bytes, attrs=attrs)
        self.steps += 1
        return {**row, "rank": rank, "window": rec.window, "attrs": attrs}

    def _recorder(self, rank: int) -> Recorder:
        if rank not in self._recorders:
            self._recorders[rank] = Recorder(self.run_dir, rank)
        return self._recorders[rank]

    # -- output ------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Make what was parsed so far crash-safe on disk."""
        for rec in self._recorders.values():
            rec.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Parse a last unterminated line, then flush and compact every rank's events file."""
        with self._lock:
            for stream, rest in self._bufs.items():
                if rest:
                    self._feed_line(rest)
                self._bufs[stream] = ""
        for rec in self._recorders.values():
            rec.close()
