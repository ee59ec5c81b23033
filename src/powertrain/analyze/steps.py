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
file). The count per reason reaches ``summary.json`` ``data_quality.dropped_steps`` and a note. A
kept step event's token or sample count below zero is not a count: it is **kept out** (unknown, as a
missing count is) and counted in ``data_quality.dropped_steps.negative_counts``, with a note.

**A rank the run had but whose step events are missing** (no ``events/rank-<r>.parquet``, or no
measured step in it), for a run whose ``rank_map`` lists its ranks, is named
(``StepData.missing``: the summary's note and ``data_quality.missing_ranks``). Step times cover the
ranks that recorded steps. When a whole data-parallel replica is missing, the steps' tokens and
samples are unknown (null, with the reason), never the other replicas' sum: per-token figures say
they cannot be computed instead of dividing by part of the job.

The events are read where they lie (:class:`powertrain.analyze.events.RunEvents`: DuckDB over the
Parquet files): the step events one rank at a time, the phases' self times one rank at a time in
chunks of start time, so memory follows the number of measured steps (the per-step arrays), not
the number of events.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from powertrain.analyze.events import DUR_NS, KEPT_STEP, MAX_STEP_NS, RunEvents

# No training step lasts a week: a longer one pairs stamps of different clocks or is corrupted.
MAX_STEP_S = MAX_STEP_NS / 1e9
_REASONS = ("negative duration", "zero duration", "no finite start or end", f"longer than {MAX_STEP_S / 86400:.0f} days")


def screen_steps(events: pa.Table | RunEvents) -> tuple[Any, dict[str, Any]]:
    """``events`` without the ``step`` events whose duration is negative, zero, not finite or longer
    than :data:`MAX_STEP_S`, and what was dropped: ``{"count", "reasons": {reason: n}, "first",
    "negative_counts"}`` (``first`` names the first dropped event, ``None`` when nothing was;
    ``negative_counts``: :func:`negative_counts`). Other kinds are kept. Events on disk
    (:class:`RunEvents`) are screened by a query and returned as they are: whoever reads them applies
    the same rule (:data:`powertrain.analyze.events.KEPT_STEP`)."""
    if isinstance(events, RunEvents):
        return events, screened(events)
    empty: dict[str, Any] = {"count": 0, "reasons": {}, "first": None, "negative_counts": dict(NO_NEGATIVE)}
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
        with RunEvents.from_table(events) as ev:
            return events, {**empty, "negative_counts": negative_counts(ev)}
    i = int(np.flatnonzero(bad)[0])
    first = (f"rank {events['rank'][i].as_py()} step {events['step'][i].as_py()}: "
             f"{'no duration' if not np.isfinite(dur[i]) else f'{dur[i]:.6g} s'}")
    kept = events.filter(pa.array(~bad))
    with RunEvents.from_table(kept) as ev:
        neg = negative_counts(ev)
    return kept, {"count": int(bad.sum()), "reasons": reasons, "first": first, "negative_counts": neg}


# A step event's reason to be dropped, in _REASONS' order (they exclude each other): SQL over view ev.
_REASON_SQL = (f"CASE WHEN t_start_ns IS NULL OR t_end_ns IS NULL THEN 2 WHEN {DUR_NS} < 0 THEN 0 "
               f"WHEN {DUR_NS} = 0 THEN 1 WHEN {DUR_NS} > {MAX_STEP_NS} THEN 3 END")


def screened(ev: RunEvents) -> dict[str, Any]:
    """What :func:`screen_steps` drops from the events ``ev``, counted by a query (nothing loaded).

    A duration compared in whole nanoseconds is the same test as the seconds :func:`screen_steps`
    computes (a nonzero whole-second part outweighs any nanosecond rest, and a week is exact)."""
    counts = dict(ev.rows(f"SELECT {_REASON_SQL} AS why, count(*) FROM ev WHERE kind = 'step' GROUP BY why"))
    reasons = {r: int(counts[i]) for i, r in enumerate(_REASONS) if counts.get(i)}
    out: dict[str, Any] = {"count": sum(reasons.values()), "reasons": reasons, "first": None,
                           "negative_counts": negative_counts(ev)}
    if reasons:
        t = ev.arrow(f"SELECT rank, step, t_start_ns, t_end_ns FROM ev WHERE kind = 'step' AND {_REASON_SQL} "
                     f"IS NOT NULL ORDER BY {ev.order} LIMIT 1")
        dur = float(_durations_s(t)[0])
        out["first"] = (f"rank {t['rank'][0].as_py()} step {t['step'][0].as_py()}: "
                        f"{'no duration' if not np.isfinite(dur) else f'{dur:.6g} s'}")
    return out


NO_NEGATIVE: dict[str, Any] = {"count": 0, "fields": {}, "first": None}
# The step events whose counts the measured steps read (kept by the screen, with a step number).
STEP_ROWS = f"{KEPT_STEP} AND step IS NOT NULL"


def negative_counts(ev: RunEvents) -> dict[str, Any]:
    """The kept step events whose ``tokens`` or ``samples`` is below zero, which :func:`measured_steps`
    reads as unknown: ``{"count": events, "fields": {"tokens": n, "samples": n}, "first"}``."""
    n, tok, smp = ev.one(f"SELECT count(*), count(*) FILTER (tokens < 0), count(*) FILTER (samples < 0) "
                         f"FROM ev WHERE {STEP_ROWS} AND (tokens < 0 OR samples < 0)")
    if not n:
        return dict(NO_NEGATIVE)
    r = ev.rows(f"SELECT rank, step, tokens, samples FROM ev WHERE {STEP_ROWS} AND (tokens < 0 OR samples < 0) "
                f"ORDER BY {ev.order} LIMIT 1")[0]
    what = ", ".join(f"{k} {v}" for k, v in (("tokens", r[2]), ("samples", r[3])) if v is not None and v < 0)
    return {"count": int(n), "fields": {k: int(v) for k, v in (("tokens", tok), ("samples", smp)) if v},
            "first": f"rank {r[0]} step {r[1]}: {what}"}


def negative_counts_note(dropped: dict[str, Any]) -> str | None:
    """One note for the summary when step events carried negative counts (see :func:`negative_counts`)."""
    neg = dropped.get("negative_counts") or {}
    if not neg.get("count"):
        return None
    fields = ", ".join(f"{n} {f}" for f, n in neg["fields"].items())
    return (f"{neg['count']} step event(s) carry a count below zero ({fields}; first: {neg['first']}): kept out "
            "as unknown, so a step whose data-parallel replica has no other count has none; "
            "data_quality.dropped_steps.negative_counts")


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
    # ranks of the rank map without measured step events (see missing_ranks)
    missing: dict[str, Any] = field(default_factory=lambda: dict(NO_MISSING))
    # why tokens and samples are unknown for every step (a data-parallel replica without events), else None
    counts_why: str | None = None

    @property
    def n(self) -> int:
        return len(self.steps)


def measured_steps(events: pa.Table | RunEvents, rank_map: list[dict[str, Any]] | None = None,
                   warmup_steps: int | None = None) -> StepData | None:
    """The measured steps of ``events`` (a table of :data:`powertrain.schema.EVENTS_SCHEMA`, or a run's
    events where they lie, :class:`RunEvents`), or ``None`` when there is no measured step event.

    ``warmup_steps`` (the run's ``run.json`` ``warmup_steps``; ``None`` = 0) only matters when no step
    event carries a window: see the module doc. Impossible step events are dropped first
    (:func:`screen_steps`; counted in ``StepData.dropped``).
    """
    if warmup_steps is None:
        warmup_steps = 0
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a whole number >= 0, got {warmup_steps!r} "
                         "(fix run.json's warmup_steps)")
    if isinstance(events, pa.Table):
        if events.num_rows == 0:
            return None
        with RunEvents.from_table(events) as ev:
            return _measured(ev, rank_map, warmup_steps)
    return _measured(events, rank_map, warmup_steps) if events.num_rows else None


@dataclass
class _RankSteps:
    """One rank's measured step events (in start-time order) and the step numbers it reused."""

    rank: int
    step: np.ndarray
    repeat: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    tokens: np.ndarray
    samples: np.ndarray
    again: int  # step events (all windows) whose number the rank had used before
    first_again: tuple[tuple[int, ...], str] | None  # the earliest of them: (table-order key, its name)


def _rank_steps(ev: RunEvents, rank: int, unmarked: bool, warmup_steps: int) -> _RankSteps:
    """One rank's step events kept by the screen, in start-time order (ties in the files' order): which
    use of its number each is, and which are measured (see the module doc)."""
    t = ev.arrow(f"SELECT step, t_start_ns, t_end_ns, \"window\" = 'measured' AS measured, tokens, samples, _file, _row "
                 f"FROM ev WHERE rank = ? AND {STEP_ROWS} ORDER BY t_start_ns, _file, _row", [rank])
    step = t["step"].to_numpy().astype(np.int64)
    t0 = t["t_start_ns"].to_numpy()
    repeat = _time_ordinal(step)
    if unmarked:  # the first warmup_steps of the rank by start time are its warm-up
        keep = np.arange(len(step)) >= warmup_steps
    else:
        keep = pc.fill_null(t["measured"], False).to_numpy(zero_copy_only=False)
    again = repeat > 0
    first = None
    if again.any():  # the earliest reuse; at equal starts the first in the table's order
        i = int(np.flatnonzero(again)[np.argmin(t0[again])])
        row = int(t["_row"][i].as_py())
        key = (int(t0[i]), row) if ev.table_order else (int(t0[i]), rank, int(t["_file"][i].as_py()), row)
        first = (key, f"rank {rank} step {int(step[i])} (event {int(repeat[i]) + 1} of that number)")
    return _RankSteps(rank, step[keep], repeat[keep], t0[keep], t["t_end_ns"].to_numpy()[keep],
                      _counts(t["tokens"])[keep], _counts(t["samples"])[keep], int(again.sum()), first)


def _counts(col: pa.ChunkedArray) -> np.ndarray:
    """A count column as float: null is nan; a count below zero (not a count: negative_counts) is
    ``-inf``, which :func:`_per_replica_sum` reads as unknown where its replica has no other count."""
    v = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).copy()
    with np.errstate(invalid="ignore"):
        v[v < 0] = -np.inf
    return v


def _time_ordinal(step: np.ndarray) -> np.ndarray:
    """Per event of one rank (in start-time order): how many of its events of the same number came before."""
    n = len(step)
    order = np.argsort(step, kind="stable")
    s = step[order]
    new = np.ones(n, dtype=bool)
    new[1:] = s[1:] != s[:-1]
    first = np.flatnonzero(new)
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    return out


def _measured(ev: RunEvents, rank_map: list[dict[str, Any]] | None, warmup_steps: int) -> StepData | None:
    """:func:`measured_steps` of events where they lie: one rank's step events at a time."""
    dropped = screened(ev)
    n_all, n_marked = ev.one(f"SELECT count(*), count(\"window\") FROM ev WHERE {STEP_ROWS}")
    unmarked = bool(n_all) and not n_marked
    rule: str | None = None
    if unmarked:
        rule = (f"no step event carries a window: steps count as measured after the first {warmup_steps} "
                "of each rank (warm-up)" if warmup_steps else
                "no step event carries a window: every step counts as measured")
    parts = [_rank_steps(ev, r, unmarked, warmup_steps) for r in ev.ranks(STEP_ROWS)]
    repeated = _repeats(parts)
    parts = [p for p in parts if p.step.size]
    if not parts:
        return None
    sd = _step_table(parts, rank_map)
    sd.window_rule, sd.dropped, sd.repeated = rule, dropped, repeated
    sd.missing = missing_ranks(ev, sd.ranks, rank_map)
    if sd.missing["replicas_unknown"]:
        sd.tokens = np.full(sd.n, np.nan)
        sd.samples = np.full(sd.n, np.nan)
        sd.counts_why = (f"{_ranks_text(sd.missing['ranks'])} of the rank map recorded no measured step: the "
                         "tokens and samples of their data-parallel replica are unknown, and the other replicas' "
                         "alone would be part of the job taken for the whole (data_quality.missing_ranks)")
    # a reused step number's warm-up events are not the measured ones: phases inside the window only
    sd.phases = _phases(ev, sd.steps, sd.window)
    return sd


def _repeats(parts: list[_RankSteps]) -> dict[str, Any]:
    """``repeated_steps`` over every rank's step events (see :func:`repeated_steps`)."""
    count = sum(p.again for p in parts)
    if not count:
        return dict(NO_REPEATS)
    first = min((p.first_again for p in parts if p.first_again is not None), key=lambda f: f[0])
    return {"count": count, "ranks": [p.rank for p in parts if p.again], "first": first[1]}


def _step_table(parts: list[_RankSteps], rank_map: list[dict[str, Any]] | None) -> StepData:
    """The per-step arrays from every rank's measured step events (see the module doc)."""
    rank = np.concatenate([np.full(p.step.size, p.rank, dtype=np.int64) for p in parts])
    step = np.concatenate([p.step for p in parts])
    t0 = np.concatenate([p.t0 for p in parts])
    t1 = np.concatenate([p.t1 for p in parts])
    ranks_arr, ri = np.unique(rank, return_inverse=True)
    # one column per (repeat, step number): a reused number is a step of its own, never overwritten
    slots, si = np.unique(np.stack([np.concatenate([p.repeat for p in parts]), step], axis=1),
                          axis=0, return_inverse=True)
    si = si.reshape(-1)
    ranks = [int(r) for r in ranks_arr]
    uniq = slots[:, 1].astype(np.int64)
    dur = np.full((len(ranks), len(uniq)), np.nan)
    toks = np.full((len(ranks), len(uniq)), np.nan)
    smps = np.full((len(ranks), len(uniq)), np.nan)
    dur[ri, si] = (t1 - t0) / 1e9
    toks[ri, si] = np.concatenate([p.tokens for p in parts])
    smps[ri, si] = np.concatenate([p.samples for p in parts])
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
    return StepData(
        steps=uniq, step_time_s=step_time, tokens=_per_replica_sum(toks, replica),
        samples=_per_replica_sum(smps, replica), t_start_ns=starts, t_end_ns=ends, ranks=ranks,
        rank_step_s=dur, spread_pct=spread, window=(int(t0.min()), int(t1.max())),
        repeats=slots[:, 0].astype(np.int64),
    )


NO_MISSING: dict[str, Any] = {"count": 0, "ranks": [], "no_events": [], "replicas_unknown": False}


def missing_ranks(ev: RunEvents, ranks: list[int], rank_map: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The ranks ``rank_map`` lists that have no measured step among ``ranks`` (those that have):
    ``{"count", "ranks", "no_events": the ones without any event (no events file), "replicas_unknown":
    whether a whole data-parallel replica is among them}``."""
    listed = sorted({int(e["rank"]) for e in rank_map or [] if "rank" in e})
    gone = [r for r in listed if r not in set(ranks)]
    if not gone:
        return dict(NO_MISSING)
    with_events = set(ev.ranks())
    replica = dict(zip(listed, _replica_of(listed, rank_map), strict=True))
    present = {replica.get(r, ("rank", r)) for r in ranks}
    return {"count": len(gone), "ranks": gone, "no_events": [r for r in gone if r not in with_events],
            "replicas_unknown": any(replica[r] not in present for r in gone)}


def _ranks_text(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 1, 3``, … (ten named at most)."""
    listed = ", ".join(map(str, ranks[:10])) + (f" and {len(ranks) - 10} more" if len(ranks) > 10 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}"


def missing_ranks_note(missing: dict[str, Any]) -> str | None:
    """One note for the summary when ranks of the rank map recorded no measured step (see :func:`missing_ranks`)."""
    if not missing.get("count"):
        return None
    files = missing["no_events"]
    where = (f" (no events file: {', '.join(f'events/rank-{r}.parquet' for r in files[:5])}"
             f"{' …' if len(files) > 5 else ''})" if files else "")
    counts = ("the tokens and samples of their data-parallel replica are unknown, so tokens_per_s and every "
              "per-token figure are null" if missing["replicas_unknown"] else
              "their replicas' tokens come from the replicas' other ranks")
    return (f"{_ranks_text(missing['ranks'])} of the run's rank map recorded no measured step{where}: step times "
            f"cover the other ranks; {counts}; data_quality.missing_ranks")


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


def _replica_of(ranks: list[int], rank_map: list[dict[str, Any]] | None) -> list[Any]:
    coords = {int(e["rank"]): (e.get("coords") or {}) for e in (rank_map or []) if "rank" in e}
    if all(r in coords and "dp" in coords[r] for r in ranks):
        return [coords[r]["dp"] for r in ranks]
    return list(ranks)


def _per_replica_sum(values: np.ndarray, replica: list[Any]) -> np.ndarray:
    """Sum over replicas of the largest value within each replica, per step (nan if all unknown, and
    nan where a replica's only counts were below zero, ``-inf`` in ``values``: its count is unknown, and
    the others' sum would be taken for the step's)."""
    groups: dict[Any, list[int]] = {}
    for i, rep in enumerate(replica):
        groups.setdefault(rep, []).append(i)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-nan replicas are expected
            per_rep = np.vstack([np.nanmax(values[idx], axis=0) for idx in groups.values()])
    poisoned = np.isneginf(per_rep).any(axis=0)
    per_rep[np.isneginf(per_rep)] = np.nan
    out = np.nansum(per_rep, axis=0)
    out[np.isnan(per_rep).all(axis=0) | poisoned] = np.nan
    return out


# A "phase" event's label: its name, or for its self time once nested phases are taken out, this.
CONTAINER_LABELS = {"pipeline": "pipeline bubble + p2p wait"}


def self_phases(events: pa.Table | RunEvents | None, steps: set[int]) -> list[dict[str, Any]]:
    """Summed *self* seconds per (rank, label) of the non-step events inside ``steps``.

    Each event's direct parent is the innermost earlier event of the same rank that contains it; the
    child's duration is taken out of the parent's, so nested intervals are not counted twice. The
    label is the kind, except for ``phase`` events: their name, and for a phase that contained other
    events the name of what is left (``pipeline`` → "pipeline bubble + p2p wait"; else "<name> (rest)").
    """
    if events is None or not events.num_rows or not steps:
        return []
    if isinstance(events, RunEvents):
        return _phases(events, np.array(sorted(steps), dtype=np.int64), None)
    with RunEvents.from_table(events) as ev:
        return _phases(ev, np.array(sorted(steps), dtype=np.int64), None)


def _phases(ev: RunEvents, steps: np.ndarray, window: tuple[int, int] | None) -> list[dict[str, Any]]:
    """:func:`self_phases` of the events of ``steps`` (numbers) lying inside ``window`` (all when None):
    one rank at a time, in chunks of start time; the walk restarts only where no earlier event of the
    rank can contain a later one (:func:`_independent_runs`), so it is the one walk over the rank."""
    if not steps.size:
        return []
    ev.register_steps("_phase_steps", np.unique(steps))
    where = "kind <> 'step' AND step IN (SELECT step FROM _phase_steps)"
    params: list[Any] = []
    if window is not None:
        where += " AND t_start_ns >= ? AND t_end_ns <= ?"
        params = [int(window[0]), int(window[1])]
    acc: dict[tuple[int, str], float] = {}
    for rank in ev.ranks(where, params):
        chunks = ev.rank_chunks(rank, where, "t_start_ns, t_end_ns, kind, name", "t_end_ns DESC", params)
        for rows in _independent_runs(chunks):
            _walk_self_phases(rank, rows, acc)
    return [{"rank": r, "kind": k, "seconds": v} for (r, k), v in sorted(acc.items())]


def _independent_runs(chunks: Iterator[list[tuple[Any, ...]]]) -> Iterator[list[tuple[Any, ...]]]:
    """Rows ``(start, end, …)`` of one rank in walk order (start, then the longer first), regrouped so
    that no row of a group contains a row of a later group: a group starts at a row that ends after
    every row before it (none of them can be its parent, nor a later row's once it is popped). Rows
    left after the last such row wait for the next chunk."""
    carry: list[tuple[Any, ...]] = []
    for chunk in chunks:
        rows = carry + chunk
        end = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        starts = np.flatnonzero(np.maximum.accumulate(end)[:-1] < end[1:]) + 1
        if not starts.size:
            carry = rows
            continue
        cut = int(starts[-1])
        yield rows[:cut]
        carry = rows[cut:]
    if carry:
        yield carry


def _walk_self_phases(rank: int, rows: list[tuple[Any, ...]], acc: dict[tuple[int, str], float]) -> None:
    """Add one rank's self seconds per label of ``rows`` (start, end, kind, name; walk order) to ``acc``."""
    self_ns = [b - a for a, b, _, _ in rows]
    has_child = [False] * len(rows)
    stack: list[int] = []
    for i, (start, end, _, _) in enumerate(rows):
        while stack and rows[stack[-1]][1] < end:
            stack.pop()  # ends before this one ends: not a parent
        if stack:
            self_ns[stack[-1]] -= end - start
            has_child[stack[-1]] = True
        stack.append(i)
    for (_, _, kind, name), ns, child in zip(rows, self_ns, has_child, strict=True):
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
    negative = ((dropped or sd.dropped).get("negative_counts") or {}).get("fields") or {}
    for key, arr, label in (("tokens_per_s", sd.tokens, "tokens"), ("samples_per_s", sd.samples, "samples")):
        if np.isnan(arr).any() or total_t <= 0:
            m[key] = None
            why[key] = (sd.counts_why if sd.counts_why else
                        f"a measured step has no {label} count: {negative[label]} step event(s) carry one below "
                        "zero, kept out as unknown (data_quality.dropped_steps.negative_counts)"
                        if negative.get(label) else f"step events carry no {label} count")
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
