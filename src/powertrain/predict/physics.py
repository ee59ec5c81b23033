"""Power, clocks and heat of one configuration: governor per stage, stages on chassis slots, slowdown, sensors.

:func:`device_physics` takes the step's work at the maximum clock
(:class:`~powertrain.predict.timeline.StepWork`) and

1. lets each pipeline-stage kind's power governor set its clock under the power limit and any clock
   lock (:func:`~powertrain.predict.governor.stage_clocks`);
2. places the ranks on the nodes' chassis slots in Megatron order (tp fastest, then cp, dp, pp), so a
   slot holds one stage kind, and heats each slot from its own power
   (:func:`~powertrain.predict.thermal.slot_heat`: its inlet — front or rear row, liquid, immersion —
   its fitted power ratio, the thermal resistance; steady and at the end of the run from idle);
3. where a slot's steady temperature passes the device's slowdown temperature, its thermal slowdown
   lowers that slot's clock until it holds there; the slowest device of a stage sets the stage's pace
   and the job is synchronous, so everyone else waits for it (a straggler) — the governor is solved
   again with those caps;
4. reads the peaks a sampler would record from each power field
   (:func:`~powertrain.predict.sensors.seen_peak`) on the hungriest stage's timeline.

The answer's averages are over every device of the job (each slot pattern weighed by its nodes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from powertrain.hardware import DeviceSpec
from powertrain.predict.calibration import Coefficients
from powertrain.predict.case import Case
from powertrain.predict.dvfs import MIN_CLOCK_RATIO
from powertrain.predict.governor import StagePower, stage_clocks
from powertrain.predict.sensors import TRUE_1MS, SeenPeak, Sensor, seen_peak, sensors_of
from powertrain.predict.thermal import SlotHeat, node_heat
from powertrain.predict.timeline import ComposedStep, StepWork, compose_step, stage_timeline

# powertrain's own sampler (telemetry.clock.DEFAULT_RATE_HZ), and the study's: an energy monitor polling NVML's
# power usage at its update period (a Zeus-style monitor; the study names a fork of an energy monitor, not its
# field or rate — this reading is an assumption, stated wherever its peak is shown)
SAMPLER_HZ = 20.0
STUDY_SAMPLER = ("average", 10.0)


@dataclass(slots=True)
class SlotState:
    """One chassis slot of one kind of node: what it runs, draws, reaches and clocks."""

    slot: int
    nodes: int  # nodes with this slot pattern
    first_node: int  # the lowest node index with it
    stage: str
    power_w: float  # mean power of the device in this slot
    clock: float  # its SM clock ratio (power limit, lock, thermal slowdown)
    heat: SlotHeat
    thermal_throttled: bool
    throttle_power: float  # share of the step its power-cap reason is set


@dataclass
class Physics:
    """Everything :func:`device_physics` found for one configuration."""

    composed: ComposedStep
    stages: dict[str, StagePower]
    slots: list[SlotState]
    peaks: dict[str, SeenPeak]
    mean_w: float  # mean over every device of the job
    clock_mean: float  # time-weighted SM clock ratio, mean over devices
    throttle_power: float  # share of device time the power-cap reason is set
    throttle_thermal: float  # share of device time thermal slowdown holds the clock
    thermal_caps: dict[str, float] = field(default_factory=dict)  # stage kind → the clock its hottest slot allows
    measured_window_s: float = 0.0
    run_s: float = 0.0

    @property
    def step_clocks(self) -> dict[str, float]:
        """Per stage kind, the clock its pace is set at: its power clock, or its hottest device's thermal one."""
        return {k: min(sp.clock, self.thermal_caps.get(k, sp.clock)) for k, sp in self.stages.items()}

    @property
    def throttle_any(self) -> float:
        return max(self.throttle_power, self.throttle_thermal) if self.slots else 0.0

    @property
    def hottest(self) -> SlotState:
        """The first slot with the highest end temperature (max over plain floats, then its index: no key calls)."""
        ends = [s.heat.end_c for s in self.slots]
        return self.slots[ends.index(max(ends))]

    @property
    def swing_w(self) -> float:
        """Highest 1 ms power of any stage minus the lowest waiting draw."""
        hi = self.peaks["true_1ms"].power_w
        lo = min(sp.timeline.wait_w for sp in self.stages.values())
        return hi - lo


def node_patterns(case: Case) -> list[tuple[int, int, tuple[str, ...]]]:
    """(nodes, first node, stage kind of each slot) of every distinct kind of node of the job.

    Ranks fill the nodes in order and a rank's pipeline stage is ``rank // (tp·cp·dp)`` (Megatron order: tp
    fastest, then cp, dp, pp), so a node's slots change kind only where a stage boundary falls: the nodes
    holding the first→middle and middle→last boundaries are looked at one by one, the runs between them
    share one pattern."""
    dpn = max(1, min(case.devices_per_node, case.world))
    return list(_node_patterns(case.world, dpn, case.tp * case.cp * case.dp, case.pp))


@functools.lru_cache(maxsize=4096)
def _node_patterns(world: int, dpn: int, per_stage: int, pp: int) -> tuple[tuple[int, int, tuple[str, ...]], ...]:
    n_nodes = max(1, -(-world // dpn))

    def kind(rank: int) -> str:
        st = rank // per_stage
        return "all" if pp == 1 else "first" if st == 0 else "last" if st == pp - 1 else "middle"

    def pattern(k: int) -> tuple[str, ...]:
        return tuple(kind(k * dpn + i) for i in range(dpn) if k * dpn + i < world)

    cuts = {0, n_nodes - 1}
    for b in (per_stage, (pp - 1) * per_stage):
        for k in ((b - 1) // dpn, b // dpn, b // dpn + 1):
            if 0 <= k < n_nodes:
                cuts.add(k)
    marks = sorted(cuts)
    groups: dict[tuple[str, ...], list[int]] = {}  # pattern -> [nodes, first node]
    for a, b in zip(marks, [*marks[1:], n_nodes], strict=True):
        for k, count in ((a, 1), (a + 1, b - a - 1)):
            if count > 0 and k < n_nodes:
                g = groups.setdefault(pattern(k), [0, k])
                g[0] += count
    return tuple((g[0], g[1], pat) for pat, g in groups.items())


def _slots(dev: DeviceSpec, case: Case, c: Coefficients, stages: dict[str, StagePower], run_s: float,
           slot_clock: dict[tuple[int, int], float], composed: ComposedStep, work: StepWork) -> list[SlotState]:
    """Every slot's power, heat and clock; ``slot_clock`` holds the clocks of slots thermal slowdown caps."""
    from powertrain.predict.slot_thermal import slot_ratios

    dpn = max(1, min(case.devices_per_node, case.world))
    ratios = slot_ratios(dev, dpn)
    # per stage kind, once: its clock, mean power and power-cap share (a node has up to 72 slots of 3 kinds)
    own = {k: (sp.clock, sp.timeline.mean_w, sp.throttle_power) for k, sp in stages.items()}
    out: list[SlotState] = []
    for nodes, first, pat in node_patterns(case):
        powers = []
        clocks = []
        for i, kind in enumerate(pat):
            clock, mean_w, _ = own[kind]
            r = slot_clock.get((first, i), clock) if slot_clock else clock
            if r != clock:
                sp = stages[kind]
                mean_w = stage_timeline(dev, c, work, sp.stage, r, composed).mean_w
            powers.append(mean_w * ratios[i])
            clocks.append(r)
        for i, heat in enumerate(node_heat(dev, dpn, powers, run_s)):
            hot = bool(slot_clock) and (first, i) in slot_clock
            kind = pat[i]
            out.append(SlotState(i, nodes, first, kind, powers[i], clocks[i], heat, hot, 0.0 if hot else own[kind][2]))
    return out


def _thermal_clock(dev: DeviceSpec, c: Coefficients, work: StepWork, stage_kind: str, stages: dict[str, StagePower],
                   allowed_w: float) -> float:
    """The clock ratio at which a device of ``stage_kind`` draws ``allowed_w`` on average (the device power at which
    its slot reaches slowdown, :func:`~powertrain.predict.slot_thermal.slot_power_limit_w`) while the job waits for
    it: bisection on the clock (its mean power rises with it)."""
    sp = stages[stage_kind]
    lo, hi = MIN_CLOCK_RATIO, sp.clock
    clocks = {k: v.clock for k, v in stages.items()}
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        clocks[stage_kind] = mid
        composed = compose_step(work, clocks)
        p = stage_timeline(dev, c, work, sp.stage, mid, composed).mean_w
        if p > allowed_w:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-4:
            break
    return lo


def device_physics(case: Case, c: Coefficients, work: StepWork, lock: float, run_steps: int,
                   measured_steps: int) -> Physics:
    """Governor, slots, thermal slowdown and sensors of ``case`` (module docstring). ``lock``: the clock ratio a
    clock lock allows (1: none); ``run_steps``/``measured_steps``: steps of the whole run (warm-up included) and
    of its measured window (the sensors' reading window)."""
    from powertrain.predict.slot_thermal import slot_power_limit_w

    dev = case.device
    limit = min(dev.tdp_w, case.power_limit_w) if case.power_limit_w else dev.tdp_w
    caps = {s.name: lock for s in work.stages}
    composed, stages = stage_clocks(dev, c, work, limit, caps)
    run_s = composed.total_s * run_steps
    slot_clock: dict[tuple[int, int], float] = {}
    slots = _slots(dev, case, c, stages, run_s, slot_clock, composed, work)
    thermal_caps: dict[str, float] = {}
    if dev.slowdown_c is not None and any(s.heat.steady_c > dev.slowdown_c for s in slots):
        dpn = max(1, min(case.devices_per_node, case.world))
        for s in slots:
            if s.heat.steady_c <= dev.slowdown_c:
                continue
            allowed = slot_power_limit_w(dev, dpn, s.slot)
            if allowed is None:
                continue
            r = _thermal_clock(dev, c, work, s.stage, stages, allowed)
            slot_clock[(s.first_node, s.slot)] = r
            thermal_caps[s.stage] = min(thermal_caps.get(s.stage, 1.0), r)
        # the slowest device of a stage sets the stage's pace; the others run at their own clock and wait for it
        composed, stages = stage_clocks(dev, c, work, limit, caps, pace=thermal_caps)
        run_s = composed.total_s * run_steps
        slots = _slots(dev, case, c, stages, run_s, slot_clock, composed, work)
    # device-weighted means (list comprehensions: sum over a list is the same sum, without a generator's cost)
    n_dev = sum([s.nodes for s in slots]) or 1
    mean_w = sum([s.power_w * s.nodes for s in slots]) / n_dev
    stage_clock = {k: sp.clock_mean for k, sp in stages.items()}
    clock_mean = sum([(s.clock if s.thermal_throttled else stage_clock[s.stage]) * s.nodes for s in slots]) / n_dev
    thr_p = sum([s.throttle_power * s.nodes for s in slots]) / n_dev
    thr_t = sum([s.nodes for s in slots if s.thermal_throttled]) / n_dev
    window_s = composed.total_s * measured_steps
    hungry = max(stages.values(), key=lambda sp: sp.timeline.mean_w)
    fields = sensors_of(dev)
    peaks: dict[str, SeenPeak] = {}
    for role in ("instant", "average"):
        peaks[role] = seen_peak(hungry.timeline, fields[role], SAMPLER_HZ, window_s)
    peaks["study"] = seen_peak(hungry.timeline, fields[STUDY_SAMPLER[0]], STUDY_SAMPLER[1], window_s)
    peaks["true_1ms"] = seen_peak(hungry.timeline, TRUE_1MS, 1000.0, window_s)
    return Physics(composed=composed, stages=stages, slots=slots, peaks=peaks, mean_w=mean_w, clock_mean=clock_mean,
                   throttle_power=thr_p, throttle_thermal=thr_t, thermal_caps=thermal_caps,
                   measured_window_s=window_s, run_s=run_s)


def sensor_table(dev: DeviceSpec) -> dict[str, Sensor]:
    """The power fields the peaks are read from, by role."""
    return {**sensors_of(dev), "true_1ms": TRUE_1MS}
