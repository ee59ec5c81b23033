"""One prediction: memory, step time, throughput, power, energy, temperature — and its summary.

:func:`predict` composes the parts (memory → power-limited clocks → step time → per-device power →
slot temperatures → thermal stragglers) and returns a :class:`Prediction` whose ``metrics`` use the
metric names of a measured run's ``summary.json``, so reports and ``compare`` read both alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from powertrain.core.flops import Shape, model_flops_per_step, recompute_flops_per_token, shape_of
from powertrain.predict.calibration import Calibration, Coefficients, load_calibration
from powertrain.predict.case import Case, case_from_run_config
from powertrain.predict.memory import memory_per_device
from powertrain.predict.power import DevicePower, clock_exponent, clock_factor, node_power_w, step_power
from powertrain.predict.steptime import StepTime, step_time
from powertrain.predict.thermal import SlotThermal, slot_temperatures

METRIC_NAMES = (
    "step_time_mean_s", "tokens_per_s", "samples_per_s", "tokens_per_s_per_device", "tflops_per_device",
    "model_flops_per_step", "mfu", "hfu", "power_mean_w", "power_peak_w", "power_swing_w",
    "energy_per_step_j", "energy_j", "j_per_token", "tokens_per_j", "samples_per_s_per_mj_study", "temp_mean_c",
    "temp_peak_c", "hottest_slot", "throttle_share", "mem_per_device_bytes",
)


class Prediction:
    """Predicted metrics (None where the model has nothing honest to say, with the reason).

    ``breakdown`` (step-time parts, memory parts, clocks, per-slot temperatures) is assembled on
    first access, so sweeping thousands of configurations pays only for the metrics.
    """

    __slots__ = ("_breakdown", "_raw", "calibration", "fits", "metrics", "model_error", "why_null")

    def __init__(self, metrics: dict[str, Any], why_null: dict[str, str], fits: bool, calibration: str = "default",
                 model_error: dict[str, Any] | None = None, raw: tuple[Any, ...] | None = None,
                 breakdown: dict[str, Any] | None = None) -> None:
        self.metrics = metrics
        self.why_null = why_null
        self.fits = fits
        self.calibration = calibration  # the name of the calibration it was made with
        self.model_error = model_error or {}
        self._raw = raw
        self._breakdown = breakdown

    @property
    def breakdown(self) -> dict[str, Any]:
        if self._breakdown is None:
            self._breakdown = _breakdown(*self._raw) if self._raw else {}
        return self._breakdown

    def summary(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``summary.json`` body of a prediction (same shape as a measured run's)."""
        return {"kind": "prediction", "profile": self.calibration, "model_error": self.model_error,
                "config": config, "metrics": self.metrics, "why_null": self.why_null,
                "window": self.window, "breakdown": self.breakdown}

    @property
    def window(self) -> dict[str, Any]:
        """The window the predicted time and energy are over: the configuration's measured steps (no
        clock times: nothing ran). One formula: energy per step = mean device power × devices × step
        time; ``energy_j`` = that × measured steps."""
        t = self.metrics.get("step_time_mean_s")
        steps = self._raw[0].window_steps(t) if self._raw and t is not None else None
        seconds = t * steps if t is not None and steps else None
        return {"t0_ns": None, "t1_ns": None, "seconds": seconds, "measured_steps": steps,
                "source": f"predicted: {steps} measured step(s) of the configuration, protocol.min_measured_s "
                          "included (estimate; energy = mean device power × devices × step time, per step)"}


def _breakdown(case: Case, st: Any, mem_bd: dict[str, float], fits: bool, clock: float, thermal_clock: float,
               node_energy: float | None, slots: list[Any] | None) -> dict[str, Any]:
    return {
        "step_time": st.breakdown,
        "memory": mem_bd,
        "fits_in_memory": fits,
        "clock_factor_power_limit": clock,
        "clock_factor_thermal": thermal_clock,
        "node_energy_per_step_j": node_energy,
        "slots": None if slots is None else sorted((
            {"slot": f"gpu{i}", "inlet_c": s.inlet_c, "steady_c": s.steady_c, "peak_c": s.peak_c,
             "throttled": s.throttled, "time_to_steady_s": s.time_to_steady_s} for s in slots for i in s.slots),
            key=lambda d: int(d["slot"][3:])),
        "layout": {"tp": case.tp, "pp": case.pp, "dp": case.dp, "cp": case.cp, "ep": case.ep, "etp": case.etp,
                   "vp": case.vp,
                   "micro_batches": case.micro_batches},
        "device": case.device.name,
        "device_source": case.device.source,
        # a CPU's peak comes from a host probe: which one (a calibration's, a run's, or a fresh one)
        "host_probe": None if case.device.probe is None else
        {**case.device.probe.to_dict(), "source": case.device.probe.source},
    }


def _as_case(cfg: Any, cal: Calibration) -> Case:
    if isinstance(cfg, Case):
        return cfg
    from powertrain.spec.validate import layout_violations

    # a layout no framework runs (EP that fits no stage, a batch that does not split) is refused by its
    # rule, never costed; the built-in trainer's own limits (CP, FSDP with EP, folding) are not refusals here
    broken = layout_violations(cfg)
    if broken:
        raise ValueError("; ".join(str(v) for v in broken))
    # a memory clock lock would need the device's memory clock range and how bandwidth follows it, which the
    # catalog does not hold: refused rather than predicted at full memory bandwidth
    if getattr(cfg.knobs, "mem_clock_mhz", None) is not None:
        raise ValueError("knobs.mem_clock_mhz: predict models SM clock locks and power limits, not memory clock "
                         "locks; drop it")
    # a CPU RunConfig takes the calibration's host probe (what its coefficients were fitted against)
    return case_from_run_config(cfg, calibration=cal)


def sm_clock_ratio(case: Case) -> float:
    """The clock a lock allows ÷ the device's maximum (1: no lock, or a lock at or above the maximum).

    A locked GPU runs at the lower of the lock and what its power limit allows (the caller takes the min)."""
    if case.sm_clock_mhz is None:
        return 1.0
    top = case.device.max_sm_clock_mhz
    if top is None:
        raise ValueError(f"knobs.sm_clock_mhz: the catalog does not know {case.device.name}'s maximum SM clock, so a "
                         "lock cannot be turned into a clock ratio; add max_sm_clock_mhz to the device in a --hardware "
                         "catalog, or use knobs.power_limit_w")
    return min(1.0, case.sm_clock_mhz / top)


def predict(cfg: Any, calibration: Calibration | str | None = None) -> Prediction:
    """Predict one configuration (a RunConfig or a Case) with a calibration (by name, path or value).

    A CPU RunConfig uses the calibration's host probe for its thread count, else a fresh probe of this
    host; ``breakdown["host_probe"]["source"]`` says which.
    """
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    c = cal.coefficients
    case = _as_case(cfg, cal)
    dev = case.device
    world = case.world
    sh = shape_of(case)
    mem_total, mem_bd = memory_per_device(case, c, sh)
    fits = mem_total <= dev.memory_bytes

    clock = min(clock_factor(dev, c, case.power_limit_w), sm_clock_ratio(case))
    st = step_time(case, c, clock, sh)
    pw = step_power(dev, c, st, clock)
    dpn = min(case.devices_per_node, world)
    slots = slot_temperatures(dev, dpn, pw.mean_w, pw.peak_w, st.burst_s)
    throttled = any(s.throttled for s in slots)
    powers = [pw]
    thermal_clock = 1.0
    if throttled:
        st, powers, slots, thermal_clock = _thermal_stragglers(case, c, sh, clock, st, pw, slots)

    t = st.total_s
    tokens = case.global_batch * case.seq_len
    mflops = model_flops_per_step(sh, case.global_batch)
    hflops = mflops + recompute_flops_per_token(sh, case.recompute) * tokens
    peak = dev.peak(case.precision)
    mean_w = sum(p.mean_w for p in powers) / len(powers) if throttled else pw.mean_w
    energy = mean_w * world * t
    metrics: dict[str, Any] = dict.fromkeys(METRIC_NAMES)
    why: dict[str, str] = {}
    metrics.update(
        step_time_mean_s=t, tokens_per_s=tokens / t, samples_per_s=case.global_batch / t,
        tokens_per_s_per_device=tokens / t / world, tflops_per_device=mflops / t / world / 1e12,
        model_flops_per_step=mflops, mfu=mflops / t / (world * peak), hfu=hflops / t / (world * peak),
        mem_per_device_bytes=mem_total,
    )
    if not dev.has_power_sensor:
        reason = f"{dev.name}: no power or temperature sensor to model it from (catalog values are nominal)"
        for k in ("power_mean_w", "power_peak_w", "power_swing_w", "energy_per_step_j", "energy_j", "j_per_token",
                  "tokens_per_j", "samples_per_s_per_mj_study", "temp_mean_c", "temp_peak_c",
                  "hottest_slot", "throttle_share"):
            why[k] = reason
    else:
        hottest = max(slots, key=lambda s: s.peak_c)
        metrics.update(
            power_mean_w=mean_w, power_peak_w=max(p.peak_w for p in powers),
            power_swing_w=max(p.peak_w for p in powers) - min(p.low_w for p in powers),
            energy_per_step_j=energy, energy_j=energy * case.window_steps(t),
            j_per_token=energy / tokens, tokens_per_j=tokens / energy,
            # the study's metric, over the measured window as the analysis computes it for runs
            samples_per_s_per_mj_study=(case.global_batch / t) / (energy * case.window_steps(t) / 1e6),
            temp_mean_c=sum(s.steady_c * len(s.slots) for s in slots) / dpn, temp_peak_c=hottest.peak_c,
            hottest_slot=f"gpu{hottest.slot}",
            throttle_share=sum(len(s.slots) for s in slots if s.throttled) / dpn,
        )
    raw = (case, st, mem_bd, fits, clock, thermal_clock,
           node_power_w(energy / t, case.nodes, c) * t if dev.has_power_sensor else None,
           slots if dev.has_power_sensor else None)
    if not fits:
        why["fits"] = (f"predicted {mem_total / 2**30:.1f} GiB per device > {dev.memory_bytes / 2**30:.1f} GiB: "
                       "the run would not fit; use recompute, more TP/PP, FSDP or a distributed optimizer")
    return Prediction(metrics=metrics, why_null=why, fits=fits, calibration=cal.name, model_error=cal.error,
                      raw=raw)


def _thermal_stragglers(case: Case, c: Coefficients, sh: Shape, clock: float, st: StepTime, pw: DevicePower,
                        slots: list[SlotThermal]) -> tuple[StepTime, list[DevicePower], list[SlotThermal], float]:
    """Slots that would pass their slowdown temperature throttle, and the synchronous job runs at their pace.

    Returns the slower step time, each device's power (throttled slots at the lower clock), the slots
    (throttled ones held at the slowdown temperature) and the thermal clock factor.
    """
    dev = case.device
    dpn = min(case.devices_per_node, case.world)
    throttled = [s for s in slots if s.throttled]
    thermal_clock = 1.0
    # the hottest slot caps its mean power; the whole synchronous job runs at its pace
    allowed = min(s.allowed_power_w or pw.mean_w for s in throttled)
    comp_dyn = (pw.compute_w - dev.idle_w) * st.compute_s / st.total_s
    if comp_dyn > 0:
        share = max(0.05, 1 - (pw.mean_w - allowed) / comp_dyn)
        thermal_clock = max(0.3, share ** (1.0 / clock_exponent(c)))
    st_slow = step_time(case, c, clock * thermal_clock, sh)
    hot = step_power(dev, c, st_slow, clock * thermal_clock)
    cool = step_power(dev, c, st, clock, step_s=st_slow.total_s)
    powers = [hot if s.throttled else cool for s in slots for _ in s.slots]
    slots = slot_temperatures(dev, dpn, cool.mean_w, cool.peak_w, st_slow.burst_s)
    slots = [replace(s, throttled=True, steady_c=dev.slowdown_c or s.steady_c,
                     peak_c=dev.slowdown_c or s.peak_c) if s.throttled else s for s in slots]
    return st_slow, powers, slots, thermal_clock
