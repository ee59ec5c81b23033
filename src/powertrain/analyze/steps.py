"""Step timing from the ranks' ``step`` events: the measured window, step times, tokens, stragglers.

Definitions:

* a **measured step** is a ``step`` event with ``window == "measured"``. When *no* step event of
  the run carries a window (a loop marked with ``powertrain.step`` under ``powertrain monitor --
  CMD``, a framework-log import), every step event is measured except the first ``warmup_steps``
  of each rank by start time (the run's declared warm-up, ``run.json`` ``warmup_steps``, default 0).
  A run that marks windows anywhere keeps exactly its marks (the built-in trainer's runs);
* the **measured window** is [earliest start, latest end] of the measured steps over all ranks;
* the **time of step s** is the longest duration among the ranks' step-s events (a synchronous step
  ends when its slowest rank does; durations, not cross-rank differences, so host clock skew does not
  enter);
* **tokens (samples) of step s**: ranks that hold the same data-parallel replica (same ``dp``
  coordinate in the rank map) process the same tokens, so each replica counts once (its largest
  value) and replicas add up; without coordinates every rank counts;
* **straggler spread of step s**: (slowest − fastest rank duration) / median rank duration × 100.

A step number a rank records more than once (a loop whose index restarts every epoch: ``for i, batch
in enumerate(loader)`` inside an epoch loop) is **kept, not merged**: each event is a step of its own,
the k-th event of a step number on a rank (by start time) lining up with the k-th of that number on
every other rank. The steps then run in the order (repeat, step number), ``StepData.steps`` holds the
number once per repeat, and ``summary.json`` ``data_quality.repeated_steps`` and a note say so.

Before any of this, step events that cannot be a step are **dropped and counted**
(:func:`screen_steps`): a duration (``t_end_ns − t_start_ns``) that is negative, zero, not finite
(a missing stamp) or longer than :data:`MAX_STEP_S` (a stamp from another clock or a corrupted
file). The count per reason reaches ``summary.json`` ``data_quality.dropped_steps`` and a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# No training step lasts a week: a longer one pairs stamps of different clocks or is corrupted.
MAX_STEP_S = 7 * 24 * 3600.0
_REASONS = ("negative duration", "zero duration", "no finite start or end", f"longer than {MAX_STEP_S / 86400:.0f} days")


def screen_steps(events: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
    """``events`` without the ``step`` events whose duration is negative, zero, not finite or longer
    than :data:`MAX_STEP_S`, and what was dropped: ``{"count", "reasons": {reason: n}, "first"}``
    (``first`` names the first dropped event, ``None`` when nothing was). Other kinds are kept."""
    empty: dict[str, Any] = {"count": 0, "reasons": {}, "first": None}
    if events.num_rows == 0:
        return events, empty
    is_step = pc.fill_null(pc.equal(events["kind"], "step"), False).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        dur = _durations_s(events)
        masks = (dur < 0, dur == 0, ~np.isfinite(dur), dur > MAX_STEP_S)
    bad = np.zeros(events.num_rows, dtype=bool)
    reasons: dict[str, int] = {}
    for reason, mask in zip(_REASONS, masks, strict=True):
        hit = mask & is_step & ~bad
        if hit.any():
            reasons[reason] = int(hit.sum())
            bad |= hit
    if not bad.any():
        return events, empty
    i = int(np.flatnonzero(bad)[0])
    first = (f"rank {events['rank'][i].as_py()} step {events['step'][i].as_py()}: "
             f"{'no duration' if not np.isfinite(dur[i]) else f'{dur[i]:.6g} s'}")
    return events.filter(pa.array(~bad)), {"count": int(bad.sum()), "reasons": reasons, "first": first}


def _durations_s(events: pa.Table) -> np.ndarray:
    """``t_end_ns − t_start_ns`` in seconds, nan where a stamp is null. Whole seconds and the
    nanosecond rest are subtracted apart, so hostile stamps cannot overflow int64 and a duration of
    one nanosecond is still told from zero."""
    parts = []
    for name in ("t_start_ns", "t_end_ns"):
        col = events[name]
        ns = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        parts.append((ns // 1_000_000_000, ns % 1_000_000_000, pc.is_null(col).to_numpy(zero_copy_only=False)))
    (s0, r0, null0), (s1, r1, null1) = parts
    dur = (s1 - s0).astype(np.float64) + (r1 - r0).astype(np.float64) / 1e9
    dur[null0 | null1] = np.nan
    return dur


def dropped_steps_note(dropped: dict[str, Any]) -> str | None:
    """One note for the summary when step events were dropped (see :func:`screen_steps`)."""
    if not dropped.get("count"):
        return None
    why = ", ".join(f"{n} {r}" for r, n in dropped["reasons"].items())
    return (f"{dropped['count']} step event(s) dropped before any metric ({why}; first: {dropped['first']}); "
            "data_quality.dropped_steps")


@dataclass
class StepData:
    """The measured steps of a run, as numpy arrays and per-rank tables."""

    steps: np.ndarray  # step numbers, in the order (repeat, number): a number repeats only if a rank reused it
    step_time_s: np.ndarray  # per step
    tokens: np.ndarray  # per step (nan where unknown)
    samples: np.ndarray
    t_start_ns: np.ndarray  # per step: earliest rank start
    t_end_ns: np.ndarray  # per step: latest rank end
    ranks: list[int]
    rank_step_s: np.ndarray  # [rank index, step index] duration, nan where missing
    spread_pct: np.ndarray  # per step (nan with fewer than two ranks)
    window: tuple[int, int]
    phases: list[dict[str, Any]] = field(default_factory=list)  # non-step events of measured steps
    # how the measured steps were chosen when no step carried a window (None: by their marks)
    window_rule: str | None = None
    # step events dropped before any metric (see screen_steps)
    dropped: dict[str, Any] = field(default_factory=lambda: {"count": 0, "reasons": {}, "first": None})
    # step events whose number the rank had used before (see repeated_steps)
    repeated: dict[str, Any] = field(default_factory=lambda: dict(NO_REPEATS))
    # per step: which use of its number it is (0 first); (repeats[i], steps[i]) names step i (event_repeats)
    repeats: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n(self) -> int:
        return len(self.steps)


def measured_steps(events: pa.Table, rank_map: list[dict[str, Any]] | None = None,
                   warmup_steps: int | None = None) -> StepData | None:
    """The measured steps of ``events`` (a table of :data:`powertrain.schema.EVENTS_SCHEMA`), or
    ``None`` when there is no measured step event.

    ``warmup_steps`` (the run's ``run.json`` ``warmup_steps``; ``None`` = 0) only matters when no step
    event carries a window: see the module doc. Impossible step events are dropped first
    (:func:`screen_steps`; counted in ``StepData.dropped``).
    """
    if warmup_steps is None:
        warmup_steps = 0
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a whole number >= 0, got {warmup_steps!r} "
                         "(fix run.json's warmup_steps)")
    if events.num_rows == 0:
        return None
    events, dropped = screen_steps(events)
    all_steps = events.filter(pc.and_(pc.equal(events["kind"], "step"), pc.invert(pc.is_null(events["step"]))))
    # the k-th event of a step number on its rank, over all its step events (warm-up included), so a
    # repeat keeps its place whichever of its events the window takes
    repeat = _ordinal(all_steps, by_step=True)
    repeated = repeated_steps(all_steps, repeat)
    all_steps = all_steps.append_column("_repeat", pa.array(repeat, pa.int64()))
    rule: str | None = None
    if all_steps.num_rows and all_steps["window"].null_count == all_steps.num_rows:
        steps_t = _after_warmup(all_steps, warmup_steps)
        rule = (f"no step event carries a window: steps count as measured after the first {warmup_steps} "
                "of each rank (warm-up)" if warmup_steps else
                "no step event carries a window: every step counts as measured")
    else:
        steps_t = all_steps.filter(pc.equal(all_steps["window"], "measured"))
    if steps_t.num_rows == 0:
        return None
    rank = steps_t["rank"].to_numpy()
    step = steps_t["step"].to_numpy()
    t0 = steps_t["t_start_ns"].to_numpy()
    t1 = steps_t["t_end_ns"].to_numpy()
    tok = pc.cast(steps_t["tokens"], pa.float64()).to_numpy(zero_copy_only=False)  # nulls → nan
    smp = pc.cast(steps_t["samples"], pa.float64()).to_numpy(zero_copy_only=False)
    ranks_arr, ri = np.unique(rank, return_inverse=True)
    # one column per (repeat, step number): a reused number is a step of its own, never overwritten
    slots, si = np.unique(np.stack([steps_t["_repeat"].to_numpy(), step.astype(np.int64)], axis=1),
                          axis=0, return_inverse=True)
    si = si.reshape(-1)
    ranks = [int(r) for r in ranks_arr]
    uniq = slots[:, 1].astype(np.int64)
    dur = np.full((len(ranks), len(uniq)), np.nan)
    toks = np.full((len(ranks), len(uniq)), np.nan)
    smps = np.full((len(ranks), len(uniq)), np.nan)
    dur[ri, si] = (t1 - t0) / 1e9
    toks[ri, si] = tok
    smps[ri, si] = smp
    replica = _replica_of(ranks, rank_map)
    step_time = np.nanmax(dur, axis=0)
    starts = np.full(len(uniq), np.iinfo(np.int64).max, dtype=np.int64)
    ends = np.full(len(uniq), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(starts, si, t0)
    np.maximum.at(ends, si, t1)
    with np.errstate(all="ignore"):
        if len(ranks) >= 2:
            med = np.nanmedian(dur, axis=0)
            spread = (np.nanmax(dur, axis=0) - np.nanmin(dur, axis=0)) / med * 100
        else:
            spread = np.full(len(uniq), np.nan)
    # a reused step number's warm-up events are not the measured ones: phases inside the window only
    in_window = pc.and_(pc.greater_equal(events["t_start_ns"], int(t0.min())), pc.less_equal(events["t_end_ns"], int(t1.max())))
    phases = self_phases(events.filter(pc.fill_null(in_window, False)), set(uniq.tolist()))
    return StepData(
        steps=uniq, step_time_s=step_time, tokens=_per_replica_sum(toks, replica),
        samples=_per_replica_sum(smps, replica), t_start_ns=starts, t_end_ns=ends, ranks=ranks,
        rank_step_s=dur, spread_pct=spread, window=(int(t0.min()), int(t1.max())), phases=phases,
        window_rule=rule, dropped=dropped, repeated=repeated, repeats=slots[:, 0].astype(np.int64),
    )


NO_REPEATS: dict[str, Any] = {"count": 0, "ranks": [], "first": None}


def _ordinal(steps_t: pa.Table, *, by_step: bool) -> np.ndarray:
    """Each event's position (0, 1, …) by start time among the events of its rank (``by_step``: of its
    rank and step number)."""
    rank = steps_t["rank"].to_numpy(zero_copy_only=False)
    keys = [steps_t["t_start_ns"].to_numpy(zero_copy_only=False)]
    group = [rank]
    if by_step:
        group = [steps_t["step"].to_numpy(zero_copy_only=False), rank]
    order = np.lexsort((*keys, *group))
    n = len(order)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    new_group = np.zeros(n, dtype=bool)
    new_group[0] = True
    for g in group:
        new_group[1:] |= g[order][1:] != g[order][:-1]
    first = np.flatnonzero(new_group)
    run_start = np.repeat(first, np.diff(np.r_[first, n]))
    ordinal = np.empty(n, dtype=np.int64)
    ordinal[order] = np.arange(n) - run_start
    return ordinal


def event_repeats(events: pa.Table) -> np.ndarray:
    """Per event of ``events``: which use of its step number on its rank it belongs to, so that
    ``(repeat, step)`` names a step as :func:`measured_steps` does (``StepData.repeats``, ``.steps``).

    A step event's is its place among its rank's step events of that number (by start time, after
    :func:`screen_steps`); another event's (forward, backward, phase, …) is that of the last of those
    that started at or before it, 0 when none did. -1 for an event without a step number and for a
    step event :func:`screen_steps` drops."""
    n = events.num_rows
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    has = ~(pc.is_null(events["step"]).to_numpy(zero_copy_only=False)
            | pc.is_null(events["rank"]).to_numpy(zero_copy_only=False)
            | pc.is_null(events["t_start_ns"]).to_numpy(zero_copy_only=False))
    is_step = pc.fill_null(pc.equal(events["kind"], "step"), False).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        dur = _durations_s(events)
        ok = np.isfinite(dur) & (dur > 0) & (dur <= MAX_STEP_S)  # what screen_steps keeps
    steps_i = np.flatnonzero(has & is_step & ok)
    if len(steps_i):
        out[steps_i] = _ordinal(events.take(pa.array(steps_i)), by_step=True)
    others = np.flatnonzero(has & ~is_step)
    if not len(others) or not len(steps_i):
        out[others] = 0
        return out
    idx = np.r_[steps_i, others]
    rank = events["rank"].take(pa.array(idx)).to_numpy(zero_copy_only=False).astype(np.int64)
    step = events["step"].take(pa.array(idx)).to_numpy(zero_copy_only=False).astype(np.int64)
    t0 = events["t_start_ns"].take(pa.array(idx)).to_numpy(zero_copy_only=False).astype(np.int64)
    _, group = np.unique(np.stack([rank, step], axis=1), axis=0, return_inverse=True)
    _, when = np.unique(t0, return_inverse=True)  # dense time order: group × width + when stays in int64
    width = len(idx) + 1
    key = group.reshape(-1).astype(np.int64) * width + when.reshape(-1)
    step_keys = np.sort(key[: len(steps_i)])
    other_keys = key[len(steps_i):]
    started = np.searchsorted(step_keys, other_keys, side="right")
    group_first = np.searchsorted(step_keys, other_keys - other_keys % width, side="left")
    out[others] = np.maximum(started - group_first - 1, 0)
    return out


def repeated_steps(all_steps: pa.Table, repeat: np.ndarray) -> dict[str, Any]:
    """The step events whose number their rank had already used: ``{"count", "ranks", "first"}``
    (``first`` names the earliest such event)."""
    again = repeat > 0
    if not again.any():
        return dict(NO_REPEATS)
    rank = all_steps["rank"].to_numpy(zero_copy_only=False)
    t0 = all_steps["t_start_ns"].to_numpy(zero_copy_only=False)
    i = int(np.flatnonzero(again)[np.argmin(t0[again])])
    return {"count": int(again.sum()), "ranks": sorted({int(r) for r in rank[again]}),
            "first": f"rank {int(rank[i])} step {all_steps['step'][i].as_py()} (event {int(repeat[i]) + 1} of that number)"}


def repeated_steps_note(repeated: dict[str, Any]) -> str | None:
    """One note for the summary when a rank reused step numbers (see :func:`measured_steps`)."""
    if not repeated.get("count"):
        return None
    return (f"{repeated['count']} step event(s) reuse a step number their rank had already recorded (first: "
            f"{repeated['first']}), as a loop whose index restarts every epoch does: each counts as a step of its "
            "own, in the order (repeat, number); number steps with a counter that keeps increasing so that each "
            "step has one number; data_quality.repeated_steps")


def _after_warmup(steps_t: pa.Table, warmup_steps: int) -> pa.Table:
    """``steps_t`` without the first ``warmup_steps`` step events of each rank (by start time, the
    order in which a recorder's automatic windows count them)."""
    if warmup_steps == 0:
        return steps_t
    return steps_t.filter(pa.array(_ordinal(steps_t, by_step=False) >= warmup_steps))


def _replica_of(ranks: list[int], rank_map: list[dict[str, Any]] | None) -> list[Any]:
    coords = {int(e["rank"]): (e.get("coords") or {}) for e in (rank_map or []) if "rank" in e}
    if all(r in coords and "dp" in coords[r] for r in ranks):
        return [coords[r]["dp"] for r in ranks]
    return list(ranks)


def _per_replica_sum(values: np.ndarray, replica: list[Any]) -> np.ndarray:
    """Sum over replicas of the largest value within each replica, per step (nan if all unknown)."""
    groups: dict[Any, list[int]] = {}
    for i, rep in enumerate(replica):
        groups.setdefault(rep, []).append(i)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-nan replicas are expected
            per_rep = np.vstack([np.nanmax(values[idx], axis=0) for idx in groups.values()])
    out = np.nansum(per_rep, axis=0)
    out[np.isnan(per_rep).all(axis=0)] = np.nan
    return out


# A "phase" event's label: its name, or for its self time once nested phases are taken out, this.
CONTAINER_LABELS = {"pipeline": "pipeline bubble + p2p wait"}


def self_phases(events: pa.Table | None, steps: set[int]) -> list[dict[str, Any]]:
    """Summed *self* seconds per (rank, label) of the non-step events inside ``steps``.

    Each event's direct parent is the innermost earlier event of the same rank that contains it; the
    child's duration is taken out of the parent's, so nested intervals are not counted twice. The
    label is the kind, except for ``phase`` events: their name, and for a phase that contained other
    events the name of what is left (``pipeline`` → "pipeline bubble + p2p wait"; else "<name> (rest)").
    """
    if events is None or not events.num_rows or not steps:
        return []
    sel = events.filter(pc.and_(pc.not_equal(events["kind"], "step"),
                                pc.is_in(events["step"], pa.array(sorted(steps), pa.int64()))))
    acc: dict[tuple[int, str], float] = {}
    # one rank at a time (in rank order, as one sorted walk over all of them would go): the Python
    # rows of the walk are one rank's, not the run's
    for rank in sorted(r for r in pc.unique(sel["rank"]).to_pylist() if r is not None):
        _rank_self_phases(sel.filter(pc.equal(sel["rank"], rank)), acc)
    return [{"rank": r, "kind": k, "seconds": v} for (r, k), v in sorted(acc.items())]


def _rank_self_phases(sel: pa.Table, acc: dict[tuple[int, str], float]) -> None:
    """Add one rank's self seconds per label to ``acc`` (see :func:`self_phases`)."""
    rows = sorted(zip(sel["rank"].to_pylist(), sel["t_start_ns"].to_pylist(), sel["t_end_ns"].to_pylist(),
                      sel["kind"].to_pylist(), sel["name"].to_pylist(), strict=True),
                  key=lambda e: (e[0], e[1], -(e[2] - e[1])))  # enclosing interval first at equal starts
    self_ns = [b - a for _, a, b, _, _ in rows]
    has_child = [False] * len(rows)
    stack: list[int] = []
    for i, (rank, _, end, _, _) in enumerate(rows):
        while stack and (rows[stack[-1]][0] != rank or rows[stack[-1]][2] < end):
            stack.pop()  # not this rank's, or ends before this one ends: not a parent
        if stack:
            self_ns[stack[-1]] -= end - rows[i][1]
            has_child[stack[-1]] = True
        stack.append(i)
    for (rank, _, _, kind, name), ns, child in zip(rows, self_ns, has_child, strict=True):
        label = kind
        if kind == "phase":
            label = name or "phase"
            if child:
                label = CONTAINER_LABELS.get(label, f"{label} (rest)")
        acc[(rank, label)] = acc.get((rank, label), 0.0) + max(ns, 0) / 1e9


def step_stats(sd: StepData | None, dropped: dict[str, Any] | None = None,
               ) -> tuple[dict[str, float | None], dict[str, str]]:
    """Step-time statistics, throughput and straggler spread; (metrics, why_null). ``dropped`` (from
    :func:`screen_steps`) only words the reason when no measured step is left."""
    names = ("step_time_mean_s", "step_time_p50_s", "step_time_p99_s", "step_time_cv", "tokens_per_s",
             "samples_per_s", "straggler_spread_pct")
    if sd is None or sd.n == 0:
        reason = "no measured step events (events/ with window=measured, or unmarked steps after the warm-up)"
        if dropped and dropped.get("count"):
            reason += f"; {dropped['count']} impossible step event(s) were dropped (data_quality.dropped_steps)"
        return dict.fromkeys(names), dict.fromkeys(names, reason)
    t = sd.step_time_s
    m: dict[str, float | None] = {
        "step_time_mean_s": float(np.mean(t)),
        "step_time_p50_s": float(np.percentile(t, 50)),
        "step_time_p99_s": float(np.percentile(t, 99)),
        "step_time_cv": float(np.std(t) / np.mean(t)) if np.mean(t) > 0 else None,
    }
    why: dict[str, str] = {}
    total_t = float(np.sum(t))
    for key, arr, label in (("tokens_per_s", sd.tokens, "tokens"), ("samples_per_s", sd.samples, "samples")):
        if np.isnan(arr).any() or total_t <= 0:
            m[key] = None
            why[key] = f"step events carry no {label} count"
        else:
            m[key] = float(np.sum(arr) / total_t)
    if len(sd.ranks) >= 2 and not np.isnan(sd.spread_pct).all():
        m["straggler_spread_pct"] = float(np.nanmean(sd.spread_pct))
    else:
        m["straggler_spread_pct"] = None
        why["straggler_spread_pct"] = "needs step events from at least two ranks"
    if m["step_time_cv"] is None:
        why["step_time_cv"] = "mean step time is zero"
    return m, why
