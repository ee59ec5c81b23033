"""One prediction: memory, step time, throughput, power, energy, temperature — and its summary.

:func:`predict` composes the parts (memory → power-limited clocks → step time → per-device power →
slot temperatures → thermal stragglers) and returns a :class:`Prediction` whose ``metrics`` use the
metric names of a measured run's ``summary.json``, so reports and ``compare`` read both alike.
"""

from __future__ import annotations

from typing import Any

from powertrain.core.flops import model_flops_per_step, recompute_flops_per_token, shape_of
from powertrain.predict.calibration import Calibration, load_calibration
from powertrain.predict.case import Case, case_from_run_config
from powertrain.predict.links import LinkTraffic, link_traffic
from powertrain.predict.memory import memory_per_device
from powertrain.predict.node_power import NodePower, nodes_power
from powertrain.predict.physics import Physics, device_physics
from powertrain.predict.steptime import at_clocks, local_parameters, step_time

METRIC_NAMES = (
    "step_time_mean_s", "tokens_per_s", "samples_per_s", "tokens_per_s_per_device", "tflops_per_device",
    "model_flops_per_step", "mfu", "hfu", "power_mean_w", "power_peak_w", "power_swing_w",
    "energy_per_step_j", "energy_j", "j_per_token", "tokens_per_j", "samples_per_s_per_mj_study", "temp_mean_c",
    "temp_peak_c", "hottest_slot", "throttle_share", "throttle_share_power_cap", "throttle_share_thermal_sw",
    "clock_sm_mean_mhz", "clock_sm_drop_pct", "link_bytes_per_step", "pcie_bytes_per_step", "link_bw_share",
    "mem_per_device_bytes",
)
# metrics the power, clock and heat model gives (null, with the reason, for a device it has no model of)
POWER_METRICS = ("power_mean_w", "power_peak_w", "power_swing_w", "energy_per_step_j", "energy_j", "j_per_token",
                 "tokens_per_j", "samples_per_s_per_mj_study", "temp_mean_c", "temp_peak_c", "hottest_slot",
                 "throttle_share", "throttle_share_power_cap", "throttle_share_thermal_sw", "clock_sm_mean_mhz",
                 "clock_sm_drop_pct")


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
    def physics(self) -> Physics | None:
        """The power model's state (stage timelines, clocks, slots, sensors), where the device has one."""
        return self._raw[4] if self._raw else None

    @property
    def device(self) -> Any:
        return self._raw[0].device if self._raw else None

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


def _breakdown(case: Case, st: Any, mem_bd: dict[str, float], fits: bool, phys: Physics | None,
               node: NodePower | None, links: LinkTraffic | None) -> dict[str, Any]:
    top = case.device.max_sm_clock_mhz
    power = None if phys is None else {
        "limit_w": min(case.device.tdp_w, case.power_limit_w) if case.power_limit_w else case.device.tdp_w,
        "stages": {k: {"clock": sp.clock, "clock_mhz": sp.clock * top if top else None,
                       "clock_cap": sp.cap_clock, "power_limited": sp.power_limited,
                       "throttle_share_power_cap": sp.throttle_power, "mean_w": sp.timeline.mean_w,
                       "limiter_window_w": sp.limiter_window.power_w, "limiter_window_at": sp.limiter_window.level,
                       "compute_draw_w": sp.timeline.compute_w, "wait_draw_w": sp.timeline.wait_w,
                       "ranks_per_pipeline": sp.stage.ranks}
                   for k, sp in phys.stages.items()},
        "slowest_stage": phys.composed.slowest,
        "thermal_caps": phys.thermal_caps,
        # the peak each field would show a sampler over the measured window (predict/sensors.py), labelled
        "peaks": {role: pk.to_dict() for role, pk in phys.peaks.items()},
        "measured_window_s": phys.measured_window_s, "run_s": phys.run_s,
    }
    return {
        "step_time": st.breakdown,
        "memory": mem_bd,
        "fits_in_memory": fits,
        # the lowest clock ratio the power limit (or a lock) leaves any stage, and heat
        "clock_factor_power_limit": None if phys is None else min(sp.clock for sp in phys.stages.values()),
        "clock_factor_thermal": None if phys is None else min(phys.thermal_caps.values(), default=1.0),
        "power": power,
        # bytes per device per step over NVLink and the NICs, and their bandwidth shares (predict/links.py)
        "links": None if links is None else links.to_dict(),
        # wall energy of the job's nodes per step (power.node_power_w's formula), and one node's terms
        "node_energy_per_step_j": None if node is None or node.ac_w is None else node.ac_w * case.nodes * st.total_s,
        "node_power": None if node is None else node.to_dict(),
        "slots": None if phys is None else [
            {"slot": f"gpu{s.slot}", "nodes": s.nodes, "first_node": s.first_node, "stage": s.stage,
             "power_w": s.power_w, "clock": s.clock, "clock_mhz": s.clock * top if top else None,
             "inlet_c": s.heat.inlet_c, "steady_c": s.heat.steady_c, "end_c": s.heat.end_c,
             "peak_c": max(s.heat.steady_c if phys.run_s <= 0 else s.heat.end_c, s.heat.idle_c),
             "throttled": s.thermal_throttled, "throttle_share_power_cap": s.throttle_power,
             "time_to_steady_s": s.heat.time_to_steady_s} for s in phys.slots],
        "layout": {"tp": case.tp, "pp": case.pp, "dp": case.dp, "cp": case.cp, "ep": case.ep, "etp": case.etp,
                   "vp": case.vp,
                   "micro_batches": case.micro_batches},
        "device": case.device.name,
        "device_source": case.device.source,
        "engine": case.engine,
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


def _power_metrics(case: Case, phys: Physics, t: float, metrics: dict[str, Any], why: dict[str, str]) -> NodePower:
    """Fill the power, energy, heat, clock and throttle metrics from the device physics; the job's node power."""
    dev, world = case.device, case.world
    tokens = case.global_batch * case.seq_len
    mean_w = phys.mean_w
    energy = mean_w * world * t
    hottest = phys.hottest
    top = dev.max_sm_clock_mhz
    metrics.update(
        power_mean_w=mean_w, power_peak_w=phys.peaks["instant"].power_w, power_swing_w=phys.swing_w,
        energy_per_step_j=energy, energy_j=energy * case.window_steps(t),
        j_per_token=energy / tokens, tokens_per_j=tokens / energy,
        # the study's metric, over the measured window as the analysis computes it for runs
        samples_per_s_per_mj_study=(case.global_batch / t) / (energy * case.window_steps(t) / 1e6),
        temp_mean_c=sum([s.heat.end_c * s.nodes for s in phys.slots]) / sum([s.nodes for s in phys.slots]),
        temp_peak_c=hottest.heat.end_c, hottest_slot=f"gpu{hottest.slot}",
        throttle_share=phys.throttle_any, throttle_share_power_cap=phys.throttle_power,
        throttle_share_thermal_sw=phys.throttle_thermal,
        clock_sm_mean_mhz=phys.clock_mean * top if top else None,
        clock_sm_drop_pct=(1 - phys.clock_mean) * 100,
    )
    if not top:
        why["clock_sm_mean_mhz"] = (f"{dev.name}: the catalog holds no maximum SM clock (max_sm_clock_mhz); the "
                                    "clock ratio is in clock_sm_drop_pct")
    return nodes_power(energy / t, case.nodes, dev, ranks_per_node=min(case.devices_per_node, world))


def predict(cfg: Any, calibration: Calibration | str | None = None) -> Prediction:
    """Predict one configuration (a RunConfig or a Case) with a calibration (by name, path or value).

    A CPU RunConfig uses the calibration's host probe for its thread count, else a fresh probe of this
    host; ``breakdown["host_probe"]["source"]`` says which. The step is costed at the maximum clock, then the
    power governor, clock lock and heat set each pipeline stage's clock (predict/physics.py) and the step is
    put together at those clocks.
    """
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    case = _as_case(cfg, cal)
    c = cal.coefficients_for(case.engine)
    dev = case.device
    world = case.world
    sh = shape_of(case)
    mem_total, mem_bd = memory_per_device(case, c, sh)
    fits = mem_total <= dev.memory_bytes

    lock = sm_clock_ratio(case)
    full = step_time(case, c, 1.0, sh)
    phys: Physics | None = None
    if dev.has_power_sensor:
        assert full.work is not None
        window = case.window_steps(full.total_s)
        phys = device_physics(case, c, full.work, lock, case.warmup_steps + window, window)
        st = at_clocks(full, phys.step_clocks)
    else:
        st = full if lock == 1.0 else at_clocks(full, lock)

    t = st.total_s
    tokens = case.global_batch * case.seq_len
    mflops = model_flops_per_step(sh, case.global_batch)
    hflops = mflops + recompute_flops_per_token(sh, case.recompute) * tokens
    peak = dev.peak(case.precision)
    metrics: dict[str, Any] = dict.fromkeys(METRIC_NAMES)
    why: dict[str, str] = {}
    metrics.update(
        step_time_mean_s=t, tokens_per_s=tokens / t, samples_per_s=case.global_batch / t,
        tokens_per_s_per_device=tokens / t / world, tflops_per_device=mflops / t / world / 1e12,
        model_flops_per_step=mflops, mfu=mflops / t / (world * peak), hfu=hflops / t / (world * peak),
        mem_per_device_bytes=mem_total,
    )
    links: LinkTraffic | None = None
    if dev.is_host_cpu:
        for k in ("link_bytes_per_step", "pcie_bytes_per_step", "link_bw_share"):
            why[k] = "ranks on one host CPU talk through shared memory: no NVLink or NIC traffic to predict"
    else:
        lp = local_parameters(case, sh)
        links = link_traffic(case, t, lp.dense, lp.expert)
        metrics.update(link_bytes_per_step=links.nvlink_bytes * world, pcie_bytes_per_step=links.nic_bytes * world,
                       link_bw_share=links.nvlink_share)
        if links.nvlink_share is None:
            why["link_bw_share"] = "one device per node: no NVLink peer"
    node = None
    if phys is None:
        reason = f"{dev.name}: no power or temperature sensor to model it from (catalog values are nominal)"
        for k in POWER_METRICS:
            why[k] = reason
    else:
        node = _power_metrics(case, phys, t, metrics, why)
    if not fits:
        why["fits"] = (f"predicted {mem_total / 2**30:.1f} GiB per device > {dev.memory_bytes / 2**30:.1f} GiB: "
                       "the run would not fit; use recompute, more TP/PP, FSDP or a distributed optimizer")
    return Prediction(metrics=metrics, why_null=why, fits=fits, calibration=cal.name, model_error=cal.error,
                      raw=(case, st, mem_bd, fits, phys, node, links))
