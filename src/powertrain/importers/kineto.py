"""PyTorch profiler (Kineto) traces → per-rank step windows, kernel categories, exposed communication.

For each trace (one rank; gzip'ed or plain Chrome-trace JSON):

* **steps**: the ``ProfilerStep#N`` CPU annotations. Each GPU activity is assigned to the step whose
  CPU window contains the runtime call that launched it (matched by correlation id; kernels without
  a launch record fall back to their own start time).
* **categories**: ``comm`` = NCCL/RCCL kernels, split per collective (``allreduce``,
  ``allgather``, ``reducescatter``, ``sendrecv``, ``broadcast``, ``alltoall``, …; from the trace's
  ``Collective name`` when recorded, else from the kernel name); ``memory`` = ``gpu_memcpy`` /
  ``gpu_memset``; ``compute`` = every other GPU kernel.
* **time** of a category = the length of the *union* of its intervals across all streams (two
  overlapping kernels count once). ``overlapped_comm_s`` = |comm ∩ compute|; ``exposed_comm_s`` =
  comm - overlapped (communication nothing else hides); ``idle_s`` = GPU step window minus the union
  of all GPU activity. Percentages are of the comm time.

Output: a ``step`` event per rank and step (``attrs`` hold the breakdown) and a ``comm`` event per
collective kernel; ``run.json["kineto"]`` gives per-rank means. Times: ``ts`` is µs; when the trace
has ``baseTimeNanoseconds``, ``t_ns = base + ts·1000``, else ``ts`` is taken as epoch µs.

This is the interval arithmetic of Holistic Trace Analysis' comm/comp overlap done per step (HTA
reports it per rank over the whole trace). With ``hta=True`` (``powertrain import kineto --hta``,
needs ``pip install powertrain[kineto]``) HTA's own whole-trace figure is recorded next to ours in
``run.json["kineto"]["hta_comp_comm_overlap_pct"]`` as a cross-check.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from powertrain.importers.common import (
    RunBuilder,
    SourceFormatError,
    events_table,
    mark_window,
    open_text,
    set_job_devices,
)

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "sendrecv", "broadcast", "alltoall", "reduce",
                "send", "recv", "gather", "scatter")


def load_trace(path: Path) -> dict[str, Any]:
    try:
        with open_text(path) as f:  # capped at the import size cap
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise SourceFormatError(path, exc.lineno, f"not valid JSON ({exc.msg})") from None
    except (OSError, EOFError) as exc:
        raise SourceFormatError(path, None, f"cannot read: {exc}") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise SourceFormatError(path, 1, "not a Chrome/Kineto trace (no traceEvents list)")
    return data


def collective_of(name: str, args: dict[str, Any]) -> str:
    """Normalised collective name of a communication kernel."""
    coll = args.get("Collective name") if isinstance(args, dict) else None
    if isinstance(coll, str) and coll:
        return coll.replace("_", "").lower()
    low = name.lower()
    m = re.search(r"nccl(?:dev)?kernel_([a-z]+)", low)
    if m:
        return m.group(1)
    for c in _COLLECTIVES:
        if c in low:
            return c
    return "other"


def is_comm(name: str) -> bool:
    low = name.lower()
    return "nccl" in low or "rccl" in low


def union(iv: np.ndarray) -> np.ndarray:
    """Merge ``[[start, end], ...]`` into disjoint sorted intervals."""
    if iv.size == 0:
        return iv.reshape(0, 2)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    ends = np.maximum.accumulate(iv[:, 1])
    new = np.concatenate([[True], iv[1:, 0] > ends[:-1]])
    idx = np.flatnonzero(new)
    # a block ends at the running max just before the next block starts (or at the very end)
    last = np.concatenate([idx[1:] - 1, [iv.shape[0] - 1]])
    return np.stack([iv[idx, 0], ends[last]], axis=1)


def length(u: np.ndarray) -> float:
    return float(np.sum(u[:, 1] - u[:, 0])) if u.size else 0.0


def intersection_length(a: np.ndarray, b: np.ndarray) -> float:
    """Total overlap of two disjoint sorted interval sets (two-pointer sweep)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i, 0], b[j, 0])
        hi = min(a[i, 1], b[j, 1])
        if hi > lo:
            total += hi - lo
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


# A GPU activity of a trace: (start µs, end µs, category, kernel name, args).
_GpuActivity = tuple[float, float, str, str, dict[str, Any]]


def analyze_trace(path: Path, data: dict[str, Any]) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    """``(rank, events, summary)`` of one trace."""
    dist = data.get("distributedInfo") or {}
    m = re.search(r"rank[-_]?(\d+)", path.name)
    rank = int(dist["rank"]) if "rank" in dist else int(m.group(1)) if m else 0
    base_ns = int(data.get("baseTimeNanoseconds") or 0)
    steps, launches, gpu = _read_events(path, data["traceEvents"])
    per_step, comm_events = _assign_to_steps(steps, launches, gpu, rank, base_ns)
    events: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for si, (num, cs, ce) in enumerate(steps):
        attrs = _step_breakdown(per_step.get(si, {}), cs, ce)
        rows.append(attrs)
        events.append({"rank": rank, "kind": "step", "name": f"ProfilerStep#{num}", "step": num,
                       "t_start_ns": base_ns + round(cs * 1000), "t_end_ns": base_ns + round(ce * 1000),
                       "attrs": attrs})
    summary: dict[str, Any] = {"trace": path.name, "world_size": dist.get("world_size"), "steps": len(steps),
                               "comm_kernels": len(comm_events)}
    summary.update(_mean_breakdown(rows))
    return rank, events + comm_events, summary


def _read_events(path: Path, evs: list[Any]) -> tuple[list[tuple[int, float, float]], dict[int, float],
                                                      list[_GpuActivity]]:
    """The trace's profiler steps ``(N, start, end)`` sorted by start, runtime launches by correlation
    id, and GPU activities (kernels, memcpy, memset)."""
    steps: list[tuple[int, float, float]] = []
    launches: dict[int, float] = {}
    gpu: list[_GpuActivity] = []
    for e in evs:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        try:
            ts = float(e["ts"])
            dur = float(e.get("dur", 0))
        except (KeyError, TypeError, ValueError):
            raise SourceFormatError(path, None, f"complete event {str(e.get('name'))[:60]!r} has no numeric ts/dur") from None
        if cat == "user_annotation":
            sm = _STEP_RE.match(str(e.get("name", "")))
            if sm:
                steps.append((int(sm.group(1)), ts, ts + dur))
        elif cat in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[int(corr)] = ts
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append((ts, ts + dur, cat, str(e.get("name", "")), e.get("args") or {}))
    if not steps:
        raise SourceFormatError(path, None, "no ProfilerStep#N annotations: profile with torch.profiler.schedule "
                                            "and call prof.step() each iteration")
    steps.sort(key=lambda s: s[1])
    return steps, launches, gpu


def _assign_to_steps(steps: list[tuple[int, float, float]], launches: dict[int, float], gpu: list[_GpuActivity],
                     rank: int, base_ns: int) -> tuple[dict[int, dict[str, list[tuple[float, float]]]],
                                                       list[dict[str, Any]]]:
    """GPU intervals per step (by the step whose CPU window holds the launch) and category, and one
    ``comm`` event per collective kernel."""
    step_starts = [s[1] for s in steps]
    step_ends = [s[2] for s in steps]

    def step_of(t: float) -> int | None:
        i = bisect.bisect_right(step_starts, t) - 1
        return i if i >= 0 and t <= step_ends[i] else None

    per_step: dict[int, dict[str, list[tuple[float, float]]]] = {}
    comm_events: list[dict[str, Any]] = []
    for ts, te, cat, name, args in gpu:
        corr = args.get("correlation")
        launch = launches.get(int(corr)) if corr is not None else None
        si = step_of(launch if launch is not None else ts)
        if si is None:
            continue
        buckets = per_step.setdefault(si, {})
        if cat != "kernel":
            buckets.setdefault("memory", []).append((ts, te))
        elif is_comm(name):
            coll = collective_of(name, args)
            buckets.setdefault("comm", []).append((ts, te))
            buckets.setdefault("comm:" + coll, []).append((ts, te))
            comm_events.append({"rank": rank, "kind": "comm", "name": coll, "step": steps[si][0],
                                "t_start_ns": base_ns + round(ts * 1000), "t_end_ns": base_ns + round(te * 1000),
                                "attrs": {"kernel": name[:120], "stream": args.get("stream"),
                                          "in_msg_nelems": args.get("In msg nelems"), "dtype": args.get("dtype"),
                                          "group_size": args.get("Group size")}})
        else:
            buckets.setdefault("compute", []).append((ts, te))
    return per_step, comm_events


def _step_breakdown(b: dict[str, list[tuple[float, float]]], cs: float, ce: float) -> dict[str, Any]:
    """One step's compute / comm / memory / overlap / idle times (s) from its GPU intervals per category."""
    u = {k: union(np.asarray(v, dtype=np.float64)) for k, v in b.items()}
    empty = np.zeros((0, 2))
    comp, comm, mem = u.get("compute", empty), u.get("comm", empty), u.get("memory", empty)
    all_gpu = union(np.concatenate([comp, comm, mem])) if (comp.size or comm.size or mem.size) else empty
    comm_s = length(comm) / 1e6
    overlap_s = intersection_length(comm, comp) / 1e6
    gpu_window = (all_gpu[-1, 1] - all_gpu[0, 0]) / 1e6 if all_gpu.size else 0.0
    return {
        "cpu_step_s": (ce - cs) / 1e6,
        "gpu_window_s": gpu_window,
        "compute_s": length(comp) / 1e6,
        "comm_s": comm_s,
        "memory_s": length(mem) / 1e6,
        "overlapped_comm_s": overlap_s,
        "exposed_comm_s": comm_s - overlap_s,
        "overlap_pct": 100.0 * overlap_s / comm_s if comm_s > 0 else None,
        "idle_s": gpu_window - length(all_gpu) / 1e6 if all_gpu.size else None,
        "comm_by_collective_s": {k[5:]: length(v) / 1e6 for k, v in u.items() if k.startswith("comm:")},
        "gpu_kernels": sum(len(v) for k, v in b.items() if not k.startswith("comm:")),
    }


def _mean_breakdown(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-rank means of the step breakdowns, overlap over all steps, comm time per collective."""
    keys = ("cpu_step_s", "compute_s", "comm_s", "memory_s", "overlapped_comm_s", "exposed_comm_s", "idle_s")
    summary: dict[str, Any] = {}
    for k in keys:
        vals = [r[k] for r in rows if r[k] is not None]
        summary[f"mean_{k}"] = float(np.mean(vals)) if vals else None
    tot_comm = sum(r["comm_s"] for r in rows)
    summary["overlap_pct"] = 100.0 * sum(r["overlapped_comm_s"] for r in rows) / tot_comm if tot_comm else None
    colls: dict[str, float] = {}
    for r in rows:
        for c, v in r["comm_by_collective_s"].items():
            colls[c] = colls.get(c, 0.0) + v
    summary["comm_by_collective_s"] = colls
    return summary


HTA_MISSING = ("Holistic Trace Analysis is not installed: pip install 'powertrain[kineto]' "
               "(PyPI HolisticTraceAnalysis, import hta), or import without --hta")


def hta_overlap_pct(files: Sequence[Path]) -> dict[str, float]:
    """HTA's comm/comp overlap (% of communication time overlapped by compute) per rank."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        raise ImportError(HTA_MISSING) from None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="powertrain-hta-") as d:
        for f in files:  # HTA reads a folder of one trace per rank
            (Path(d) / f.name).symlink_to(f.resolve())
        df = TraceAnalysis(trace_dir=d).get_comm_comp_overlap(visualize=False)
    return {str(int(r)): float(v) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"], strict=True)}


def import_kineto(paths: Sequence[str | Path], name: str | None = None, hta: bool = False,
                  warmup_steps: int | None = None) -> RunBuilder:
    """Import one Kineto trace per rank (files or folders of ``*.json`` / ``*.json.gz``).

    Every profiled step is measured except the first ``warmup_steps`` (default 0: the profiler
    schedule's own warm-up steps are not recorded as ``ProfilerStep`` annotations). The job's device
    count is the traces' ``distributedInfo.world_size`` (one rank per device).
    """
    b = RunBuilder(format="kineto", name=name)
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(x for x in p.iterdir() if x.name.endswith((".json", ".json.gz"))) if p.is_dir() else [p]
    if not files:
        raise SourceFormatError(paths[0], None, "no *.json or *.json.gz trace found")
    summaries: dict[str, Any] = {}
    events: list[dict[str, Any]] = []
    for f in files:
        b.add_source(f, role="kineto trace")
        rank, ev, summary = analyze_trace(f, load_trace(f))
        if str(rank) in summaries:
            raise SourceFormatError(f, None, f"a second trace of rank {rank} ({summaries[str(rank)]['trace']}); "
                                             "import one trace per rank")
        summaries[str(rank)] = summary
        events += ev
    b.mapped.update({
        "ProfilerStep#N": "events step (CPU window); attrs: compute/comm/memory/overlap breakdown",
        "nccl kernels": "events comm (one per kernel, name = collective)",
    })
    b.drop("CPU ops, runtime calls, flows and non-communication kernels (only summarised per step)")
    b.info["kineto"] = {"per_rank": summaries,
                        "method": "union of kernel intervals per category; overlapped = |comm ∩ compute|; "
                                  "exposed = comm - overlapped (powertrain.importers.kineto)"}
    if hta:
        b.info["kineto"]["hta_comp_comm_overlap_pct"] = hta_overlap_pct(files)
        b.info["kineto"]["hta_note"] = "HTA: whole trace per rank; ours: inside ProfilerStep windows"
    worlds = {s["world_size"] for s in summaries.values()}
    if len(worlds) == 1 and None not in worlds:
        set_job_devices(b, int(worlds.pop()), "Kineto distributedInfo.world_size (one rank per device)")
    elif len(worlds) > 1:
        b.warn(f"the traces disagree on distributedInfo.world_size ({sorted(worlds, key=str)}); "
               "per-device throughput unknown")
        set_job_devices(b, None, "traces disagree on distributedInfo.world_size")
    else:
        set_job_devices(b, None, "no distributedInfo.world_size in the traces")
    mark_window(events, warmup_steps, b)
    measured = [e for e in events if e["kind"] == "step" and e.get("window") == "measured"]
    if measured:
        b.set_window(min(e["t_start_ns"] for e in measured), max(e["t_end_ns"] for e in measured),
                     "Kineto: first measured ProfilerStep start → last ProfilerStep end (all ranks)")
    b.add_events(events_table(events))
    return b
