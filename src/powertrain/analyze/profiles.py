"""Time breakdown of profiled steps from ``torch.profiler`` Chrome traces (``<run>/profiles/*.json``).

The trainer saves ``profiles/rank-<r>-step-<i>.json`` for the steps and ranks it was asked to
profile. For each trace:

* **timeline**: the GPU kernels (``cat`` ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``) when the
  trace has any, else the CPU operators (``cpu_op``, ``user_annotation``); ``ProfilerStep#`` and
  Python-function wrappers are not work;
* **communication** intervals are those whose name names a collective or point-to-point transfer
  (NCCL / gloo / c10d / FSDP all-gather / reduce-scatter / all-to-all / send / recv); every other
  interval on the timeline is **compute**;
* with *C* and *M* the unions of compute and communication intervals over all threads / streams and
  *S* the step's span (its ``ProfilerStep#`` event, else first start → last end):
  ``compute_only = |C \\ M|``, ``comm_exposed = |M \\ C|`` (communication nothing hides),
  ``overlap = |C ∩ M|``, ``idle = S − |C ∪ M|``.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

COMM_PATTERN = re.compile(
    r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoall|broadcast|"
    r"\bsend\b|\brecv\b|sendrecv|_c10d_functional|post_backward_reduce",
    re.IGNORECASE,
)
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CPU_CATS = {"cpu_op", "user_annotation"}
FILE_PATTERN = re.compile(r"rank-(\d+)-step-(\d+)\.json(\.gz)?$")


def _union_length(iv: np.ndarray) -> float:
    """Total length of the union of intervals (rows of [start, end])."""
    if len(iv) == 0:
        return 0.0
    iv = iv[np.argsort(iv[:, 0])]
    total, cur_s, cur_e = 0.0, iv[0, 0], iv[0, 1]
    for s, e in iv[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return float(total + cur_e - cur_s)


def breakdown(trace: dict[str, Any]) -> dict[str, float | str] | None:
    """Seconds of compute-only, exposed communication, overlap and idle in one profiled step, and which
    timeline they come from (``timeline``: GPU kernels or CPU operators)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    work = gpu or [e for e in events if e.get("cat") in CPU_CATS and not str(e.get("name", "")).startswith(
        "ProfilerStep#")]
    if not work:
        return None
    comm = np.array([[e["ts"], e["ts"] + e["dur"]] for e in work if COMM_PATTERN.search(str(e.get("name", "")))],
                    dtype=float).reshape(-1, 2)
    comp = np.array([[e["ts"], e["ts"] + e["dur"]] for e in work if not COMM_PATTERN.search(str(e.get("name", "")))],
                    dtype=float).reshape(-1, 2)
    if steps:
        span = float(sum(e["dur"] for e in steps))
    else:
        allv = np.vstack([comm, comp])
        span = float(allv[:, 1].max() - allv[:, 0].min())
    c, m = _union_length(comp), _union_length(comm)
    both = _union_length(np.vstack([comp, comm]))
    overlap = c + m - both
    us = 1e-6  # trace times are microseconds
    return {
        "span_s": span * us, "compute_only_s": (c - overlap) * us, "comm_exposed_s": (m - overlap) * us,
        "overlap_s": overlap * us, "idle_s": max(span - both, 0.0) * us,
        "timeline": "gpu kernels" if gpu else "cpu operators",
    }


def run_profiles(run_dir: str | Path) -> list[dict[str, Any]]:
    """One breakdown per profiled (rank, step) of a run; ``[]`` when no traces were taken."""
    folder = Path(run_dir) / "profiles"
    out: list[dict[str, Any]] = []
    if not folder.is_dir():
        return out
    for p in sorted(folder.iterdir()):
        m = FILE_PATTERN.search(p.name)
        if not m:
            continue
        try:
            opener = gzip.open if p.suffix == ".gz" else open
            with opener(p, "rt") as f:
                trace = json.load(f)
        except (OSError, ValueError):
            continue  # a torn trace of a killed rank: skipped, not fatal
        b = breakdown(trace)
        if b is not None:
            out.append({"rank": int(m.group(1)), "step": int(m.group(2)), "file": p.name, **b})
    return out
