"""The engine log-line rules: what a training engine's printed step line says, one line at a time.

Megatron-LM, torchtitan and NeMo / Lightning print one line per logged step. These patterns and
:func:`parse_step_line` are the one reading of those lines, shared by the file importer
(:mod:`powertrain.importers.framework_logs`) and the live parser (:mod:`powertrain.live.parse`,
``powertrain monitor --parse ENGINE``). See the importer's docstring for what each engine's line holds.
"""

from __future__ import annotations

import re
from typing import Any

ENGINES = ("megatron", "torchtitan", "nemo")

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes, stripped before matching
RANK_PREFIX = re.compile(r"^\s*\[rank(\d+)\]:\s?")  # torchrun --tee
TITAN_TIME = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?")
TITAN_FIELDS = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+0-9.eEnaNif]+)"
    r"(?:.*?memory:\s*(?P<mem>[0-9.]+)\s*GiB)?"
    r"(?:.*?tps:\s*(?P<tps>[0-9,]+))?"
    r"(?:.*?tflops:\s*(?P<tflops>[0-9,.]+))?"
    r"(?:.*?mfu:\s*(?P<mfu>[0-9.]+)%)?"
)
_NEMO_STEP = re.compile(r"global_step=([0-9.]+)")
_NEMO_TIMING = re.compile(r"train_step_timing in s=([0-9.eE+-]+)")
_NEMO_LOSS = re.compile(r"reduced_train_loss=([0-9.eE+-]+)")
_NEMO_SAMPLES = re.compile(r"consumed_samples=([0-9.eE+-]+)")
_NEMO2_FIELD = re.compile(r"\|\s*([A-Za-z_ ]+?(?: in s)?):\s*([-+0-9.eE]+|nan|inf)\s*(?=\||$)")


def number(v: str | None) -> float | None:
    """A number as an engine prints it (``6,123`` has a thousands separator); ``None`` if unreadable."""
    if v is None:
        return None
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def parse_step_line(engine: str, line: str) -> dict[str, Any] | None:
    """One printed line of ``engine``'s training log → its step fields, or ``None`` if it is no step line.

    Keys (absent when the line does not carry them): ``step`` (the iteration / global step the line
    ends), ``step_time_s`` (seconds per step as the engine reports it: Megatron's average over the
    line's interval, NeMo's ``train_step_timing``; torchtitan reports none), ``log_time`` (the line's
    own wall-clock stamp, ``YYYY-MM-DD HH:MM:SS[.ffffff]`` text), ``loss``, ``global_batch_size``,
    ``consumed_samples``, ``tps_per_gpu``, ``tflops_per_gpu``, ``mfu_pct``, ``mem_gib``, ``rank``
    (from a ``[rankN]:`` prefix). Same field rules as the file importer
    (:mod:`powertrain.importers.framework_logs`); NeMo lines are read in both the NeMo 1 progress-bar
    form (``global_step=49.0, … train_step_timing in s=2.54``) and the NeMo 2 ``Training epoch 0,
    iteration 1/99 | … | global_step: 1 | … | train_step_timing in s: 2.008`` form.
    """
    line = ANSI.sub("", line)
    out: dict[str, Any] = {}
    if (r := RANK_PREFIX.match(line)) is not None:
        out["rank"] = int(r.group(1))
    if engine == "megatron":
        if "elapsed time per iteration (ms)" not in line:
            return None
        ts = re.search(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?)\]", line)
        fields: dict[str, str] = {}
        for part in line.split("|"):
            if "elapsed" not in part and (m_it := re.search(r"iteration\s+(\d+)\s*/\s*(\d+)", part)):
                fields["iteration"] = m_it.group(1)
            elif ":" in part:
                k, _, v = part.rpartition(":")
                fields[k.strip().lower()] = v.strip().split("/")[0]
        step, ms = number(fields.get("iteration")), number(fields.get("elapsed time per iteration (ms)"))
        if step is None or ms is None:
            return None
        out.update(step=int(step), step_time_s=ms / 1000.0, log_time=ts.group(1) if ts else None,
                   loss=number(fields.get("lm loss")), global_batch_size=number(fields.get("global batch size")),
                   consumed_samples=number(fields.get("consumed samples")),
                   tflops_per_gpu=number(fields.get("throughput per gpu (tflop/s/gpu)")))
    elif engine == "torchtitan":
        if "step:" not in line or "loss:" not in line:
            return None
        m = TITAN_FIELDS.search(line)
        if m is None:
            return None
        ts = TITAN_TIME.search(line)
        out.update(step=int(m.group("step")), loss=number(m.group("loss")), mem_gib=number(m.group("mem")),
                   tps_per_gpu=number(m.group("tps")), tflops_per_gpu=number(m.group("tflops")),
                   mfu_pct=number(m.group("mfu")),
                   log_time=f"{ts.group(1)}.{ts.group(2) or '0'}" if ts else None)
    elif engine == "nemo":
        if "train_step_timing in s" not in line:
            return None
        m_step, m_time = _NEMO_STEP.search(line), _NEMO_TIMING.search(line)
        if m_step and m_time:  # NeMo 1 progress bar
            loss, samples = _NEMO_LOSS.search(line), _NEMO_SAMPLES.search(line)
            out.update(step=int(float(m_step.group(1))), step_time_s=float(m_time.group(1)),
                       loss=float(loss.group(1)) if loss else None,
                       consumed_samples=float(samples.group(1)) if samples else None)
        else:  # NeMo 2 ProgressPrinter: "| key: value |" pairs
            kv = {k.strip(): v for k, v in _NEMO2_FIELD.findall(line + "|")}
            step, dur = number(kv.get("global_step")), number(kv.get("train_step_timing in s"))
            if step is None or dur is None:
                return None
            out.update(step=int(step), step_time_s=dur, loss=number(kv.get("reduced_train_loss")),
                       global_batch_size=number(kv.get("global_batch_size")),
                       consumed_samples=number(kv.get("consumed_samples")),
                       tps_per_gpu=number(kv.get("tokens_per_sec_per_gpu")))
    else:
        raise ValueError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    return {k: v for k, v in out.items() if v is not None}
