"""Thermal-aware placement: which GPU slot each pipeline stage runs on, and how many layers it gets.

**Slot profile** (:func:`slot_profile`): from a measured run directory — our own run or an import
such as ``powertrain import nvsmi`` of nvidia-smi logs — per GPU slot (the ``device`` column, the
same slot on every host pooled), over the samples where the GPU was busy: mean and p95 temperature,
mean SM clock, share of samples with a throttle bit, mean power. A slot's **relative speed** is its
busy-time mean SM clock over the fastest slot's (compute time scales with the clock), else — with no
clock column — one minus its throttle share times an assumed 15 % throttled slowdown (labelled an
estimate), else unknown (None). nvidia-smi logs that recorded only power and utilisation (the
8×H100 logs in the shared data) give power and utilisation per slot and no speed: the profile says so.

**Placement** (:func:`place_stages`): with Megatron's rank order (TP fastest, then CP, DP, PP) the
local ranks of a node belong to pipeline stages; ``launch.device_order`` maps local rank → GPU
slot. Heavier stages go to the fastest slots (a stage runs at its slowest slot's pace), then the
layers are re-split (``pp_split``) so each stage's work over its speed is as even as integers allow
(water-filling: each next layer goes to the stage whose time grows least). The last stage carries
the logit layer, worth ``head_layers`` layers (from the predictor's step-time breakdown).

The step estimate scales the predictor's step time by the slowest stage's time relative to the
same pipeline on uniform, full-speed slots; it is an estimate (the predictor has no per-slot speed).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from powertrain.predict import Calibration, Case, load_calibration, predict
from powertrain.schema import Throttle
from powertrain.spec.layout import Layout
from powertrain.store import read_telemetry

ASSUMED_THROTTLE_SLOWDOWN = 0.15  # clock lost while a throttle bit is set, when no clock was recorded


@dataclass(frozen=True)
class SlotStats:
    slot: str
    busy_samples: int
    temp_mean_c: float | None
    temp_p95_c: float | None
    clock_mean_mhz: float | None
    throttle_share: float | None
    power_mean_w: float | None
    util_mean_pct: float | None


@dataclass
class SlotProfile:
    """Per-slot statistics and relative speeds (1.0 = the fastest slot; None = unknown)."""

    source: str
    slots: list[SlotStats]
    speed: dict[str, float | None]
    speed_from: str
    notes: list[str] = field(default_factory=list)

    def speeds_known(self) -> bool:
        return all(v is not None for v in self.speed.values())

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "speed_from": self.speed_from, "notes": self.notes,
                "slots": [{**s.__dict__, "relative_speed": self.speed.get(s.slot)} for s in self.slots]}


def _col(t: Any, name: str) -> np.ndarray | None:
    if name not in t.schema.names:
        return None
    arr = np.asarray(t[name].to_numpy(zero_copy_only=False), dtype=float)
    return None if np.all(np.isnan(arr)) else arr


def _mean(a: np.ndarray | None, mask: np.ndarray) -> float | None:
    if a is None:
        return None
    v = a[mask & ~np.isnan(a)]
    return float(v.mean()) if v.size else None


def slot_profile(run_dir: str | os.PathLike[str], busy_util_pct: float = 50.0) -> SlotProfile:
    """The per-slot profile of a measured run directory (see module doc)."""
    if not os.path.isdir(run_dir):
        raise ValueError(f"{run_dir}: not a run directory; give a measured or imported run (powertrain import "
                         "nvsmi …), or --placement model")
    t = read_telemetry(run_dir)
    if t.num_rows == 0:
        raise ValueError(f"{run_dir}: no telemetry rows; give a run directory with per-GPU telemetry")
    dev = np.asarray(t["device"].to_pylist(), dtype=object)
    gpus = sorted({d for d in dev if isinstance(d, str) and d.startswith("gpu")}, key=lambda d: int(d[3:] or 0))
    if not gpus:
        raise ValueError(f"{run_dir}: no GPU rows (devices {sorted(set(map(str, dev)))[:4]}); a placement needs "
                         "per-GPU telemetry")
    util, power, temp = _col(t, "util_pct"), _col(t, "power_w"), _col(t, "temp_c")
    clock, thr = _col(t, "clock_sm_mhz"), _col(t, "throttle")
    notes = []
    stats = []
    for g in gpus:
        rows = dev == g
        busy = rows & (util >= busy_util_pct) if util is not None else rows
        if not busy.any():
            busy = rows
            notes.append(f"{g}: never above {busy_util_pct:g} % utilisation; all its samples used")
        tv = temp[busy & ~np.isnan(temp)] if temp is not None else np.array([])
        share = None
        if thr is not None:
            bits = thr[busy & ~np.isnan(thr)].astype(np.int64)
            slow = int(Throttle.POWER_CAP | Throttle.THERMAL_SW | Throttle.THERMAL_HW | Throttle.HW_SLOWDOWN)
            share = float(((bits & slow) != 0).mean()) if bits.size else None
        stats.append(SlotStats(g, int(busy.sum()), float(tv.mean()) if tv.size else None,
                               float(np.percentile(tv, 95)) if tv.size else None, _mean(clock, busy), share,
                               _mean(power, busy), _mean(util, busy)))
    speed, how = _speeds(stats)
    if how == "unknown":
        have = [n for n, a in (("power", power), ("utilisation", util), ("temperature", temp)) if a is not None]
        notes.append(f"no SM clock or throttle column ({', '.join(have) or 'nothing'} recorded): relative speeds "
                     "unknown; a placement from this profile treats every slot as equally fast")
    return SlotProfile(str(run_dir), stats, speed, how, notes)


def _speeds(stats: list[SlotStats]) -> tuple[dict[str, float | None], str]:
    clocks = [s.clock_mean_mhz for s in stats]
    if all(c is not None for c in clocks):
        top = max(c for c in clocks if c is not None)
        return {s.slot: (s.clock_mean_mhz or 0.0) / top for s in stats}, "busy-time mean SM clock ÷ fastest slot's"
    shares = [s.throttle_share for s in stats]
    if all(x is not None for x in shares):
        return ({s.slot: 1 - (s.throttle_share or 0.0) * ASSUMED_THROTTLE_SLOWDOWN for s in stats},
                f"estimate: 1 − throttle share × {ASSUMED_THROTTLE_SLOWDOWN:.0%} assumed slowdown (no clock column)")
    return {s.slot: None for s in stats}, "unknown"


def predicted_profile(case: Case, calibration: Calibration | str | None = None) -> SlotProfile:
    """A profile from the predictor when no measured run is at hand: each slot of the node holding the hottest
    GPU, at its predicted temperature, power and clock (the predictor's governor and thermal slowdown per slot,
    :mod:`powertrain.predict.physics`); a slot's speed is its clock over the fastest slot's. An estimate,
    labelled so."""
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    dev = case.device
    if not dev.has_power_sensor:
        raise ValueError(f"placement: {dev.name} has no thermal model (no sensor); give a measured run directory")
    pred = predict(case, cal)
    slots = pred.breakdown.get("slots") or []
    hottest = max(slots, key=lambda s: s["end_c"])
    node = [s for s in slots if s["first_node"] == hottest["first_node"]]
    fastest = max(s["clock"] for s in node)
    stats = [SlotStats(s["slot"], 0, s["end_c"], s["end_c"], s["clock_mhz"],
                       1.0 if s["throttled"] else float(s["throttle_share_power_cap"]), s["power_w"], None) for s in node]
    speed: dict[str, float | None] = {s["slot"]: s["clock"] / fastest for s in node}
    mean_w = float(pred.metrics["power_mean_w"])
    return SlotProfile(f"predicted ({dev.name}, {len(node)} slots, {mean_w:.0f} W mean per GPU)", stats, speed,
                       "estimate: the predictor's per-slot clocks (power limit, thermal slowdown)")


def synthetic_profile(speeds: dict[str, float]) -> SlotProfile:
    """A profile from given relative speeds (tests, what-if studies)."""
    stats = [SlotStats(k, 0, None, None, None, None, None, None) for k in speeds]
    return SlotProfile("synthetic", stats, dict(speeds), "given")


@dataclass
class Placement:
    device_order: list[int]  # local rank → GPU slot index (launch.device_order)
    pp_split: list[int]  # layers per pipeline stage
    stage_slots: dict[int, list[int]]  # stage → its slots on a node
    stage_speed: list[float]
    step_before_s: float  # even split, identity order, on the profiled slots (estimate)
    step_after_s: float  # proposed order and split (estimate)
    step_uniform_s: float  # the predictor's step (uniform, full-speed slots)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _stage_of_local_ranks(case: Case) -> list[int]:
    lay = Layout(tp=case.tp, pp=case.pp, cp=case.cp, dp=case.dp)
    dpn = min(case.devices_per_node, case.world)
    return [lay.coords(r)["pp"] for r in range(dpn)]


def _water_fill(layers: int, speeds: list[float], head: float) -> list[int]:
    """Integer layers per stage minimising max (layers + head on the last) / speed; each stage ≥ 1."""
    n = len(speeds)
    split = [1] * n
    extra = [0.0] * (n - 1) + [head]
    for _ in range(layers - n):
        j = min(range(n), key=lambda i: (split[i] + 1 + extra[i]) / speeds[i])
        split[j] += 1
    return split


def _slowest(split: list[int], speeds: list[float], head: float) -> float:
    return max((n + (head if i == len(split) - 1 else 0.0)) / v for i, (n, v) in enumerate(zip(split, speeds,
                                                                                            strict=True)))


def place_stages(case: Case, profile: SlotProfile, calibration: Calibration | str | None = None) -> Placement:
    """Propose ``launch.device_order`` and ``pp_split`` for ``case`` on slots profiled by ``profile``."""
    if case.vp > 1:
        raise ValueError("placement: interleaved schedules (virtual stages) are not placed; use a 1F1B or GPipe "
                         "layout (pp_schedule) or place by hand")
    dpn = min(case.devices_per_node, case.world)
    slots = sorted(profile.speed, key=lambda s: int(s[3:]) if s[3:].isdigit() else 0)
    if len(slots) < dpn:
        raise ValueError(f"placement: the profile has {len(slots)} GPU slots, the layout uses {dpn} per node; "
                         "profile a run on the same node type")
    notes = list(profile.notes)
    speed = [profile.speed[s] or 1.0 for s in slots[:dpn]]
    if not profile.speeds_known():
        notes.append("relative speeds unknown: every slot counted as full speed")
    stage_of = _stage_of_local_ranks(case)
    stages = sorted(set(stage_of))
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    pred = predict(replace(case, pp_split="even"), cal)
    st = pred.breakdown["step_time"]
    per_layer = max(1e-12, (st["compute_s"] + st["memory_bound_s"]) / max(1, case.layers))
    head = st.get("head_s", 0.0) / per_layer  # the logit layer, in layers
    # heavier stages (the last, with the head) first, onto the fastest slots
    need = {s: stage_of.count(s) for s in stages}
    free = sorted(range(dpn), key=lambda i: -speed[i])
    stage_slots: dict[int, list[int]] = {}
    n_local = len(stages)
    # a node holds n_local consecutive stages; local stage k stands for every stage ≡ k (mod n_local),
    # so the one with the logit layer is (pp − 1) mod n_local
    heavy = stages[(case.pp - 1) % n_local] if n_local else None
    for s in sorted(stages, key=lambda s: -(head if s == heavy else 0.0)):
        stage_slots[s], free = free[:need[s]], free[need[s]:]
    order = [0] * dpn
    for s in stages:
        ranks = [r for r in range(dpn) if stage_of[r] == s]
        for r, slot in zip(ranks, sorted(stage_slots[s]), strict=True):
            order[r] = slot
    # stages not on this node (pp spans nodes) run at the pace of the same slots on their node
    v_stage = [min(speed[i] for i in stage_slots[stages[s % n_local]]) for s in range(case.pp)]
    v_identity = [min(speed[r] for r in range(dpn) if stage_of[r] == stages[s % n_local]) for s in range(case.pp)]
    even = list(Layout(pp=case.pp).stage_layer_counts(case.layers))
    split = _water_fill(case.layers, v_stage, head) if case.pp > 1 else [case.layers]
    ideal = _slowest(even, [1.0] * case.pp, head)
    step = float(pred.metrics["step_time_mean_s"])
    before = step * _slowest(even, v_identity, head) / ideal
    after = step * _slowest(split, v_stage, head) / ideal
    if case.pp == 1:
        notes.append("no pipeline: every rank does the same work, so placement cannot shorten the step")
    return Placement(order, split, stage_slots, v_stage, before, after, step, notes)


def placement_gain(p: Placement) -> float:
    """Relative step-time change of the proposal against identity order and even split (negative: faster)."""
    return p.step_after_s / p.step_before_s - 1 if p.step_before_s > 0 and math.isfinite(p.step_before_s) else 0.0
